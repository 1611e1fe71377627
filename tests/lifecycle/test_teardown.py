"""slime-teardown (the chart's pre-delete hook): nothing of SliMe's is left holding a Machine or pointing at nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from lifecycle.teardown import run

from testbed.components.capi_sim import MD_NS, Env
from testbed.framework.objects import SLIME_NAMESPACE

ADMISSION = "admissionregistration.k8s.io/v1"


def webhook_configurations(e: Env) -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        name = "slime-injection-webhook" if kind.startswith("Mutating") else "slime-scaling-webhook"
        e.emulator.create({"apiVersion": ADMISSION, "kind": kind, "metadata": {"name": name}})


def teardown(e: Env, tmp_path: Path, wait: float = 0.0) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = run(
        [
            "--kubeconfig",
            e.emulator.write_kubeconfig(tmp_path / "kubeconfig"),
            "--namespace",
            SLIME_NAMESPACE,
            "--config-map",
            "scaling-webhook-configmap",
            "--lease-name",
            "slime-scaling-webhook",
            "--mutating-webhook-configuration",
            "slime-injection-webhook",
            "--validating-webhook-configuration",
            "slime-scaling-webhook",
            "--wait-seconds",
            str(wait),
        ],
        out=lines.append,
    )
    return code, lines


def test_uninstall_takes_everything_off_and_a_busy_node_is_reported_with_how_to_finish(
    env: Callable[..., Env], tmp_path: Path
) -> None:
    e = env(4)
    scaling = e.scaling()
    e.scale(scaling, 2)  # md-001, md-002 drained, marked, deleted: held
    e.capi.step()
    e.slurm.start_job("node-002", end=time.time() + 3600)
    scaling.running.stop()  # helm uninstall: the pods go; the hook runs with the cluster as they left it
    webhook_configurations(e)
    code, lines = teardown(e, tmp_path)
    assert code == 0, lines
    assert e.emulator.list(ADMISSION, "MutatingWebhookConfiguration") == []
    assert e.emulator.list(ADMISSION, "ValidatingWebhookConfiguration") == []
    assert e.emulator.get("coordination.k8s.io/v1", "Lease", SLIME_NAMESPACE, "slime-scaling-webhook") is None
    assert not e.hooked("md-001") and e.hooked("md-002")  # idle: released; busy: held, never let go blindly
    assert not e.hooked("md-003") and not e.hooked("md-004")
    assert (
        f"     to finish md-002 once its node is idle in Slurm (scontrol show node): kubectl -n {MD_NS} "
        in "\n".join(lines)
    )
    assert lines[-1] == "done, with 1 Machine(s) still held until their Slurm nodes are idle (see above)"
    # Deleting a Machine of the pool now completes; the busy one goes once its job is done and the hook is off.
    e.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-004")
    assert "md-004" in e.capi.step() and e.capi.violations == []


def test_a_wait_lets_a_node_that_becomes_idle_go_and_a_second_run_finds_nothing_left(
    env: Callable[..., Env], tmp_path: Path
) -> None:
    e = env(2)
    scaling = e.scaling()
    e.scale(scaling, 1)
    e.capi.step()
    scaling.running.stop()
    e.slurm.start_job("node-001", end=time.time() + 3600)  # busy when the hook starts...
    ending = threading.Timer(1.0, e.slurm.finish_jobs, args=["node-001"])  # ...idle a second later
    ending.start()
    code, lines = teardown(e, tmp_path, wait=30.0)
    ending.join()
    assert code == 0 and lines[-1] == "done: nothing of SliMe's holds a Machine, and its webhooks and Lease are gone"
    assert not any(e.hooked(f"md-{i:03d}") for i in (1, 2))
    again, lines = teardown(e, tmp_path)
    assert again == 0 and lines[0] == "ok   mutatingwebhookconfiguration slime-injection-webhook: already gone", lines
