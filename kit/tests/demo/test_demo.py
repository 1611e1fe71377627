"""The README's run command: ``slime-demo`` end to end (kubemu, both webhooks, the chart's chain)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable

from demo.environment import DemoEnvironment
from demo.main import main


def test_demo_runs_the_whole_story_and_never_shows_the_key(audited: Callable[[DemoEnvironment], None]) -> None:
    lines: list[str] = []
    keys: list[bytes] = []
    stored: list[dict] = []

    def inspect(env: DemoEnvironment) -> None:
        assert env.emulator is not None and env.seeded is not None
        secret = env.emulator.get("v1", "Secret", "slurm", env.seeded.key_secret)
        keys.append(base64.b64decode(secret["data"]["slurm.key"]))
        stored.append(env.emulator.get("v1", "Secret", "metal3", "bm-cluster-workers-0-metadata"))

    assert main([], out=lines.append, inspect=inspect, on_start=audited) == 0
    text = "\n".join(lines)

    # (1) the injected keys, with the key redacted
    for key in (
        "slurm_controller_host:",
        "slurm_controller_port:",
        "slurm_conf_server:",
        "slurm_key_base64:",
        "slurm_controller_name:",
    ):
        assert key in text
    assert "192.0.2.10:30817" in text
    assert re.search(r"slurm_key_base64:\s+<redacted: \d+ base64 characters, sha256 [0-9a-f]{12}\.\.\.>", text)
    assert "admission: injection.webhook.slime patched" in text
    assert "matchConditions (CEL) keep it away" in text

    # (2) the MachineDeployment follows the mirror 0 -> 3 -> 1
    follows = re.findall(r"MachineDeployment metal3/md-slurm-workers spec\.replicas = (\d+)", text)
    assert follows == ["3", "1"]
    assert "= 0, MachineDeployment metal3/md-slurm-workers = 0" in text
    assert "scaling.webhook.slime allowed" in text

    # (3) both heals
    assert re.search(r"healed: MachineDeployment metal3/md-slurm-workers = 1 after", text)
    assert "stays at 1 while the mirror says 2" in text
    assert "the mirror is adopted at the MachineDeployment's 1 (a new mapping never moves a pool)" in text
    assert re.search(r"followed: MachineDeployment metal3/md-slurm-workers = 2 after", text)
    assert "Demo complete" in text

    # the key, read from the emulator, is in the stored Secret but never in the output
    (key,) = keys
    assert len(key) == 1024
    assert key.decode() not in text
    assert base64.b64encode(key).decode() not in text
    assert base64.b64encode(key).decode() in base64.b64decode(stored[0]["data"]["metaData"]).decode()


def test_demo_reports_a_failed_expectation_with_exit_1(monkeypatch, capsys, audited) -> None:  # type: ignore[no-untyped-def]
    """A broken seed (no hostIP) makes the injection webhook deny; the demo says so and exits 1."""
    from demo import cluster

    monkeypatch.setattr(cluster, "HOST_IP", "")
    original = cluster.seed_slinky

    def seed_without_host_ip(emu):
        key, name = original(emu)
        emu.patch(
            "v1", "pods", cluster.SLURM_NAMESPACE, f"{cluster.CONTROLLER}-controller-0", {"status": {"hostIP": None}}
        )
        return key, name

    monkeypatch.setattr(cluster, "seed_slinky", seed_without_host_ip)
    assert main([], out=lambda line: None, on_start=audited) == 1
    err = capsys.readouterr().err
    assert "slime-demo: FAILED: the metaData Secret was rejected: " in err
    assert 'admission webhook "injection.webhook.slime" denied the request: ' in err
    assert "hostIP" in err
