"""A fake slurmrestd on 127.0.0.1: nodes, DRAIN/UNDRAIN, FUTURE, DELETE, HS256 JWT auth, the versions a release serves.

Test code drives a small job model (``start_job`` / ``finish_job``); a node's state is IDLE or
ALLOCATED from its jobs, or DOWN when its slurmd stopped answering (``lose``, with NOT_RESPONDING and
slurmctld's "Not responding" reason as SlurmUser) or a person downed it (``admin_down``), plus DRAIN
when drained, plus DYNAMIC_NORM (every node here joined with ``slurmd -Z``). ``fail_status`` makes
every call answer that status; ``stop()`` takes the server down (connection refused).

It answers as real slurmrestd 26.05 or 24.11 does (``release``; checked against both: the
conformance test sends the same requests to each, kit/tests/real_slurm/test_conformance.py), serving
the data parsers of the release it plays (``slurmrestd_dialects.SERVED``). It also plays **26.11**
(``release="26.11"``), which no test here has run for real (neither Debian nor a registry reachable
here has it, docs/testing.md): data parsers v0.0.43 to v0.0.46 (v0.0.42 removed, v0.0.43
deprecated), no ``/healthz``, ``/readyz`` or ``/livez`` (dropped by 26.11, as SchedMD's release
notes say; an unknown URL still answers 404: with a token, since in SchedMD's master a path no route
serves goes to the OpenAPI router, which authenticates first, ``src/slurmrestd/http.c``
``_req_not_found``), and otherwise 26.05's answers (an inference: the node API did not change in the
notes). 26.05 serves the three health paths (its ``src/slurmrestd/openapi.c``: 204 without a body or
Content-Type, with a token; 401 without one, as every path); 24.11 never had them in slurmrestd (404
with a token, 401 without). Both: a request without a token gets 401 text/plain, a token it cannot
verify 511 with error 1007; an unknown node error 2018, a busy one 2016 on DELETE (node errors name
``_update_node`` for a POST, ``op_handler_node`` for a DELETE); an unserved version or path 404
text/plain with a token, 401 without one (slurmrestd authenticates before it routes);
``reason_set_by_user`` is the token's ``sun``; bodies carry ``errors``, ``warnings`` and ``meta``.
Where the releases differ (status codes, words, when a drain reason goes),
``slurmrestd_dialects.Dialect`` says how. A job here takes the whole node (ALLOCATED, as ``sbatch
--exclusive``; a smaller job on real Slurm shows MIXED).

``{"state": ["FUTURE"]}`` on an idle node (drained or not) moves it to :attr:`FakeSlurmrestd.future`:
the record stays, hidden from ``GET nodes`` but still counted in its partition's ``nodes.total``,
DRAIN cleared; a busy node, or one already FUTURE, is refused. A FUTURE record still takes
DRAIN/UNDRAIN and DELETE, and :meth:`FakeSlurmrestd.add_node` of its name (the host's next
``slurmd -Z``) takes it again, IDLE.

For node demand it also lists jobs and partitions: running jobs from the node model (partition
``PARTITION``), and pending jobs queued with ``submit`` (any partition, reason, node count), in
v0.0.42's shapes as real slurmrestd 24.11 lists them (``node_count`` and ``eligible_time`` as
``{set, infinite, number}``; no ``begin_time``, which only job descriptions carry; checked by the
conformance test).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import jwt

from testbed.components.slurmrestd_dialects import (
    DEFAULT_RELEASE,
    DIALECTS,
    HEALTH_PATHS,
    SERVED,
    error,
    error_source,
    no_val,
    slurm_body,
)
from testbed.framework.httpserve import Answer, LoopbackServer, Request

VERSIONS = SERVED[DEFAULT_RELEASE]
PARTITION = "batch"  # where running jobs of the node model run
_PATH = re.compile(r"^/slurm/(v0\.0\.\d+)/(ping|nodes|jobs|partitions|node/([^/]+))/?$")


@dataclass
class Node:
    name: str
    address: str
    jobs: dict[int, float] = field(default_factory=dict)  # job id -> end time
    drain: bool = False
    reason: str = ""
    reason_set_by_user: str = ""
    hostname: str = ""
    reason_changed_at: int = 0  # 0: never set
    down: bool = False  # DOWN: slurmctld or a person took it out of service
    not_responding: bool = False  # slurmd does not answer slurmctld's pings

    def states(self, future: bool = False) -> list[str]:
        base = ["FUTURE"] if future else ["DOWN"] if self.down else ["ALLOCATED"] if self.jobs else ["IDLE"]
        flags = (["DRAIN"] if self.drain else []) + ["DYNAMIC_NORM"]
        return base + flags + (["NOT_RESPONDING"] if self.not_responding else [])

    def json(self) -> dict[str, Any]:
        """The node as GET nodes and GET node/<name> list it."""
        return {
            "name": self.name,
            "hostname": self.hostname,
            "address": self.address,
            "state": self.states(),
            "reason": self.reason,
            "reason_set_by_user": self.reason_set_by_user,
            "reason_changed_at": no_val(self.reason_changed_at or None),
        }

    @property
    def busy(self) -> bool:
        return bool(self.jobs)


class FakeSlurmrestd:
    def __init__(
        self,
        key: bytes,
        release: str = DEFAULT_RELEASE,
        versions: tuple[str, ...] | None = None,
        health: bool | None = None,
    ) -> None:
        """``versions``: the data parsers served (default: the release's); ``health``: whether ``/healthz``,
        ``/readyz`` and ``/livez`` are served (default: as the release does; 404 otherwise, as any unknown URL)."""
        self.key = key
        self.dialect = DIALECTS[release]
        self.versions = SERVED[release] if versions is None else versions
        self.health = self.dialect.health if health is None else health
        self.nodes: dict[str, Node] = {}  # what GET nodes lists
        self.future: dict[str, Node] = {}  # FUTURE records: kept, not listed
        self.lock = threading.RLock()
        self.fail_status: int | None = None
        self.calls: list[tuple[str, str]] = []
        self.violations: list[str] = []  # busy nodes SliMe asked to delete or return to FUTURE
        self.deleted: list[str] = []
        self.returned: list[str] = []  # nodes returned to FUTURE
        self.drains: list[str] = []
        self.undrains: list[str] = []
        self.tokens_seen: list[dict[str, Any]] = []
        # Called after every GET of the node list (or of one node) has been answered (tests use them to play a race).
        self.after_nodes_read: Callable[[], None] | None = None
        self.after_node_read: Callable[[], None] | None = None
        self._next_job = 1
        self.started: dict[int, int] = {}  # job id -> when it became eligible (it started at once)
        self.pending: dict[int, dict[str, Any]] = {}  # job id -> its record, as GET jobs lists it
        self.partitions: dict[str, int | None] = {PARTITION: None}  # name -> MaxNodes (None: UNLIMITED)
        # When the last full job listing was sent, and what it held: slurmctld's last_update, and
        # what an update_time query compares against (tests also edit pending and node jobs directly).
        self._listed: tuple[int, tuple[Any, ...]] | None = None
        self.unchanged_answers = 0  # GET jobs answered "No job changes since update_time"
        self.health_checks = 0  # GET /healthz, /readyz, /livez answered (a release that serves them)
        self.http = LoopbackServer(self._respond, self._after, "fake-slurmrestd")

    @property
    def url(self) -> str:
        return self.http.url

    def stop(self) -> None:
        self.http.stop()

    def _respond(self, request: Request) -> Answer:
        self.calls.append((request.method, request.path))
        content_type = (request.headers.get("content-type") or "").split(";")[0]
        if request.method == "POST" and content_type != "application/json":
            return self.dialect.untyped_post
        return self.handle(request.method, request.path, request.headers.get("x-slurm-user-token"), request.body)

    def _after(self, request: Request) -> None:
        if request.method == "GET" and "/nodes" in request.path and self.after_nodes_read is not None:
            self.after_nodes_read()
        if request.method == "GET" and "/node/" in request.path and self.after_node_read is not None:
            self.after_node_read()

    # --- the model ----------------------------------------------------------------------------

    def add_node(self, name: str, address: str, hostname: str = "") -> None:
        """A host's ``slurmd -Z`` registers: it takes the FUTURE record of its name, else a new dynamic node is made."""
        with self.lock:
            record = self.future.pop(name, None)
            if record is not None:  # IDLE at its (new) address
                record.address, record.hostname = address, hostname or name
                self._clear_drain(record)
                self.nodes[name] = record
                return
            self.nodes[name] = Node(
                name, address, hostname=hostname or name, reason_set_by_user=self.dialect.registered_by
            )

    def _clear_drain(self, node: Node) -> None:
        """DRAIN goes; the reason with it on 26.05, on 24.11 only when the node next runs a job."""
        node.drain = False
        if not self.dialect.reason_outlives_drain:
            node.reason, node.reason_set_by_user, node.reason_changed_at = "", "", 0

    def admin_future(self, node: str) -> None:
        """An administrator's ``scontrol update nodename=... state=future`` of an idle node (DRAIN cleared)."""
        with self.lock:
            found = self.nodes.pop(node)
            self._clear_drain(found)
            self.future[node] = found

    def declare_future(self, name: str) -> None:
        """An operator's ``scontrol create NodeName=<name> State=FUTURE``."""
        with self.lock:
            self.future[name] = Node(name, name, hostname=name)

    def lose(self, node: str, since: float, busy: bool = False) -> None:
        """Its slurmd stops answering: slurmctld marks it NOT_RESPONDING and, after SlurmdTimeout, DOWN with
        reason "Not responding" as SlurmUser (``since``: when; jobs die with it unless ``busy`` keeps them,
        for a node that still shows its job)."""
        with self.lock:
            found = self.nodes[node]
            found.not_responding, found.down = True, not busy
            found.reason, found.reason_set_by_user, found.reason_changed_at = "Not responding", "slurm", int(since)
            if not busy:
                found.jobs.clear()

    def admin_down(self, node: str, reason: str, since: float) -> None:
        """An administrator's ``scontrol update nodename=... state=down reason=...`` (as root)."""
        with self.lock:
            found = self.nodes[node]
            found.down, found.jobs = True, {}
            found.reason, found.reason_set_by_user, found.reason_changed_at = reason, "root", int(since)

    def recover(self, node: str) -> None:
        """slurmd answers again and the node is resumed: no DOWN, no NOT_RESPONDING, no reason."""
        with self.lock:
            found = self.nodes[node]
            found.down = found.not_responding = False
            found.reason, found.reason_set_by_user, found.reason_changed_at = "", "", 0

    def admin_drain(self, node: str, reason: str) -> None:
        """An administrator's ``scontrol update nodename=... state=drain reason=...``."""
        with self.lock:
            found = self.nodes[node]
            found.drain, found.reason, found.reason_set_by_user = True, reason, "root"
            found.reason_changed_at = int(time.time())

    def start_job(self, node: str, end: float) -> int:
        with self.lock:
            job = self._next_job
            self._next_job += 1
            found = self.nodes[node]
            found.jobs[job] = end
            self.started[job] = int(time.time())
            if not found.drain:  # 24.11 clears a reason an UNDRAIN left when the node is next allocated
                found.reason, found.reason_set_by_user = "", ""
            return job

    def submit(self, nodes: int, partition: str = PARTITION, reason: str = "Resources", **fields: Any) -> int:
        """Queue a pending job asking ``nodes`` nodes (``fields``: more of its record, e.g. hold, array_task_string)."""
        with self.lock:
            job = self._next_job
            self._next_job += 1
            self.pending[job] = {
                "job_id": job,
                "partition": partition,
                "job_state": ["PENDING"],
                "state_reason": reason,
                "node_count": no_val(nodes),
                "nodes": "",
                "hold": False,
                "eligible_time": no_val(int(time.time())),
                "array_task_string": "",
                "array_max_tasks": no_val(0),
                **fields,
            }
            return job

    def _jobs(self) -> list[dict[str, Any]]:
        running: dict[int, list[str]] = {}
        for node in self.nodes.values():
            for job in node.jobs:
                running.setdefault(job, []).append(node.name)
        return [
            *(
                {
                    "job_id": job,
                    "partition": PARTITION,
                    "job_state": ["RUNNING"],
                    "state_reason": "None",
                    "node_count": no_val(len(names)),
                    "nodes": ",".join(sorted(names)),
                    "hold": False,
                    "eligible_time": no_val(self.started.get(job, 0)),
                    "array_task_string": "",
                    "array_max_tasks": no_val(0),
                }
                for job, names in sorted(running.items())
            ),
            *self.pending.values(),
        ]

    def finish_jobs(self, node: str) -> None:
        with self.lock:
            self.nodes[node].jobs.clear()

    def state(self, node: str) -> list[str] | None:
        """A node's states (a FUTURE record's too, as ``scontrol --future show node`` gives them); None: no record."""
        with self.lock:
            found = self.nodes.get(node)
            if found is not None:
                return found.states()
            record = self.future.get(node)
            return record.states(future=True) if record else None

    # --- HTTP -------------------------------------------------------------------------------

    def handle(self, method: str, path: str, token: str | None, raw: bytes) -> Answer:
        if self.fail_status is not None:
            return self.fail_status, self._body(errors=[error("injected failure", 1, "Unspecified error", "fake")])
        path, _, query = path.partition("?")
        if token is None:  # slurmrestd authenticates before it routes: any path, served or not
            return 401, "Authentication failure"
        if path in HEALTH_PATHS and method == "GET" and self.health:
            self.health_checks += 1
            return 204, ""  # slurmrestd 26.05's health answer: no content, no Content-Type
        match = _PATH.match(path)
        if not match or match.group(1) not in self.versions:
            return 404, self.dialect.not_found  # text/plain
        _, what, name = match.groups()
        try:
            claims = jwt.decode(token, self.key, algorithms=["HS256"], options={"require": ["sun", "exp", "iat"]})
        except jwt.PyJWTError:
            return self._unverified(method, what, name)
        self.tokens_seen.append(claims)
        with self.lock:
            if name is not None:
                return self._node_request(method, name, raw, claims)
            if method == "GET":
                return self._listing(what, query)
        return 405, "Method not allowed"

    def _unverified(self, method: str, what: str, name: str | None) -> Answer:
        """A token slurmrestd cannot verify: a ping says slurmctld does not respond, anything else is 511."""
        if what == "ping":
            return 200, self._body(pings=[self._ping(False)])
        if name is None:
            return 511, self._body(
                errors=[error(f"Failure to query {what}", 1007, "Protocol authentication error", "_dump_nodes")]
            )
        return 511, self._body(
            errors=[
                error(f"{self._failure(method)} {name}", 1007, "Protocol authentication error", error_source(method))
            ]
        )

    def _listing(self, what: str, query: str) -> Answer:
        """GET ping, jobs, partitions or nodes."""
        if what == "ping":
            return 200, self._body(pings=[self._ping(True)])
        if what == "jobs":
            return 200, self._job_listing(query)
        if what == "partitions":
            total = len(self.nodes) + len(self.future)  # FUTURE records are nodes of the partition
            return 200, self._body(
                partitions=[
                    {
                        "name": name,
                        "maximums": {"nodes": no_val(limit, infinite=limit is None)},
                        "nodes": {"total": total},
                    }
                    for name, limit in self.partitions.items()
                ]
            )
        return 200, self._body(nodes=[n.json() for n in self.nodes.values()])

    def _node_request(self, method: str, name: str, raw: bytes, claims: dict[str, Any]) -> Answer:
        """GET, POST (a state) or DELETE of ``node/<name>``."""
        node, record = self.nodes.get(name), self.future.get(name)
        if method == "GET":  # one node; unknown and FUTURE ones are not shown
            if node is None:  # real 24.11 and 26.05: 200, no "nodes", one error that says "No error"
                return 200, self._body(errors=[error(f"Failure to query node {name}", 0, "No error", "_dump_nodes")])
            return 200, self._body(nodes=[node.json()])
        if node is None and record is None:
            return self.dialect.error_status, self._body(
                errors=[
                    error(f"{self._failure(method)} {name}", 2018, "Invalid node name specified", error_source(method))
                ]
            )
        if record is not None:
            return self._future_record(method, record, raw, claims)
        assert node is not None
        if method == "POST":
            return self._update(node, json.loads(raw or b"{}"), claims)
        if method == "DELETE":
            if node.busy:
                self.violations.append(f"DELETE of busy node {node.name}")
                return self.dialect.error_status, self._body(
                    errors=[
                        error(f"{self._failure(method)} {name}", 2016, "Requested nodes are busy", "op_handler_node")
                    ]
                )
            del self.nodes[node.name]
            self.deleted.append(node.name)
            return 200, self._body()
        return 405, "Method not allowed"

    def _update(self, node: Node, update: dict[str, Any], claims: dict[str, Any]) -> Answer:
        """POST node/<name> of a listed node: FUTURE, DRAIN, or UNDRAIN/RESUME."""
        states = update.get("state") or []
        if "FUTURE" in states:
            if node.busy:
                self.violations.append(f"FUTURE of busy node {node.name}")
                return self.dialect.error_status, self._invalid_state(node.name)
            self._clear_drain(node)
            self.future[node.name] = self.nodes.pop(node.name)
            self.returned.append(node.name)
        elif "DRAIN" in states:
            node.drain, node.reason, node.reason_set_by_user = True, update.get("reason", ""), str(claims.get("sun"))
            node.reason_changed_at = int(time.time())
            self.drains.append(node.name)
        elif "UNDRAIN" in states or "RESUME" in states:
            self._clear_drain(node)
            self.undrains.append(node.name)
        else:
            return self.dialect.error_status, self._body(
                errors=[error(f"Failure to update node {node.name}", 2, "Invalid state", "op_handler_node")]
            )
        return 200, self._body()

    def _body(self, errors: list[dict[str, Any]] | None = None, **payload: Any) -> dict[str, Any]:
        return slurm_body(self.dialect.release, errors, **payload)

    def _jobs_fingerprint(self) -> tuple[Any, ...]:
        """Cheap at any queue length: which jobs are pending and which run where."""
        running = tuple((node.name, tuple(node.jobs)) for node in self.nodes.values() if node.jobs)
        return (tuple(self.pending), running)

    def _job_listing(self, query: str) -> dict[str, Any]:
        """GET jobs as slurmctld answers it: every job with ``last_update`` (the time of the listing);
        with ``update_time=T`` at or after the last listing and no job changed since, no jobs, no
        ``last_update`` and a warning (slurmrestd's ``SLURM_NO_CHANGE_IN_DATA`` answer)."""
        asked = parse_qs(query).get("update_time", [""])[0]
        fingerprint = self._jobs_fingerprint()
        if asked.isdigit() and self._listed is not None:
            listed_at, listed = self._listed
            if int(asked) >= listed_at and listed == fingerprint:
                self.unchanged_answers += 1
                body = self._body(jobs=[], last_backfill=no_val(0), last_update=no_val(0))
                body["warnings"] = [
                    {
                        "description": f"No job changes since update_time[{asked}]",
                        "source": "_op_handler_jobs",
                    }
                ]
                return body
        now = int(time.time())
        self._listed = (now, fingerprint)
        return self._body(jobs=self._jobs(), last_backfill=no_val(0), last_update=no_val(now))

    def _failure(self, method: str) -> str:
        """How a refused node request's description begins."""
        return self.dialect.delete_words if method == "DELETE" else "Failure to update node"

    def _ping(self, responding: bool) -> dict[str, Any]:
        ping: dict[str, Any] = {"hostname": "slurmctld", "responding": responding}
        if self.dialect.ping_word:
            ping["pinged"] = "UP" if responding else "DOWN"
        else:
            ping["status"] = "No error" if responding else "Protocol authentication error"
        return ping

    def _invalid_state(self, name: str) -> dict[str, Any]:
        """What slurmctld answers to a FUTURE it will not make (the node is busy, or FUTURE already)."""
        number, words = self.dialect.refused_state
        return self._body(errors=[error(f"Failure to update node {name}", number, words, "_update_node")])

    def _future_record(self, method: str, record: Node, raw: bytes, claims: dict[str, Any]) -> Answer:
        """A request naming a FUTURE record: DRAIN/UNDRAIN and DELETE work on it, FUTURE again is refused (2028)."""
        if method == "DELETE":
            del self.future[record.name]
            self.deleted.append(record.name)
            return 200, self._body()
        if method == "POST":
            states = json.loads(raw or b"{}").get("state") or []
            if "DRAIN" in states:
                record.drain, record.reason, record.reason_set_by_user = (
                    True,
                    json.loads(raw).get("reason", ""),
                    str(claims.get("sun")),
                )
                return 200, self._body()
            if "UNDRAIN" in states or "RESUME" in states:
                self._clear_drain(record)
                return 200, self._body()
            return self.dialect.error_status, self._invalid_state(record.name)
        return 405, "Method not allowed"


class JwtKeySecret:
    """The one Kubernetes call SliMe's slurmrestd client makes, GET the Secret holding the JWT key,
    answered with ``key``: for driving the client against a slurmrestd without a cluster."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        return {"data": {"jwt_hs256.key": base64.b64encode(self.key).decode()}}
