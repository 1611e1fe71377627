"""Real Slurm 26.05 configured as Slinky v1.3 configures it: the controller named by cluster DNS,
partitions built from NodeSets by feature, a bare-metal node that joins only through what the webhook injects.

slurm.conf here says ``SlurmctldHost=slurm-controller-0.slurm-controller-internal.slurm`` and
``SlurmctldAddr=slurm-controller.slurm`` (no address), names a host outside the cluster cannot
resolve (the node's root resolves names from /etc/hosts only); and ``NodeSet=nodeset-a
Feature=nodeset-a`` with a partition ``nodeset-a`` over it. The metaData Secret is admitted by the
injection webhook and the host boots the documented user-data.
"""

from __future__ import annotations

import base64
import time

import pytest
import yaml

from testbed.components.cloudinit import NodeDidNotJoin
from testbed.framework.objects import b64
from testbed.scenarios.slurm_site import SlurmSite, join

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(600)]


def test_the_slurm_conf_names_slurmctld_by_cluster_dns(site: SlurmSite) -> None:
    conf = (site.slurm.etc / "slurm.conf").read_text()
    assert site.slurm.config.dns_names and site.root.series == "26.05"
    assert "SlurmctldHost=slurm-controller-0.slurm-controller-internal.slurm\n" in conf
    assert "SlurmctldAddr=slurm-controller.slurm\n" in conf and "NodeSet=nodeset-a Feature=nodeset-a\n" in conf


def test_a_node_joins_through_the_injected_host_entries(site: SlurmSite, figures: dict[str, object]) -> None:
    secret = site.create_metadata_secret(1, "bm-001")
    hosts = base64.b64decode(site.meta_data(secret)["slurm_hosts_base64"]).decode()
    assert hosts == (
        f"{site.network.host_address} slurm-controller-0.slurm-controller-internal.slurm slurm-controller-0 "
        "slurm-controller.slurm\n"
    )
    started = time.monotonic()
    node = site.boot(secret)
    node.wait_joined(site.slurm, timeout=20)
    figures["slinky13_join_seconds"] = round(time.monotonic() - started, 2)  # boot to registered (docs/testing.md)
    assert (node.dir / "hosts").read_text().endswith(hosts)  # the user-data wrote them before slurmd started


def test_without_the_host_entries_the_node_never_registers(site: SlurmSite) -> None:
    """The negative that gives the positive its meaning: the same node, the names not given, never joins."""
    secret = site.create_metadata_secret(2, "bm-002")
    meta = site.meta_data(secret) | {"slurm_hosts_base64": ""}
    secret["data"]["metaData"] = b64(yaml.safe_dump(meta))
    node = site.boot(secret)
    with pytest.raises(NodeDidNotJoin):
        node.wait_joined(site.slurm, timeout=8)
    assert "bm-002" not in site.slurm.nodes()
    log = (node.dir / "log" / "slurmd.log").read_text(errors="replace")
    # It fetched the configuration (--conf-server is an address), then could not resolve the
    # SlurmctldHost name that configuration gives: a cluster DNS name.
    assert "getaddrinfo() failed" in log
    assert f"SlurmctldHost={site.slurm.config.host_name}\n" in (site.slurm.etc / "slurm.conf").read_text()


def test_a_node_of_the_nodesets_pool_lands_in_its_partition(site: SlurmSite) -> None:
    (plain,) = join(site, 1, first=3)
    secret = site.create_metadata_secret(
        4, "bm-004", template="nodeset-a-workers", template_annotations={"slurm-node-features": "nodeset-a"}
    )
    assert site.meta_data(secret)["slurm_node_conf"] == "Feature=nodeset-a"
    site.boot(secret).wait_joined(site.slurm, timeout=20)
    records = site.slurm.nodes()
    assert "nodeset-a" in records["bm-004"]["features"] and "nodeset-a" not in records[plain.hostname]["features"]
    partition = site.slurm.client(["sinfo", "-h", "-p", "nodeset-a", "-o", "%N"]).stdout.split()
    assert site.slurm.hostnames(",".join(partition)) == ["bm-004"]
    job = site.slurm.sbatch("-p", "nodeset-a", "--wrap", "hostname > /srv/slime/nodeset-$SLURM_JOB_ID.out")
    deadline = time.monotonic() + 30
    while site.slurm.jobs()[job]["job_state"] != ["COMPLETED"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (site.slurm.shared / f"nodeset-{job}.out").read_text().split() == ["bm-004"]
