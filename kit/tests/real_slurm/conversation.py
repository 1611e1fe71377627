"""One conversation with a slurmrestd, the real one or the fake: the conformance test sends it to both.

A :class:`Target` is one slurmrestd with two dynamic nodes (:data:`IDLE` and :data:`BUSY`) and the
few actions a conversation needs besides HTTP (make a node busy, queue a job, reboot a node's
host). Each answer is reduced (:func:`reduce`) to what a client can rely on: status, content type,
error entries, the node fields SliMe reads, and the job and partition fields node demand reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt

from testbed.components.slurmrestd_dialects import HEALTH_PATHS
from testbed.framework.wait import wait_for
from testbed.framework.world import make_jwt_key

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
SCALE_IN = {"state": ["DRAIN"], "reason": "slime: scale-in"}


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


def token(key: bytes, **claims: Any) -> str:
    now = int(time.time())
    return jwt.encode({"sun": "slurm", "iat": now, "exp": now + 60, **claims}, key, algorithm="HS256")


def reduce(target: Target, response: httpx.Response) -> dict[str, Any]:
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
        out["jobs"] = sorted((_job(target, job) for job in body["jobs"]), key=lambda j: json.dumps(j, sort_keys=True))
    if "nodes" in body:
        out["nodes"] = {node["name"]: _node(target, node) for node in body["nodes"]}
    if "pings" in body:  # (24.11 also says "pinged": UP/DOWN, 26.05 "status")
        out["pings"] = [{k: p[k] for k in ("responding", "pinged", "status") if k in p} for p in body["pings"]]
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


def _node(target: Target, node: dict[str, Any]) -> dict[str, Any]:
    missing = [f for f in NODE_FIELDS if f not in node]
    assert not missing, f"{target.name}: node {node.get('name')} lacks {missing}"
    return {
        "state": node["state"],
        "reason": node["reason"],
        "reason_set_by_user": node["reason_set_by_user"],
        "address_is_the_nodes": node["address"] == target.addresses.get(node["name"]),
        "hostname": node["hostname"],
    }


def _job(target: Target, job: dict[str, Any]) -> dict[str, Any]:
    missing = [f for f in JOB_FIELDS if f not in job]
    assert not missing, f"{target.name}: job {job.get('job_id')} lacks {missing}"
    eligible = job["eligible_time"]
    return {
        "state": job["job_state"],
        "reason": job["state_reason"],
        "partition_is_the_one": job["partition"] == target.partition,
        "node_count": job["node_count"],
        "nodes": job["nodes"],
        "hold": job["hold"],
        "eligible_time": {"keys": sorted(eligible), "set": eligible["set"], "past": eligible["number"] <= time.time()},
        "array_task_string": job["array_task_string"],
        "array_max_tasks": job["array_max_tasks"],
        "no_begin_time": "begin_time" not in job,
    }


class Conversation:
    """The same requests, in the same order, to one slurmrestd; :attr:`answers` holds each answer reduced."""

    def __init__(self, target: Target, client: httpx.Client) -> None:
        self.target, self.client = target, client
        self.v = target.version
        self.other_key = make_jwt_key()
        self.answers: list[tuple[str, dict[str, Any]]] = []

    def send(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        token_: str | None = "good",
        json_type: bool = True,
        version: str | None = None,
        absolute: bool = False,
    ) -> None:
        headers = {}
        if token_ is not None:
            headers["X-SLURM-USER-TOKEN"] = token(self.target.key) if token_ == "good" else token_
        content = None if body is None else json.dumps(body).encode()
        if content is not None and json_type:
            headers["Content-Type"] = "application/json"
        url = path if absolute else f"/slurm/{version or self.v}{path}"
        self.answers.append(
            (what, reduce(self.target, self.client.request(method, url, content=content, headers=headers)))
        )

    def _get(self, path: str) -> httpx.Response:
        return self.client.get(f"/slurm/{self.v}{path}", headers={"X-SLURM-USER-TOKEN": token(self.target.key)})

    def settled_nodes(self, what: str) -> None:
        """GET nodes once no node is NOT_RESPONDING: real slurmctld re-pings a node ~0.5 s after an UNDRAIN (a
        transient the fake leaves out)."""

        def settled() -> httpx.Response | None:
            response = self._get("/nodes/")
            nodes = response.json().get("nodes", [])
            return None if any("NOT_RESPONDING" in n["state"] for n in nodes) else response

        response = wait_for(settled, 10, f"{self.target.name}: no node NOT_RESPONDING", interval=0.2)
        self.answers.append((what, reduce(self.target, response)))

    def quiet_last_update(self) -> int:
        """The last_update of a job listing slurmctld then calls unchanged. slurmctld reports a change made in the
        same second as the listing, and its scheduler touches a new job once: list again until quiet."""

        def quiet() -> list[int] | None:
            since = int(self._get("/jobs/").json()["last_update"]["number"])
            return None if self._get(f"/jobs/?update_time={since}").json()["jobs"] else [since]

        return wait_for(quiet, 15, f"{self.target.name}: a job listing no job changed after", interval=1.0)[0]

    def credentials(self) -> None:
        """Unserved versions, missing, foreign, expired and incomplete tokens."""
        for version in self.target.unserved:
            self.send(f"list nodes {version} (not served)", "GET", "/nodes/", version=version)
            self.send(f"ping {version} (not served)", "GET", "/ping", version=version)
        for path in HEALTH_PATHS:  # 26.05 serves them; 24.11 never did, 26.11 no more: 404, as any unknown URL
            self.send(f"{path}, no token", "GET", path, token_=None, absolute=True)
            self.send(f"{path}", "GET", path, absolute=True)
        other, key, now = token(self.other_key), self.target.key, int(time.time())
        self.send("no token", "GET", "/nodes/", token_=None)
        self.send("token signed with another key", "GET", "/nodes/", token_=other)
        self.send("expired token", "GET", "/nodes/", token_=token(key, iat=now - 300, exp=now - 100))
        no_sun = jwt.encode({"iat": now, "exp": now + 60}, key, algorithm="HS256")
        self.send("token without sun", "GET", "/nodes/", token_=no_sun)
        self.send("ping with a bad token", "GET", "/ping/", token_=other)
        self.send("drain, bad token", "POST", f"/node/{IDLE}", {"state": ["DRAIN"], "reason": "x"}, token_=other)
        self.send("delete, bad token", "DELETE", f"/node/{IDLE}", token_=other)
        self.send("delete, no token", "DELETE", f"/node/{IDLE}", token_=None)

    def drains(self) -> None:
        """Drain and undrain an idle node; a busy node's job, a pending job, the partition; refusals."""
        self.send("drain idle node", "POST", f"/node/{IDLE}", SCALE_IN)
        self.send("after drain", "GET", "/nodes/")
        self.send(
            "drain without Content-Type", "POST", f"/node/{IDLE}", {"state": ["DRAIN"], "reason": "y"}, json_type=False
        )
        self.send("undrain", "POST", f"/node/{IDLE}", {"state": ["UNDRAIN"]})
        self.settled_nodes("after undrain")
        self.target.make_busy(BUSY)
        self.send("busy node", "GET", "/nodes/")
        self.target.queue(2)  # both nodes: one is busy, so it pends
        self.send("list jobs", "GET", "/jobs/")
        since = self.quiet_last_update()
        self.send("jobs unchanged since a listing", "GET", f"/jobs/?update_time={since}")
        self.send("list partitions", "GET", "/partitions/")
        self.target.unqueue()
        self.send("delete busy node", "DELETE", f"/node/{BUSY}")
        self.send("drain busy node", "POST", f"/node/{BUSY}", SCALE_IN)
        self.send("busy and drained", "GET", "/nodes/")
        self.send("delete busy drained node", "DELETE", f"/node/{BUSY}")
        self.send("drain unknown node", "POST", "/node/nosuch", SCALE_IN)
        self.send("undrain unknown node", "POST", "/node/nosuch", {"state": ["UNDRAIN"]})
        self.send("delete unknown node", "DELETE", "/node/nosuch")

    def release(self) -> None:
        """The release: back to FUTURE (the idle node's slurmd still runs, as before its host is deprovisioned),
        the host's next boot, the delete."""
        self.send("FUTURE busy node", "POST", f"/node/{BUSY}", {"state": ["FUTURE"]})
        self.send("FUTURE unknown node", "POST", "/node/nosuch", {"state": ["FUTURE"]})
        self.send("drain idle node again", "POST", f"/node/{IDLE}", SCALE_IN)
        self.send("FUTURE drained idle node", "POST", f"/node/{IDLE}", {"state": ["FUTURE"]})
        self.send("after FUTURE", "GET", "/nodes/")
        self.send("get the FUTURE node", "GET", f"/node/{IDLE}")
        self.send("partitions after FUTURE", "GET", "/partitions/")
        self.send("FUTURE again", "POST", f"/node/{IDLE}", {"state": ["FUTURE"]})
        self.target.reboot(IDLE)
        self.settled_nodes("after its host boots again")
        self.send("delete idle node", "DELETE", f"/node/{IDLE}")
        self.send("delete it again (gone)", "DELETE", f"/node/{IDLE}")
        self.send("after delete", "GET", "/nodes/")


def conversation(target: Target) -> list[tuple[str, dict[str, Any]]]:
    """The whole conversation with one slurmrestd, each answer reduced."""
    with httpx.Client(base_url=target.url, timeout=15) as client:
        talk = Conversation(target, client)
        talk.send("list nodes", "GET", "/nodes/")
        talk.send("get one node", "GET", f"/node/{IDLE}")
        talk.send("get unknown node", "GET", "/node/nosuch")
        talk.send("ping", "GET", "/ping/")
        talk.credentials()
        talk.drains()
        talk.release()
    return talk.answers
