"""Injected join data boots real slurmd processes into a real slurmctld.

The scenario (:func:`join`): for each host, CAPM3's metaData Secret is created through the API,
the injection webhook adds the join data at admission, the host boots from the Secret as stored
with the user-data docs/install.md shows (rendered with Jinja as cloud-init does), and its
``slurmd -Z --conf-server <slurm_conf_server>`` must join slurmctld. Breaking the injection (a
wrong key, host or port in what the webhook adds) makes that same scenario fail.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import injection_webhook.decision
from testbed.components.cloudinit import MISSING, USER_DATA, NodeDidNotJoin, boot_script, render_user_data
from testbed.components.debian_root import SlurmRoot
from testbed.framework.objects import b64
from testbed.framework.paths import REPO_ROOT
from testbed.framework.wait import wait_for
from testbed.framework.world import make_slurm_key
from testbed.scenarios.slurm_site import JOIN_SECONDS, SlurmSite, join

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(600)]
SLURM_RELEASES = ("26.05", "24.11")  # Slinky v1.3's default, and the 24.11 of Slinky 1.0-1.2 (conftest.py)

FILES_USER_DATA = USER_DATA.with_name("slurm-worker-files.yaml")


# --- the documented user-data is the one that runs ---------------------------------------------


def test_install_md_shows_the_user_data_files_verbatim() -> None:
    install = (REPO_ROOT / "docs" / "install.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", install, re.S)
    for path in (USER_DATA, FILES_USER_DATA):
        assert path.read_text() in blocks, f"docs/install.md does not show {path.relative_to(REPO_ROOT)} verbatim"
    # The CABPV form (files and commands) is the write_files user-data with the keys renamed.
    cabpv = next(b for b in blocks if b.startswith("files:\n  - path: /var/lib/cloud/scripts/per-boot/"))
    cloud_config = FILES_USER_DATA.read_text().removeprefix("## template: jinja\n#cloud-config\n")
    assert cabpv == cloud_config.replace("write_files:", "files:").replace("runcmd:", "commands:")


@pytest.mark.parametrize(
    ("node_conf", "slurmd"),
    [
        ("", "slurmd -Z --conf-server 192.0.2.1:30817"),
        ("Feature=nodeset-a", 'slurmd -Z --conf-server 192.0.2.1:30817 --conf "Feature=nodeset-a"'),
    ],
)
def test_user_data_renders_as_cloud_init_renders_it(node_conf: str, slurmd: str) -> None:
    key = base64.b64encode(b"k" * 16).decode()
    hosts = base64.b64encode(b"192.0.2.1 ctl-0.ctl-internal.slurm ctl.slurm\n").decode()
    meta = {
        "local-hostname": "bm-1",
        "slurm_conf_server": "192.0.2.1:30817",
        "slurm_key_base64": key,
        "slurm_hosts_base64": hosts,
        "slurm_node_conf": node_conf,
    }
    rendered = render_user_data(USER_DATA.read_text(), meta)
    assert rendered.startswith("#cloud-config\n") and "## template" not in rendered
    assert f"  - {slurmd}" in rendered.splitlines() and f"echo '{key}'" in rendered
    script = boot_script(rendered).splitlines()
    assert script[0] == "#!/bin/sh" and script[-2:] == [f"echo '{hosts}' | base64 -d >> /etc/hosts", slurmd]
    # write_files: decoded, then permissions and owner, before runcmd
    files = boot_script(render_user_data(FILES_USER_DATA.read_text(), meta)).splitlines()
    assert files[-4:] == [
        "chmod 0600 /etc/slurm/slurm.key",
        "chown slurm:slurm /etc/slurm/slurm.key",
        f"echo '{hosts}' | base64 -d >> /etc/hosts",
        slurmd,
    ]
    # What cloud-init does with a key that is not there: a placeholder, not an error.
    missing = render_user_data(USER_DATA.read_text(), {"local-hostname": "bm-1"})
    assert f"--conf-server {MISSING}slurm_conf_server" in missing
    assert render_user_data("## template: jinja\n{{ ds.meta_data.local_hostname }}", meta) == "bm-1"
    with pytest.raises(ValueError, match="template: jinja"):
        render_user_data("#cloud-config\n", meta)


def test_the_root_sends_no_dns_query(slurm_root: SlurmRoot) -> None:
    """Name resolution in the Slurm root is files only: no daemon there may dial a DNS server (none is ours)."""
    hosts = [
        line.split()[1:]
        for line in (slurm_root.path / "etc/nsswitch.conf").read_text().splitlines()
        if line.startswith("hosts:")
    ]
    assert hosts == [["files"]]
    servers = [
        line.split()[1]
        for line in (slurm_root.path / "etc/resolv.conf").read_text().splitlines()
        if line.startswith("nameserver")
    ]
    assert servers == ["127.0.0.1"]


# --- joining -----------------------------------------------------------------------------------


@pytest.mark.parametrize("user_data", [USER_DATA, FILES_USER_DATA], ids=["runcmd", "write_files"])
def test_nodes_boot_from_injected_metadata_join_and_run_a_two_node_job(site: SlurmSite, user_data: Path) -> None:
    site.user_data = user_data
    started = time.monotonic()
    nodes = join(site, 2)
    joined = time.monotonic() - started
    meta = site.meta_data(site.create_metadata_secret(9, "bm-009"))  # what each host read
    assert (
        meta["slurm_conf_server"] == site.slurm.conf_server == f"{site.network.host_address}:{site.slurm.config.port}"
    )
    same = base64.b64decode(meta["slurm_key_base64"]) == site.cluster.key == site.slurm.slurm_key
    assert same, "the injected slurm.key is not the one slurmctld has"  # a bare bool: a failure shows no key
    records = site.slurm.nodes()
    for node in nodes:
        record = records[node.hostname]  # the node name is the host name cloud-init set from local-hostname
        assert (record["address"], record["hostname"]) == (node.net.address, node.hostname)
        assert set(record["state"]) == {"IDLE", "DYNAMIC_NORM"}
    names = [n.hostname for n in nodes]
    out = site.slurm.client(["srun", "-N2", "-w", ",".join(names), "hostname"], timeout=60).stdout
    assert sorted(out.split()) == names
    job = site.slurm.sbatch("-N2", "--wrap", "srun hostname > /srv/slime/two-node-$SLURM_JOB_ID.out")
    wait_for(lambda: site.slurm.jobs()[job]["job_state"] == ["COMPLETED"], 30, f"two-node batch job {job} to complete")
    assert sorted((site.slurm.shared / f"two-node-{job}.out").read_text().split()) == names
    assert sorted(site.slurm.hostnames(site.slurm.jobs()[job]["nodes"])) == names
    assert joined < JOIN_SECONDS


def test_a_node_given_a_wrong_key_is_refused_by_slurmctld(site: SlurmSite) -> None:
    (good,) = join(site, 1)
    secret = site.create_metadata_secret(2, "bm-002")
    wrong = site.meta_data(secret) | {"slurm_key_base64": b64(make_slurm_key())}  # not the key slurmctld has
    secret["data"]["metaData"] = b64(yaml.safe_dump(wrong))
    since = len(site.slurm.logs()["slurmctld.log"])
    node = site.boot(secret)
    with pytest.raises(NodeDidNotJoin) as refused:
        node.wait_joined(site.slurm, timeout=6)
    assert "bm-002" not in site.slurm.nodes() and good.hostname in site.slurm.nodes()
    log = site.slurm.logs()["slurmctld.log"][since:]
    assert "REQUEST_CONFIG has authentication error" in log, log[-2000:]
    assert "authentication error" in str(refused.value)


def _wrong_key(entries: dict[str, str]) -> None:
    entries["slurm_key_base64"] = b64(make_slurm_key())  # a key slurmctld does not have


def _wrong_host(entries: dict[str, str]) -> None:
    # An address on the test's own bridge that no host has: the dial stays on this machine.
    host = entries["slurm_controller_host"].rsplit(".", 1)[0] + ".250"
    entries["slurm_controller_host"] = host
    entries["slurm_conf_server"] = f"{host}:{entries['slurm_controller_port']}"


def _wrong_port(entries: dict[str, str]) -> None:
    port = str(int(entries["slurm_controller_port"]) + 1)
    entries["slurm_controller_port"] = port
    entries["slurm_conf_server"] = f"{entries['slurm_controller_host']}:{port}"


@pytest.mark.parametrize(
    "broken", [_wrong_key, _wrong_host, _wrong_port], ids=["wrong-key", "wrong-host", "wrong-port"]
)
def test_a_broken_injection_makes_the_join_scenario_fail(
    site: SlurmSite, monkeypatch: pytest.MonkeyPatch, broken: Callable[[dict[str, str]], None]
) -> None:
    """The join scenario is only as good as what it can catch: break what the webhook injects, and it fails."""
    original = injection_webhook.decision.join_entries

    def join_entries(*args: Any, **kwargs: Any) -> dict[str, str]:
        entries = dict(original(*args, **kwargs))
        broken(entries)
        return entries

    monkeypatch.setattr(injection_webhook.decision, "join_entries", join_entries)
    with pytest.raises(NodeDidNotJoin):
        join(site, 1, timeout=6)
