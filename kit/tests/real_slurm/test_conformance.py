"""The fake slurmrestd answers as real slurmrestd does, for each Slurm release the tier runs (26.05 and 24.11).

testbed/components/fake_slurmrestd.py stands in for slurmrestd in the fast suites. Here one sequence
of requests (what SliMe's client sends, and the errors it must understand) goes to the fake and
to a real slurmrestd with two real dynamic nodes; each answer is reduced to what a client can
rely on (status, content type, error entries, the node fields SliMe reads, the job and partition
fields node demand reads) and the two lists must be equal. Where they differed, the fake was fixed.
Then SliMe's own client (``scaling_webhook/slurm/slurmrestd.py``) runs the same operations against both:
each release's newest data parser is proven against real Slurm here (24.11: ``v0.0.42``, of the
v0.0.40 to v0.0.42 it serves; 26.05: ``v0.0.45``, of v0.0.42 to v0.0.45).

The release SliMe makes (``{"state": ["FUTURE"]}`` on a drained, idle node whose slurmd still
runs) is part of the conversation: the record must stay (not listed, still counted in the
partition), a busy node or one already FUTURE be refused, and the host's next ``slurmd -Z``
(the host powered off and booted again) take the record back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scaling_webhook.safe_scale_in.config import SafeScaleInConfig
from scaling_webhook.slurm.slurmrestd import SlurmClient, SlurmUnavailable
from testbed.components.cloudinit import Node, boot, meta_data_for
from testbed.components.debian_root import SlurmRoot
from testbed.components.fake_slurmrestd import PARTITION, FakeSlurmrestd, JwtKeySecret
from testbed.components.netns import Network
from testbed.components.slurm import Slurm, SlurmConfig
from testbed.components.slurmrestd_dialects import DIALECTS, HEALTH_PATHS
from testbed.framework.audit import scan_logs
from testbed.framework.pins import SlurmRelease
from testbed.framework.ports import free_port
from testbed.framework.wait import wait_for
from testbed.framework.world import make_jwt_key, make_slurm_key

from .conversation import BUSY, IDLE, Target, conversation, unserved

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(600)]
SLURM_RELEASES = ("26.05", "24.11")  # each release against the fake playing it (conftest.py)


@pytest.fixture
def real(slurm_root: SlurmRoot, network: Network, tmp_path: Path) -> Iterator[Target]:
    slurm = Slurm(
        slurm_root, tmp_path / "slurm", SlurmConfig.slinky(slurm_root, network.host_address, free_port(30000, 32767))
    )
    nodes: list[Node] = []
    try:
        slurm.start()
        nodes = [
            boot(slurm_root, network, meta_data_for(slurm, name), tmp_path / "nodes", shared=slurm.shared)
            for name in (IDLE, BUSY)
        ]
        for node in nodes:
            node.wait_joined(slurm)
        addresses = {n.hostname: n.net.address for n in nodes}

        def reboot(name: str) -> None:
            old = next(n for n in nodes if n.hostname == name)
            old.power_off(network)
            nodes.remove(old)
            nodes.append(boot(slurm_root, network, meta_data_for(slurm, name), tmp_path / "nodes", shared=slurm.shared))
            addresses[name] = nodes[-1].net.address
            nodes[-1].wait_joined(slurm)

        def make_busy(name: str) -> None:
            slurm.sbatch("--exclusive", "-w", name, "--wrap", "sleep 300")
            wait_for(lambda: "ALLOCATED" in slurm.node_states().get(name, set()), 20, f"{name} to run the job")

        queued: list[int] = []

        def queue(nodes: int) -> None:
            queued.append(slurm.sbatch(f"-N{nodes}", "--wrap", "sleep 300"))
            wait_for(
                lambda: slurm.jobs()[queued[-1]]["state_reason"] != "None", 20, "a scheduling pass over the queued job"
            )

        def unqueue() -> None:
            slurm.client(["scancel", str(queued.pop())])

        yield Target(
            f"real slurmrestd {slurm_root.release}",
            slurm.restd_url,
            slurm.jwt_key,
            make_busy,
            addresses,
            slurm.config.partition,
            queue,
            unqueue,
            reboot,
            slurm_root.api_version,
            unserved(slurm_root.api_version),
        )
    finally:
        for node in nodes:
            node.power_off(network)
        slurm.close()
        scan_logs("slurm", slurm.logs())


@pytest.fixture
def fake(slurm_release: SlurmRelease) -> Iterator[Target]:
    key = make_slurm_key()
    server = FakeSlurmrestd(key, release=slurm_release.series)
    addresses = {IDLE: "10.0.0.11", BUSY: "10.0.0.12"}
    for name, address in addresses.items():
        server.add_node(name, address)

    def make_busy(name: str) -> None:
        server.start_job(name, time.time() + 300)

    def queue(nodes: int) -> None:
        server.submit(nodes, reason="Resources")  # what real slurmctld says: a node it needs is busy

    def unqueue() -> None:
        server.pending.clear()

    def reboot(name: str) -> None:
        addresses[name] = addresses[name].rsplit(".", 1)[0] + ".21"  # (a host may come back at another address)
        server.add_node(name, addresses[name])

    version = slurm_release.api_version
    yield Target(
        "fake slurmrestd",
        server.url,
        key,
        make_busy,
        addresses,
        PARTITION,
        queue,
        unqueue,
        reboot,
        version,
        unserved(version),
    )
    server.stop()


def test_the_fake_answers_as_real_slurmrestd(real: Target, fake: Target, slurm_release: SlurmRelease) -> None:
    theirs, ours = conversation(real), conversation(fake)
    dialect = DIALECTS[slurm_release.series]
    differences = [
        f"{what}:\n  real: {r}\n  fake: {f}" for (what, r), (_, f) in zip(theirs, ours, strict=True) if r != f
    ]
    assert not differences, f"the fake differs from {real.name}:\n" + "\n".join(differences)
    facts = dict(theirs)
    # What the product relies on, as real Slurm answers it:
    assert facts["list nodes"]["nodes"][IDLE]["state"] == ["IDLE", "DYNAMIC_NORM"]
    newer = f"list nodes {real.unserved[0]} (not served)"
    assert facts[newer]["status"] == 404 and facts[newer]["type"] == "text/plain"
    assert (facts["no token"]["status"], facts["no token"]["type"]) == (401, "text/plain")
    # The health paths: 204 on 26.05 (with a token), 404 on 24.11 (never served, as any unknown URL); without a
    # token 401 on both (slurmrestd authenticates before it routes). SliMe never asks for them.
    assert all(facts[path]["status"] == (204 if dialect.health else 404) for path in HEALTH_PATHS)
    assert all(facts[f"{path}, no token"]["status"] == 401 for path in HEALTH_PATHS)
    assert facts["token signed with another key"]["status"] == 511
    assert [e["error_number"] for e in facts["token signed with another key"]["errors"]] == [1007]
    assert facts["ping with a bad token"]["status"] == 200
    assert [p["responding"] for p in facts["ping with a bad token"]["pings"]] == [False]
    assert facts["after drain"]["nodes"][IDLE] == {
        "state": ["IDLE", "DRAIN", "DYNAMIC_NORM"],
        "reason": "slime: scale-in",
        "reason_set_by_user": "slurm",
        "address_is_the_nodes": True,
        "hostname": IDLE,
    }
    assert facts["drain without Content-Type"]["status"] == dialect.untyped_post[0]
    assert facts["after undrain"]["nodes"][IDLE]["state"] == ["IDLE", "DYNAMIC_NORM"]
    kept = "slime: scale-in" if dialect.reason_outlives_drain else ""
    assert facts["after undrain"]["nodes"][IDLE]["reason"] == kept
    assert facts["busy and drained"]["nodes"][BUSY]["state"] == ["ALLOCATED", "DRAIN", "DYNAMIC_NORM"]
    # Node demand's view: a running job on the busy node, a pending 2-node job (Resources), the partition UNLIMITED.
    assert sorted(
        (j["state"], j["reason"], j["node_count"]["number"], j["nodes"]) for j in facts["list jobs"]["jobs"]
    ) == [(["PENDING"], "Resources", 2, ""), (["RUNNING"], "None", 1, BUSY)]
    # Asked with a quiet listing's last_update, slurmctld sends no jobs, no last_update and a warning.
    unchanged = facts["jobs unchanged since a listing"]
    assert facts["list jobs"]["last_update_set"] and not unchanged["last_update_set"], unchanged
    assert (unchanged["status"], unchanged["jobs"], unchanged["warnings"]) == (200, [], ["No job changes since "])
    assert facts["list partitions"]["partitions"] == [
        {"is_the_one": True, "max_nodes": {"set": False, "infinite": True, "number": 0}, "total": 2}
    ]
    for what, number in (
        ("delete busy node", 2016),
        ("delete busy drained node", 2016),
        ("delete unknown node", 2018),
        ("delete it again (gone)", 2018),
        ("drain unknown node", 2018),
    ):
        refused = (facts[what]["status"], [e["error_number"] for e in facts[what]["errors"]])
        assert refused == (dialect.error_status, [number]), what
    assert IDLE not in facts["after delete"]["nodes"]
    # The release to FUTURE: the record stays (not listed, still one of the partition's 2 nodes), DRAIN
    # cleared; a busy node and a node already FUTURE are refused (24.11: 2028, 26.05: 2180); the next
    # slurmd -Z takes it back.
    assert (facts["FUTURE drained idle node"]["status"], facts["FUTURE drained idle node"]["errors"]) == (200, [])
    assert IDLE not in facts["after FUTURE"]["nodes"] and BUSY in facts["after FUTURE"]["nodes"]
    assert facts["partitions after FUTURE"]["partitions"][0]["total"] == 2
    not_again = dialect.refused_state[0]
    for what, number in (("FUTURE busy node", not_again), ("FUTURE again", not_again), ("FUTURE unknown node", 2018)):
        refused = (facts[what]["status"], [e["error_number"] for e in facts[what]["errors"]])
        assert refused == (dialect.error_status, [number]), what
    assert facts["after its host boots again"]["nodes"][IDLE] == {
        "state": ["IDLE", "DYNAMIC_NORM"],
        "reason": kept,
        "reason_set_by_user": "slurm" if kept else "",
        "address_is_the_nodes": True,
        "hostname": IDLE,
    }


def product_client_run(target: Target) -> list[str]:
    """SliMe's slurmrestd client through the operations safe scale-in uses."""
    config = SafeScaleInConfig(slurmrestd=target.url, jwt_secret=("slurm", "jwt"))
    client = SlurmClient(JwtKeySecret(target.key), config, timeout=15)  # type: ignore[arg-type]
    seen = [f"version {client.version()}"]
    try:
        nodes = {n.name: n for n in client.nodes()}
        seen.append(f"nodes {sorted(nodes)}; {IDLE} {sorted(nodes[IDLE].states)} busy={nodes[IDLE].busy}")
        seen.append(f"{IDLE} address is the node's: {nodes[IDLE].address == target.addresses[IDLE]}")
        client.drain(IDLE, "slime: scale-in")
        node = {n.name: n for n in client.nodes()}[IDLE]
        seen.append(f"drained: {node.drained} reason {node.reason!r}")
        client.undrain(IDLE)
        client.drain(IDLE, "slime: scale-in")
        seen.append(f"returned to FUTURE: {client.future(IDLE)}; listed: {IDLE in {n.name for n in client.nodes()}}")
        try:
            client.future(IDLE)
        except SlurmUnavailable as exc:
            seen.append(f"FUTURE again refused: {'Invalid node state' in exc.cause}")
        seen.append(
            f"deleted its record: {client.delete(IDLE)}; again: {client.delete(IDLE)}"
        )  # already gone: done, not an error
        seen.append(f"FUTURE of a node with no record: {client.future('nosuch')}")
        seen.append(f"after delete: {sorted(n.name for n in client.nodes())}")
        target.make_busy(BUSY)
        busy = {n.name: n for n in client.nodes()}[BUSY]
        seen.append(f"{BUSY} busy={busy.busy} drained={busy.drained}")
        try:
            client.delete(BUSY)
        except SlurmUnavailable as exc:
            seen.append(f"delete busy refused: {'(Requested nodes are busy)' in exc.cause}")
        seen.append(_job_listings(client, target))
        wrong = SlurmClient(JwtKeySecret(make_jwt_key()), config, timeout=15)  # type: ignore[arg-type]
        try:
            wrong.nodes()
        except SlurmUnavailable as exc:
            seen.append(f"wrong key: {exc.cause.split(' refused')[1]}")
        finally:
            wrong.close()
    finally:
        client.close()
    return seen


