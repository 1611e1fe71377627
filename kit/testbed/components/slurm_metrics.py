"""A stand-in for Slurm >= 25.11's own ``/metrics/partitions`` endpoint, fed by a real Slurm 24.11.

Slurm 25.11 serves OpenMetrics itself (slurmctld's HTTP listener, ``metrics/openmetrics``
plugin); 24.11, the Slurm Debian ships and the tiers run, has no such plugin. So this module
reads the real 24.11 state through slurmrestd (``GET jobs``, ``GET partitions``, with an HS256
JWT as Slinky signs it) on every scrape, and answers in exactly the text Slurm 25.11 writes for
the partition metrics it serves, read from SchedMD's slurm-25.11 branch:

- names and ``# HELP`` texts: ``src/plugins/metrics/openmetrics/openmetrics.c``
  (``metrics_p_parse_parts_metrics``, ``_part_stats_to_metric``: ``slurm_partitions``, then per
  partition ``slurm_partition_jobs``, ``_jobs_hold``, ``_jobs_pending``, ``_jobs_running``, ...);
- layout: ``# HELP <name> <desc>``, ``# TYPE <name> gauge``, then ``<name>{partition="<p>"} <n>``
  for every partition, metric by metric in the order they were added (``_dump_metrics_from_list``
  over a uthash, which walks in insertion order); no ``# EOF``; ``Content-Type: text/plain``
  (``src/slurmctld/http.c``, ``_send_metrics_resp``); every partition appears, with zeros;
- counting: ``src/slurmctld/statistics.c`` (``_statistics_part_aggregate_job``): a job counts in
  the partition its ``partition`` names (the first of a list, as the job's ``part_ptr``);
  ``pending`` adds the array tasks a pending record stands for (``task_cnt``), ``hold`` does too
  when the reason is ``JobHeldAdmin``/``JobHeldUser``; ``running`` counts records whose base state
  is ``RUNNING``; ``jobs`` counts records not yet finished (base state ``PENDING``, ``RUNNING`` or
  ``SUSPENDED``).

Only these five metrics are served (the node, CPU and memory ones of 25.11 are left out: SliMe's
query reads ``slurm_partition_jobs_pending`` and ``_running``). :func:`render` is the pure part;
:class:`SlurmMetrics` serves it on 127.0.0.1 (path ``/metrics/partitions``, 25.11's). It reads
slurmrestd with the newest data parser it serves (:data:`API_VERSIONS`, probed once through
``/ping`` unless ``api_version`` is given): v0.0.42 for 24.11, v0.0.45 for 26.05, v0.0.46 for
26.11, which no longer serves v0.0.42. The job fields it reads are the same in all of them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt

from testbed.framework.errors import ComponentFailed
from testbed.framework.httpserve import Answer, LoopbackServer, Request

# Newest first: 26.11, 26.05, 25.11, 25.05, 24.11's newest data parsers.
API_VERSIONS = ("v0.0.46", "v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42")
PATH = "/metrics/partitions"
# (name, count, HELP text) in the order Slurm 25.11 adds them; slurm_partitions comes first.
PARTITION_METRICS = (
    ("slurm_partition_jobs", "jobs", "Number of jobs in this partition"),
    ("slurm_partition_jobs_hold", "hold", "Number of jobs in Hold state"),
    ("slurm_partition_jobs_pending", "pending", "Number of jobs in Pending state"),
    ("slurm_partition_jobs_running", "running", "Number of jobs in Running state"),
)
HELD = frozenset({"JobHeldAdmin", "JobHeldUser"})  # WAIT_HELD, WAIT_HELD_USER
NOT_FINISHED = frozenset({"PENDING", "RUNNING", "SUSPENDED"})


def _task_count(job: Mapping[str, Any]) -> int:
    """``task_cnt`` of a pending array record (the tasks of ``array_task_string``, ``%`` limit ignored), else 1."""
    text = job.get("array_task_string")
    if not isinstance(text, str) or not text.strip():
        return 1
    count = 0
    for part in text.split("%")[0].split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not match:
            return 1
        low, high, step = int(match.group(1)), int(match.group(2) or match.group(1)), int(match.group(3) or 1)
        count += (high - low) // max(step, 1) + 1
    return max(count, 1)


def partition_counts(jobs: Iterable[Mapping[str, Any]], partitions: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per partition: ``jobs``, ``hold``, ``pending``, ``running``, counted as slurmctld 25.11 counts them."""
    counts = {name: {"jobs": 0, "hold": 0, "pending": 0, "running": 0} for name in partitions}
    for job in jobs:
        states = job.get("job_state") or []
        base = (states[0] if isinstance(states, list) and states else str(states)).upper()
        partition = str(job.get("partition") or "").split(",")[0].strip()
        found = counts.get(partition)
        if found is None:
            continue
        if base == "PENDING":
            tasks = _task_count(job)
            found["pending"] += tasks
            if job.get("state_reason") in HELD:
                found["hold"] += tasks
        if base == "RUNNING":
            found["running"] += 1
        if base in NOT_FINISHED:
            found["jobs"] += 1
    return counts


