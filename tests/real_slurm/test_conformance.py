"""The fake slurmrestd answers as real slurmrestd does, for each Slurm release the tier runs (26.05 and 24.11).

tests/scalein/fake_slurmrestd.py stands in for slurmrestd in the fast suites. Here one sequence
of requests (what SliMe's client sends, and the errors it must understand) goes to the fake and
to a real slurmrestd with two real dynamic nodes; each answer is reduced to what a client can
rely on (status, content type, error entries, the node fields SliMe reads, the job and partition
fields node demand reads) and the two lists must be equal. Where they differed, the fake was fixed. Then SliMe's own
client
(``scaling_webhook/safe_scale_in/slurmrestd.py``) runs the same operations against both:
each release's newest data parser is proven against real Slurm here (24.11: ``v0.0.42``, of the
v0.0.40 to v0.0.42 it serves; 26.05: ``v0.0.45``, of v0.0.42 to v0.0.45).

The release SliMe makes (``{"state": ["FUTURE"]}`` on a drained, idle node whose slurmd still
runs) is part of the conversation: the record must stay (not listed, still counted in the
partition), a busy node or one already FUTURE be refused, and the host's next ``slurmd -Z``
(the host powered off and booted again) take the record back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from scaling_webhook.safe_scale_in.config import SafeScaleInConfig
from scaling_webhook.safe_scale_in.slurmrestd import SlurmClient, SlurmUnavailable
from testbed.audit import scan_logs
from testbed.fake_slurmrestd import DIALECTS, PARTITION, FakeSlurmrestd, JwtKeySecret
from testbed.ports import free_port
from testbed.real.cloudinit import Node, boot, meta_data_for
from testbed.real.netns import Network
from testbed.real.slurm import Release, Slurm, SlurmConfig, SlurmRoot
from testbed.wait import wait_for
from testbed.world import make_jwt_key, make_slurm_key

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(600)]
SLURM_RELEASES = ("26.05", "24.11")  # each release against the fake playing it (conftest.py)
IDLE, BUSY = "node-a", "node-b"
NODE_FIELDS = ("name", "hostname", "address", "state", "reason", "reason_set_by_user")
# What node demand (scaling_webhook/demand.py) and the Slurm metrics stand-in read of a job record.
JOB_FIELDS = (
    "job_id",
    "job_state",
    "partition",
    "state_reason",
    "node_count",
    "nodes",
    "hold",
    "eligible_time",
    "array_task_string",
    "array_max_tasks",
)


@dataclass
class Target:
    name: str
    url: str
    key: bytes = field(repr=False)  # a failure's report never shows the signing key
    make_busy: Callable[[str], None]
    addresses: dict[str, str]
    partition: str  # the one partition, over every node
    queue: Callable[[int], None]  # submit a job asking this many nodes, which cannot start now (it pends)
    unqueue: Callable[[], None]  # cancel it
    reboot: Callable[[str], None]  # the node's host powers off and boots again: its slurmd -Z registers anew
    version: str  # the newest data parser the release serves
    unserved: tuple[str, ...]  # newer versions it does not serve


def unserved(version: str) -> tuple[str, ...]:
    return tuple(v for v in ("v0.0.43", "v0.0.44", "v0.0.45", "v0.0.46") if v > version)


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
def fake(slurm_release: Release) -> Iterator[Target]:
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


def _token(key: bytes, **claims: Any) -> str:
    now = int(time.time())
    return jwt.encode({"sun": "slurm", "iat": now, "exp": now + 60, **claims}, key, algorithm="HS256")


def _reduce(target: Target, response: httpx.Response) -> dict[str, Any]:
    """What a client can rely on in an answer (addresses replaced by the node they belong to)."""
    kind = (response.headers.get("content-type") or "").split(";")[0]
    out: dict[str, Any] = {"status": response.status_code, "type": kind}
    if kind != "application/json":
        out["text"] = response.text
        return out
    body = response.json()
    out["errors"] = body.get("errors")
    out["keys"] = sorted(k for k in body if k in ("errors", "warnings", "meta", "nodes", "pings", "jobs", "partitions"))
    if "jobs" in body:  # last_update: the listing's time; unset (or 0) on a "no change since update_time" answer
        last_update = body.get("last_update") or {}
        out["last_update_set"] = bool(last_update.get("set")) and last_update.get("number", 0) > 0
        out["warnings"] = [w["description"].split("update_time")[0] for w in body.get("warnings") or []]
    if "nodes" in body:
        nodes = {}
        for node in body["nodes"]:
            missing = [f for f in NODE_FIELDS if f not in node]
            assert not missing, f"{target.name}: node {node.get('name')} lacks {missing}"
            nodes[node["name"]] = {
                "state": node["state"],
                "reason": node["reason"],
                "reason_set_by_user": node["reason_set_by_user"],
                "address_is_the_nodes": node["address"] == target.addresses.get(node["name"]),
                "hostname": node["hostname"],
            }
        out["nodes"] = nodes
    if "pings" in body:  # (24.11 also says "pinged": UP/DOWN, 26.05 "status")
        out["pings"] = [{k: p[k] for k in ("responding", "pinged", "status") if k in p} for p in body["pings"]]
    if "jobs" in body:
        jobs = []
        for job in body["jobs"]:
            missing = [f for f in JOB_FIELDS if f not in job]
            assert not missing, f"{target.name}: job {job.get('job_id')} lacks {missing}"
            eligible = job["eligible_time"]
            jobs.append(
                {
                    "state": job["job_state"],
                    "reason": job["state_reason"],
                    "partition_is_the_one": job["partition"] == target.partition,
                    "node_count": job["node_count"],
                    "nodes": job["nodes"],
                    "hold": job["hold"],
                    "eligible_time": {
                        "keys": sorted(eligible),
                        "set": eligible["set"],
                        "past": eligible["number"] <= time.time(),
                    },
                    "array_task_string": job["array_task_string"],
                    "array_max_tasks": job["array_max_tasks"],
                    "no_begin_time": "begin_time" not in job,
                }
            )
        out["jobs"] = sorted(jobs, key=lambda j: json.dumps(j, sort_keys=True))
    if "partitions" in body:
        out["partitions"] = [
            {
                "is_the_one": p["name"] == target.partition,
                "max_nodes": p["maximums"]["nodes"],
                "total": p["nodes"]["total"],
            }
            for p in body["partitions"]
        ]
    return out


def _settled_nodes(target: Target, client: httpx.Client) -> httpx.Response:
    """GET nodes once no node is NOT_RESPONDING: real slurmctld re-pings a node ~0.5 s after an UNDRAIN (a transient
    the fake leaves out)."""
    V = target.version
    response = client.get(f"/slurm/{V}/nodes/", headers={"X-SLURM-USER-TOKEN": _token(target.key)})
    deadline = time.monotonic() + 10
    while any("NOT_RESPONDING" in n["state"] for n in response.json().get("nodes", [])) and time.monotonic() < deadline:
        time.sleep(0.2)
        response = client.get(f"/slurm/{V}/nodes/", headers={"X-SLURM-USER-TOKEN": _token(target.key)})
    return response


def _quiet_last_update(target: Target, client: httpx.Client) -> int:
    """The last_update of a job listing slurmctld then calls unchanged. slurmctld reports a change made in the
    same second as the listing, and its scheduler touches a new job once: list again (bounded) until quiet."""
    V, headers = target.version, {"X-SLURM-USER-TOKEN": _token(target.key)}
    for _ in range(15):
        since = client.get(f"/slurm/{V}/jobs/", headers=headers).json()["last_update"]["number"]
        if not client.get(f"/slurm/{V}/jobs/?update_time={since}", headers=headers).json()["jobs"]:
            return int(since)
        time.sleep(1.0)
    raise AssertionError(f"{target.name}: a job changed on every listing for 15 s")


def conversation(target: Target) -> list[tuple[str, dict[str, Any]]]:
    """The same requests, in the same order, to one slurmrestd; each answer reduced."""
    V = target.version
    answers: list[tuple[str, dict[str, Any]]] = []
    other_key = make_jwt_key()
    with httpx.Client(base_url=target.url, timeout=15) as client:

        def send(
            what: str, method: str, path: str, body: Any = None, token: str | None = "good", json_type: bool = True
        ) -> None:
            headers = {}
            if token is not None:
                headers["X-SLURM-USER-TOKEN"] = _token(target.key) if token == "good" else token
            content = None if body is None else json.dumps(body).encode()
            if content is not None and json_type:
                headers["Content-Type"] = "application/json"
            answers.append((what, _reduce(target, client.request(method, path, content=content, headers=headers))))

        send("list nodes", "GET", f"/slurm/{V}/nodes/")
        send("get one node", "GET", f"/slurm/{V}/node/{IDLE}")
        send("get unknown node", "GET", f"/slurm/{V}/node/nosuch")
        send("ping", "GET", f"/slurm/{V}/ping/")
        for version in target.unserved:
            send(f"list nodes {version} (not served)", "GET", f"/slurm/{version}/nodes/")
            send(f"ping {version} (not served)", "GET", f"/slurm/{version}/ping")
        send("no token", "GET", f"/slurm/{V}/nodes/", token=None)
        send("token signed with another key", "GET", f"/slurm/{V}/nodes/", token=_token(other_key))
        send(
            "expired token",
            "GET",
            f"/slurm/{V}/nodes/",
            token=_token(target.key, iat=int(time.time()) - 300, exp=int(time.time()) - 100),
        )
        send(
            "token without sun",
            "GET",
            f"/slurm/{V}/nodes/",
            token=jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 60}, target.key, algorithm="HS256"),
        )
        send("ping with a bad token", "GET", f"/slurm/{V}/ping/", token=_token(other_key))
        send(
            "drain, bad token",
            "POST",
            f"/slurm/{V}/node/{IDLE}",
            {"state": ["DRAIN"], "reason": "x"},
            token=_token(other_key),
        )
        send("delete, bad token", "DELETE", f"/slurm/{V}/node/{IDLE}", token=_token(other_key))
        send("delete, no token", "DELETE", f"/slurm/{V}/node/{IDLE}", token=None)
        send("drain idle node", "POST", f"/slurm/{V}/node/{IDLE}", {"state": ["DRAIN"], "reason": "slime: scale-in"})
        send("after drain", "GET", f"/slurm/{V}/nodes/")
        send(
            "drain without Content-Type",
            "POST",
            f"/slurm/{V}/node/{IDLE}",
            {"state": ["DRAIN"], "reason": "y"},
            json_type=False,
        )
        send("undrain", "POST", f"/slurm/{V}/node/{IDLE}", {"state": ["UNDRAIN"]})
        answers.append(("after undrain", _reduce(target, _settled_nodes(target, client))))
        target.make_busy(BUSY)
        send("busy node", "GET", f"/slurm/{V}/nodes/")
        target.queue(2)  # both nodes: one is busy, so it pends
        send("list jobs", "GET", f"/slurm/{V}/jobs/")
        since = _quiet_last_update(target, client)
        send("jobs unchanged since a listing", "GET", f"/slurm/{V}/jobs/?update_time={since}")
        send("list partitions", "GET", f"/slurm/{V}/partitions/")
        target.unqueue()
        send("delete busy node", "DELETE", f"/slurm/{V}/node/{BUSY}")
        send("drain busy node", "POST", f"/slurm/{V}/node/{BUSY}", {"state": ["DRAIN"], "reason": "slime: scale-in"})
        send("busy and drained", "GET", f"/slurm/{V}/nodes/")
        send("delete busy drained node", "DELETE", f"/slurm/{V}/node/{BUSY}")
        send("drain unknown node", "POST", f"/slurm/{V}/node/nosuch", {"state": ["DRAIN"], "reason": "slime: scale-in"})
        send("undrain unknown node", "POST", f"/slurm/{V}/node/nosuch", {"state": ["UNDRAIN"]})
        send("delete unknown node", "DELETE", f"/slurm/{V}/node/nosuch")
        # The release: back to FUTURE (the idle node's slurmd still runs, as before its host is deprovisioned).
        send("FUTURE busy node", "POST", f"/slurm/{V}/node/{BUSY}", {"state": ["FUTURE"]})
        send("FUTURE unknown node", "POST", f"/slurm/{V}/node/nosuch", {"state": ["FUTURE"]})
        send(
            "drain idle node again",
            "POST",
            f"/slurm/{V}/node/{IDLE}",
            {"state": ["DRAIN"], "reason": "slime: scale-in"},
        )
        send("FUTURE drained idle node", "POST", f"/slurm/{V}/node/{IDLE}", {"state": ["FUTURE"]})
        send("after FUTURE", "GET", f"/slurm/{V}/nodes/")
        send("get the FUTURE node", "GET", f"/slurm/{V}/node/{IDLE}")
        send("partitions after FUTURE", "GET", f"/slurm/{V}/partitions/")
        send("FUTURE again", "POST", f"/slurm/{V}/node/{IDLE}", {"state": ["FUTURE"]})
        target.reboot(IDLE)
        answers.append(("after its host boots again", _reduce(target, _settled_nodes(target, client))))
        send("delete idle node", "DELETE", f"/slurm/{V}/node/{IDLE}")
        send("delete it again (gone)", "DELETE", f"/slurm/{V}/node/{IDLE}")
        send("after delete", "GET", f"/slurm/{V}/nodes/")
    return answers


def test_the_fake_answers_as_real_slurmrestd(real: Target, fake: Target, slurm_release: Release) -> None:
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