def _job_listings(client: SlurmClient, target: Target) -> str:
    """Node demand's listings: all jobs, then "unchanged" when asked since a quiet listing, then all again after a
    change."""
    for _ in range(15):
        first = client.jobs()
        unchanged = client.jobs(since=first.last_update)
        if unchanged.jobs is None:
            break
        time.sleep(1.0)  # a change in the listing's second, or the scheduler's first touch of a job
    target.queue(1)  # its one node is busy: the job pends
    try:
        changed = client.jobs(since=first.last_update)
    finally:
        target.unqueue()
    listed = first.jobs is not None and len(first.jobs) > 0 and first.last_update is not None
    return (
        f"jobs listed with last_update: {listed}; unchanged since it: {unchanged.jobs is None}; "
        f"listed again after a new job: {changed.jobs is not None}"
    )


def test_slime_client_speaks_the_newest_version_to_real_slurmrestd_as_to_the_fake(real: Target, fake: Target) -> None:
    theirs = product_client_run(real)
    assert theirs == product_client_run(fake)
    assert theirs == [
        f"version {real.version}",  # newer ones probed first: 404
        f"nodes {sorted([IDLE, BUSY])}; {IDLE} ['DYNAMIC_NORM', 'IDLE'] busy=False",
        f"{IDLE} address is the node's: True",
        "drained: True reason 'slime: scale-in'",
        "returned to FUTURE: True; listed: False",
        "FUTURE again refused: True",
        "deleted its record: True; again: False",
        "FUTURE of a node with no record: False",
        f"after delete: ['{BUSY}']",
        f"{BUSY} busy=True drained=False",
        "delete busy refused: True",
        "jobs listed with last_update: True; unchanged since it: True; listed again after a new job: True",
        "wrong key:  the JWT (511) twice; check jwtSecret/jwtKey/tokenUser",
    ]