def render(counts: Mapping[str, Mapping[str, int]]) -> str:
    """The text of 25.11's ``/metrics/partitions`` for these counts (partitions in Slurm's order)."""
    lines = [
        "# HELP slurm_partitions Total number of partitions",
        "# TYPE slurm_partitions gauge",
        f"slurm_partitions {len(counts)}",
    ]
    for name, key, desc in PARTITION_METRICS:
        lines += [f"# HELP {name} {desc}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{partition="{partition}"}} {values[key]}' for partition, values in counts.items()]
    return "\n".join(lines) + "\n"


@dataclass
class SlurmMetrics:
    """Serves :func:`render` of the live Slurm state on ``127.0.0.1:<port>/metrics/partitions``."""

    restd_url: str  # http://127.0.0.1:<port>
    jwt_key: bytes = field(repr=False)
    user: str = "slurm"
    api_version: str | None = None  # None: the newest of API_VERSIONS slurmrestd serves (probed on the first read)
    scrapes: int = 0
    errors: list[str] = field(default_factory=list)
    _server: LoopbackServer | None = field(default=None, repr=False)

    def read(self) -> str:
        now = int(time.time())
        token = jwt.encode({"sun": self.user, "iat": now, "exp": now + 60}, self.jwt_key, algorithm="HS256")
        headers = {"X-SLURM-USER-TOKEN": token}
        with httpx.Client(base_url=self.restd_url, headers=headers, timeout=10) as client:
            version = self.api_version or self._probe(client)
            jobs = client.get(f"/slurm/{version}/jobs/")
            parts = client.get(f"/slurm/{version}/partitions/")
        for answer in (jobs, parts):
            if answer.status_code != 200:
                raise ComponentFailed(f"slurmrestd {answer.request.url.path} answered {answer.status_code}")
        names = [str(p["name"]) for p in parts.json().get("partitions") or []]
        return render(partition_counts(jobs.json().get("jobs") or [], names))

    def _probe(self, client: httpx.Client) -> str:
        for version in API_VERSIONS:
            if client.get(f"/slurm/{version}/ping/").status_code == 200:  # an unserved version's URL: 404
                self.api_version = version
                return version
        raise ComponentFailed(f"slurmrestd {self.restd_url} serves none of {', '.join(API_VERSIONS)}")

    def start(self) -> SlurmMetrics:
        self._server = LoopbackServer(self._respond, name="slurm-metrics")
        return self

    def _respond(self, request: Request) -> Answer:
        if request.method != "GET" or request.path.split("?")[0] != PATH:
            return 404, "not found\n"
        try:
            body = self.read()
        except (httpx.HTTPError, ComponentFailed, ValueError) as exc:
            self.errors.append(str(exc))
            return 500, f"{exc}\n"  # Prometheus marks the scrape failed: no stale numbers
        self.scrapes += 1
        return 200, body

    @property
    def address(self) -> str:
        assert self._server is not None, "not started"
        return f"127.0.0.1:{self._server.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
