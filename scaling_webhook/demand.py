"""Node demand: how many nodes a partition's work needs now, as pure functions over slurmrestd data.

Counting pending *jobs* scales one node per job, so a pending 4-node MPI job gets one node and
waits for ever (slurm-operator#29). The rule here counts *nodes*:

    demand = distinct nodes allocated to the partition's running jobs
           + nodes requested by its pending jobs that could start if they had nodes

* **Running** means a job state of ``RUNNING``, ``SUSPENDED`` or the ``COMPLETING`` flag (its
  nodes are still held); its nodes are the ``nodes`` host list, counted once however many jobs
  share a node.
* **Pending** jobs count ``node_count`` (Slurm's minimum node count for the job) times the array
  tasks still pending (capped by the array's ``%`` limit), when their ``state_reason`` says
  nodes are what they wait for: ``None`` (not scheduled yet), ``Resources``, ``Priority``,
  ``ReqNodeNotAvail``, ``NodeDown``, ``PartitionNodeLimit`` or ``PartitionConfig`` (the last two
  are what Slurm says when the partition has fewer nodes than the job asks; the never-fits test
  below tells "too few nodes now" from "can never fit").
* **Ignored** pending jobs, counted by why: ``held`` (``hold``, ``JobHeldUser``,
  ``JobHeldAdmin``, ``JobHoldMaxRequeue``), ``dependency`` (``Dependency``,
  ``DependencyNeverSatisfied``), ``begin_time`` (``BeginTime``, or an ``eligible_time`` in the
  future: slurmrestd's job records carry no ``begin_time``, only the job descriptions one submits do),
  ``never_fits`` (more nodes than the partition's ``MaxNodes`` or the pool's ``maxReplicas``),
  and ``blocked`` (any other reason: association or QOS limits, a down or inactive partition,
  licenses, reservations... nodes would not start them).
* A job pending in several partitions (``-p a,b``) counts for the first one only, so two pools
  never both grow for it.

The rule assumes a job does not share its nodes with other pending jobs (whole-node or
one-job-per-node scheduling, usual for bare-metal pools); many small jobs that could pack onto
one node are over-counted, bounded by the pool's ``maxReplicas``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from scaling_webhook.slurm.endpoint import SlurmEndpoint

RUNNING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING"})
WAITING_FOR_NODES = frozenset(
    {"None", "Resources", "Priority", "ReqNodeNotAvail", "NodeDown", "PartitionNodeLimit", "PartitionConfig"}
)
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "JobHoldMaxRequeue"})
DEPENDENCY_REASONS = frozenset({"Dependency", "DependencyNeverSatisfied"})
IGNORED = ("held", "dependency", "begin_time", "never_fits", "blocked")
# Host lists and array ranges come from a remote service: expand at most this many names.
MAX_EXPANSION = 100_000


@dataclass(frozen=True, slots=True)
class NodeDemandConfig(SlurmEndpoint):
    """One mapping's ``nodeDemand`` block (validated): the Slurm partition whose work its pool serves."""

    partition: str = ""


class DemandError(ValueError):
    """slurmrestd answered something the rule cannot use; the message says what."""