# GET nodes?update_time=<the last answer's last_update>: slurmrestd answers every node again, or (24.11, now
# and then: slurmctld's "no change in data", decided on whole seconds) none at all, or (24.11, once in a clean
# run) every node with the error "Unable to query partitions" (-1, _dump_nodes); never the nodes that
# changed. So there is no change-only read of nodes to be had, and an empty answer cannot be told from "no
# change" safely: a change made in the same second as the last_update held is not reported (seen while
# writing this test on 24.11: a drain made within that second, then reads with the same update_time that
# answered no node). A pass therefore reads the whole list, once.


def test_a_node_list_since_its_last_update(slurm_root: SlurmRoot, slurm_release: SlurmRelease, tmp_path: Path) -> None:
    """Why a pass reads Slurm's whole node list (docs/scaling.md, "What a pass reads")."""
    config = SlurmConfig(address="127.0.0.1", port=free_port(30000, 32767), partition=PARTITION)
    slurm = Slurm(slurm_root, tmp_path / "slurm", config, slurm_key=make_slurm_key(), jwt_key=make_jwt_key())
    try:
        slurm.start()
        slurm.scontrol("create", "NodeName=cloud-[1-4]", "CPUs=2", "State=CLOUD")  # listed, unlike FUTURE records
        headers = {"X-SLURM-USER-TOKEN": slurm.token(), "X-SLURM-USER-NAME": "slurm"}
        url = f"{slurm.restd_url}/slurm/{slurm_release.api_version}/nodes/"
        first = httpx.get(url, headers=headers, timeout=10).json()
        since = first["last_update"]["number"]
        slurm.scontrol("update", "NodeName=cloud-1", "State=DRAIN", "Reason=conformance")  # one node changes
        later = httpx.get(url, params={"update_time": since}, headers=headers, timeout=10).json()
    finally:
        slurm.close()
    assert len(first["nodes"]) == 4 and not first["errors"]
    assert len(later.get("nodes") or ()) in (0, 4), later  # all or nothing: never only the node that changed