def number(value: Any) -> int | None:
    """An integer from slurmrestd: plain, or ``{"set": true, "infinite": false, "number": N}``
    (None when unset/infinite)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if (
        isinstance(value, dict)
        and value.get("set")
        and not value.get("infinite")
        and isinstance(value.get("number"), int)
    ):
        return int(value["number"])
    return None


def _ranges(text: str, where: str) -> list[str]:
    """``001-003,7`` (inside a host list's brackets) -> ``["001", "002", "003", "7"]``, zero padding kept."""
    out: list[str] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not match:
            raise DemandError(f"{where}: {part!r} is not a number or a range")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low) or int(high) - int(low) >= MAX_EXPANSION:
            raise DemandError(f"{where}: range {part!r} is reversed or too long")
        width = len(low) if low.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list syntax: ``gpu[01-03],cpu7`` or ``r[1-2]-n[1-2]`` -> the host names."""
    names: list[str] = []
    depth, start, items = 0, 0, []
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise DemandError(f"host list {text!r}: unbalanced brackets")
        if char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise DemandError(f"host list {text!r}: unbalanced brackets")
    items.append(text[start:])
    for item in (i.strip() for i in items):
        if not item:
            continue
        expanded = [""]
        for literal, inside in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            choices = _ranges(inside, f"host list {text!r}") if inside else [""]
            expanded = [prefix + literal + choice for prefix in expanded for choice in choices]
            if len(names) + len(expanded) > MAX_EXPANSION:
                raise DemandError(f"host list {text[:80]!r}... names more than {MAX_EXPANSION} hosts")
        names.extend(expanded)
    return names


def array_tasks(raw: dict[str, Any]) -> int:
    """How many tasks a job record stands for: 1, or the pending tasks of an array (``0-99:2%10``)."""
    text = raw.get("array_task_string")
    if not isinstance(text, str) or not text.strip():
        return 1
    spec, _, limit_text = text.strip().partition("%")
    tasks = 0
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not match:
            raise DemandError(f"job {raw.get('job_id')}: array_task_string {text!r} is not a task range")
        low, high, step = int(match.group(1)), int(match.group(2) or match.group(1)), int(match.group(3) or 1)
        if high < low or step < 1:
            raise DemandError(
                f"job {raw.get('job_id')}: array_task_string {text!r} has a reversed range or a zero step"
            )
        tasks += (high - low) // step + 1
    limits = [n for n in (number(raw.get("array_max_tasks")), int(limit_text) if limit_text.isdigit() else None) if n]
    return min([tasks, *limits])


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    partition: str  # the first partition listed: where this rule counts it
    states: frozenset[str]
    reason: str
    node_count: int
    nodes: str  # the host list of an allocated job
    hold: bool = False
    begin_time: int | None = None  # slurmrestd's eligible_time: when the job may start (its --begin, once pending)
    tasks: int = 1  # array tasks this record stands for

    @property
    def running(self) -> bool:
        return bool(self.states & RUNNING_STATES)

    @property
    def pending(self) -> bool:
        return "PENDING" in self.states and not self.running


def parse_job(raw: dict[str, Any]) -> Job:
    states = raw.get("job_state")
    if isinstance(states, str):
        states = [states]
    if not isinstance(states, list):
        raise DemandError(f"job {raw.get('job_id')}: job_state is {type(states).__name__}, not a list")
    partition = raw.get("partition")
    return Job(
        job_id=number(raw.get("job_id")) or 0,
        partition=partition.split(",")[0].strip() if isinstance(partition, str) else "",
        states=frozenset(str(s).upper() for s in states),
        reason=str(raw.get("state_reason") or "None"),
        node_count=max(1, number(raw.get("node_count")) or 1),
        nodes=str(raw.get("nodes") or ""),
        hold=raw.get("hold") is True,
        begin_time=number(raw.get("eligible_time")),
        tasks=array_tasks(raw) if "PENDING" in {str(s).upper() for s in states} else 1,
    )


@dataclass(frozen=True, slots=True)
class Demand:
    """The nodes one partition's work needs, and how it was counted."""

    partition: str
    running_nodes: int
    pending_nodes: int
    pending_jobs: int  # pending jobs (array tasks) counted in pending_nodes
    ignored: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def nodes(self) -> int:
        return self.running_nodes + self.pending_nodes

    def as_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "nodes": self.nodes,
            "runningNodes": self.running_nodes,
            "pendingNodes": self.pending_nodes,
            "pendingJobs": self.pending_jobs,
            "ignoredJobs": {why: self.ignored.get(why, 0) for why in IGNORED},
        }


def partition_max_nodes(partitions: Iterable[dict[str, Any]], name: str) -> int | None:
    """The partition's ``MaxNodes`` per job (None: unlimited);
    raise :class:`DemandError` if Slurm has no such partition."""
    for partition in partitions:
        if partition.get("name") == name:
            return number((partition.get("maximums") or {}).get("nodes"))
    raise DemandError(f"Slurm has no partition {name!r}")


def why_ignored(job: Job, max_nodes: int | None, pool_max: int | None, now: float) -> str | None:
    """Why a pending job does not count (one of :data:`IGNORED`), or None when it does."""
    if job.hold or job.reason in HELD_REASONS:
        return "held"
    if job.reason in DEPENDENCY_REASONS:
        return "dependency"
    if job.reason == "BeginTime" or (job.begin_time is not None and job.begin_time > now):
        return "begin_time"
    if any(limit is not None and job.node_count > limit for limit in (max_nodes, pool_max)):
        return "never_fits"
    if job.reason not in WAITING_FOR_NODES:
        return "blocked"
    return None


def node_demand(partition: str, jobs: Iterable[Job], max_nodes: int | None, pool_max: int | None, now: float) -> Demand:
    """Apply the rule to ``jobs`` for ``partition`` (``max_nodes``: its MaxNodes;
    ``pool_max``: the pool's maxReplicas)."""
    allocated: set[str] = set()
    pending_nodes = pending_jobs = 0
    ignored: Counter[str] = Counter()
    for job in jobs:
        if job.partition != partition:
            continue
        if job.running:
            allocated.update(expand_hostlist(job.nodes))
        elif job.pending:
            why = why_ignored(job, max_nodes, pool_max, now)
            if why is not None:
                ignored[why] += job.tasks
                continue
            pending_nodes += job.node_count * job.tasks
            pending_jobs += job.tasks
    return Demand(partition, len(allocated), pending_nodes, pending_jobs, MappingProxyType(dict(ignored)))
