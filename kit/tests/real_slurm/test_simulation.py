"""The seeded scale-in simulation against real Slurm 24.11: the figures docs/reliability.md quotes.

A pool of real hosts (slurmd in network namespaces, booted from injected metaData) under the
scaling webhook with safeScaleIn on real slurmrestd. Each event: real jobs arrive (``sbatch -N1``
or ``-N2 --wrap "sleep N"``, placed by Slurm), some held in COMPLETING by the Epilog; KEDA may
scale the mirror to 0..5; a reconcile pass may run; CAPI deletes and creates Machines, and powers
off the hosts of released ones. On fixed events: an administrator drains an idle node and a busy
one, a slurmd is killed (NOT_RESPONDING, then DOWN), slurmrestd is stopped for a stretch. The
choices come from ``random.Random(seed)``; what Slurm does with them (placement, timing) is
real, so two runs of one seed are alike, not identical.

Checked throughout: no host is powered off while a job process runs on it or Slurm lists a job
there; no admin drain is undone; nothing is released while slurmrestd is down. At the end every
job that ran must have COMPLETED (jobs killed = 0), apart from those the deliberate slurmd kill
hit, which are counted on their own; and every node SliMe let go is still a record in Slurm
(returned to FUTURE, the default ``releasedNodes``), none deleted. Each Machine here gets a new
host name, so those records are never taken again (a pool whose names never come back would use
``releasedNodes: delete``); they still count as nodes of the partition, so fewer jobs are refused
at submission.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from testbed.components.capi_sim import MIRROR
from testbed.components.slurm import Slurm, SlurmFailed
from testbed.framework.errors import WaitTimeout
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.wait import wait_for
from testbed.scenarios.slurm_pool import Pool, future_records

pytestmark = [pytest.mark.real_slurm, pytest.mark.timeout(900)]

SEED = int(os.environ.get("SLIME_REAL_SLURM_SEED", "20261122"))
EVENTS = int(os.environ.get("SLIME_REAL_SLURM_EVENTS", "40"))
ADMIN_IDLE_AT, ADMIN_BUSY_AT, CRASH_AT, OUTAGE = 6, 10, 14, (22, 28)
UNUSABLE = {"DRAIN", "DOWN", "NOT_RESPONDING"}


def metric(p: Pool, name: str) -> int:
    return int(p.scaling.metric(name) or 0)


@dataclass
class Simulation:
    """One seeded run over a pool: its choices (``rng``) and what it saw."""

    p: Pool
    rng: random.Random
    jobs: list[int] = field(default_factory=list)
    holds: dict[int, int] = field(default_factory=dict)  # job -> events its epilog still holds its node in COMPLETING
    held_jobs: set[int] = field(default_factory=set)
    admin: dict[str, str] = field(default_factory=dict)  # host -> the admin's drain reason
    crashed: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    undone: list[str] = field(default_factory=list)
    outage_releases: list[str] = field(default_factory=list)
    released_before: set[str] = field(default_factory=set)
    pending: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: {"scale_requests": 0, "scale_downs": 0, "scale_ups": 0, "jobs_rejected_at_submit": 0}
    )

    @property
    def slurm(self) -> Slurm:
        return self.p.slurm

    def look(self) -> dict[str, dict[str, Any]]:
        nodes = self.slurm.nodes()
        for host, node in nodes.items():
            self.seen.add("+".join(sorted(node["state"])))
            if host in self.admin and not ("DRAIN" in node["state"] and node["reason"].startswith(self.admin[host])):
                self.undone.append(f"{host}: {node['state']} {node['reason']!r}")
        return nodes

    def submit(self, width: int, seconds: int, *extra: str) -> int | None:
        try:
            job = self.slurm.sbatch("-N", str(width), *extra, "--wrap", f"sleep {seconds}")
        except SlurmFailed:  # fewer nodes in the partition than asked: Slurm 24.11 refuses at submission
            self.counts["jobs_rejected_at_submit"] += 1
            return None
        self.jobs.append(job)
        return job

    def _idle(self) -> list[str]:
        return [
            h
            for h, n in self.slurm.nodes().items()
            if set(n["state"]) == {"IDLE", "DYNAMIC_NORM"} and h not in self.admin and h not in self.crashed
        ]

    def idle_host(self, grow: bool) -> str | None:
        """An idle host nobody drained; with ``grow``, scale up by one for a fresh one when there is none."""
        candidates = self._idle()
        if not candidates and grow:
            self.counts["scale_requests"] += 1
            self.counts["scale_ups"] += 1
            self.p.scale(min(6, len(self.p.capi.live()) + 1))
            self.p.capi.step()
            candidates = self._idle()
        return self.rng.choice(sorted(candidates)) if candidates else None

    def arrivals(self) -> None:
        """Real jobs arrive; some will be held in COMPLETING by their epilog."""
        usable = [h for h, n in self.look().items() if not UNUSABLE & set(n["state"])]
        for _ in range(self.rng.choice([0, 1, 1, 2])):
            width = 2 if len(usable) >= 2 and self.rng.random() < 0.25 else 1
            job = self.submit(width, self.rng.randint(2, 12))
            if job is not None and self.rng.random() < 0.15:
                (self.slurm.shared / f"hold-epilog-{job}").touch()  # its epilog will hold its node in COMPLETING
                self.holds[job] = self.rng.randint(2, 4)  # for this many events once the job is COMPLETING
                self.held_jobs.add(job)
        if self.holds:
            states = self.slurm.jobs()
            for job in list(self.holds):
                state = states[job]["job_state"]
                if "COMPLETING" in state or state in (["COMPLETED"], ["CANCELLED"]):
                    self.holds[job] -= 1
                if self.holds[job] <= 0:
                    (self.slurm.shared / f"hold-epilog-{job}").unlink(missing_ok=True)
                    del self.holds[job]

    def disturbances(self, event: int) -> None:
        """The admin drains and the slurmd kill happen at their event, or at the first event after it when the pool
        allows them; three events late, a KEDA scale-up by one brings a fresh idle host for them."""
        if event >= ADMIN_IDLE_AT and "maintenance: firmware" not in self.admin.values():
            host = self.idle_host(event - ADMIN_IDLE_AT >= 3)
            if host:
                self.admin[host] = "maintenance: firmware"
                self.p.admin_drain(host, self.admin[host])
        if event >= ADMIN_BUSY_AT and "maintenance: disk swap" not in self.admin.values():
            host = self.idle_host(event - ADMIN_BUSY_AT >= 3)
            busy = self.submit(1, 30, "-w", host) if host else None
            if host and busy is not None and _runs(self.slurm, busy):
                self.admin[host] = "maintenance: disk swap"
                self.p.admin_drain(host, self.admin[host])  # DRAIN with a running job: "draining"
            elif busy is not None:  # Slurm kept the host for another job: try again later
                self.slurm.client(["scancel", str(busy)])
                self.jobs.remove(busy)
        if event >= CRASH_AT and not self.crashed:
            host = self.idle_host(event - CRASH_AT >= 3)
            if host:
                self.crash(host)

    def crash(self, host: str) -> None:
        machine = next(m for m, n in self.p.capi.hosts.items() if n.hostname == host)
        self.p.capi.hosts[machine].kill_slurmd(signal.SIGKILL)
        self.crashed.add(host)
        # slurmctld notices at its next ping (SlurmdTimeout 10 s here): wait for it, so the
        # scale-ins after this see NOT_RESPONDING (and later DOWN), not a node that merely looks idle.
        wait_for(
            lambda: "NOT_RESPONDING" in self.look().get(host, {}).get("state", ["NOT_RESPONDING"]),
            60,
            f"slurmctld to mark {host} NOT_RESPONDING",
            interval=0.5,
        )

    def outage(self, event: int) -> None:
        if event == OUTAGE[0]:
            self.slurm.stop_restd()
            # Released (hook removed) before the outage, by a pass that ran just before it: CAPI may still act on those.
            self.released_before = {
                m["metadata"]["name"]
                for m in self.p.capi.machines()
                if m["metadata"].get("deletionTimestamp") and not self.p.capi.held(m["metadata"]["name"])
            }
        if event == OUTAGE[1]:
            self.slurm.start_restd()

    def mirror(self) -> int:
        replicas: int = self.p.site.emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, MIRROR)["spec"]["replicas"]
        return replicas

    def scaling(self, event: int) -> None:
        """KEDA may scale the mirror, a reconcile pass may run, CAPI acts."""
        if self.rng.random() < 0.7:
            target = self.rng.randint(0, 5)
            current = self.mirror()
            self.counts["scale_requests"] += 1
            self.counts["scale_downs" if target < current else "scale_ups"] += target != current
            self.look()  # what Slurm shows just before the webhook acts
            self.p.scale(target)
        if self.rng.random() < 0.3:
            self.p.reconcile()
        released = self.p.capi.step()
        if OUTAGE[0] <= event < OUTAGE[1]:
            self.outage_releases += [m for m in released if m not in self.released_before]

    def run(self) -> None:
        for event in range(EVENTS):
            self.arrivals()
            self.disturbances(event)
            self.outage(event)
            self.scaling(event)
            time.sleep(0.3)

    def converged(self) -> bool:
        self.p.reconcile()
        self.p.capi.step()
        deleting = any(m["metadata"].get("deletionTimestamp") for m in self.p.capi.machines())
        return self.p.replicas() == self.mirror() == len(self.p.capi.live()) and not deleting

    def end(self) -> None:
        """Epilogs released, jobs run out, pending ones cancelled (they never ran), the pool converges."""
        for job in list(self.holds):
            (self.slurm.shared / f"hold-epilog-{job}").unlink(missing_ok=True)
        self.look()
        running = lambda: [j for j, r in self.slurm.jobs().items() if set(r["job_state"]) & {"RUNNING", "COMPLETING"}]  # noqa: E731
        wait_for(lambda: not running(), 120, "every running job to end")
        self.pending = [j for j, r in self.slurm.jobs().items() if r["job_state"] == ["PENDING"]]
        if self.pending:
            self.slurm.client(["scancel", *map(str, self.pending)])
        p = self.p
        wait_for(
            self.converged,
            90,
            "the pool to converge",
            interval=0.5,
            diagnostics=lambda: f"mirror {self.mirror()}, MachineDeployment {p.replicas()}, live {len(p.capi.live())}",
        )
        self.look()

    def figures(self, seconds: float) -> tuple[dict[str, Any], list[str]]:
        """The run's figures, and the jobs it killed."""
        p, slurm, jobs = self.p, self.slurm, self.jobs
        final = slurm.jobs()
        log = slurm.logs()["slurmctld.log"]
        crashed = self.crashed
        hit = {int(j) for j, node in re.findall(r"JobId=(\d+) due to failure of node (\S+)", log) if node in crashed}
        hit |= {j for j in jobs if set(slurm.hostnames(final[j].get("nodes") or "")) & crashed}
        cost = lambda j: final[j]["job_state"] != ["COMPLETED"] or (final[j].get("restart_cnt") or 0) > 0  # noqa: E731
        hit = {j for j in hit if cost(j)}  # those it cost something
        killed = [
            f"{j}: {final[j]['job_state']} restarts {final[j].get('restart_cnt')}"
            for j in jobs
            if j not in self.pending and j not in hit and cost(j)
        ]
        result = {
            "seed": SEED,
            "events": EVENTS,
            "seconds": round(seconds, 1),
            **self.counts,
            "victims": metric(p, "slime_scaling_scale_in_victims_total"),
            "deferred_scale_ins": len(p.events("ScaleInDeferred")),  # scale-downs (admission or reconcile) deferring
            "replicas_deferred": metric(p, "slime_scaling_scale_in_deferred_total"),  # summed over those
            "reclaimed": metric(p, "slime_scaling_reclaimed_total"),
            "slurm_errors": metric(p, "slime_scaling_slurm_errors_total"),
            "nodes_returned_to_future": len(p.events("SlurmNodeReturnedToFuture")),  # released, the record kept
            "nodes_deleted_in_slurm": len(p.events("SlurmNodeDeleted")),  # only with releasedNodes: delete
            "future_records_at_the_end": len(future_records(slurm)),
            "machines_released": len(p.capi.removed),
            "hosts_booted": p.capi.counter,
            "jobs_submitted": len(jobs),
            "jobs_completed": sum(final[j]["job_state"] == ["COMPLETED"] for j in jobs),
            "jobs_held_in_completing_by_the_epilog": len(self.held_jobs),
            "jobs_cancelled_while_pending": len(set(self.pending)),
            "jobs_hit_by_the_killed_slurmd": len(hit),
            "jobs_hit_by_the_killed_slurmd_ended": sorted(
                f"{'+'.join(final[j]['job_state'])} after {final[j].get('restart_cnt') or 0} requeue(s)" for j in hit
            ),
            "jobs_killed": len(killed),
            "busy_hosts_released": len(p.capi.violations),
            "admin_drains": len(self.admin),
            "admin_drains_undone": len(self.undone),
            "releases_while_slurmrestd_down": len(self.outage_releases),
            "node_states_seen": sorted(self.seen),
        }
        return result, killed


def test_seeded_scale_in_simulation_with_real_jobs(pool: Callable[..., Pool], figures: dict[str, Any]) -> None:
    started = time.monotonic()
    sim = Simulation(pool(3), random.Random(SEED))
    sim.run()
    sim.end()
    result, killed = sim.figures(time.monotonic() - started)
    figures["scale_in_simulation"] = result
    p, seen, slurm = sim.p, sim.seen, sim.slurm
    assert killed == [], killed
    assert p.capi.violations == [], p.capi.violations
    assert sim.undone == [], sim.undone
    assert sim.outage_releases == [], sim.outage_releases
    assert len(sim.admin) == 2 and sim.crashed, (sim.admin, sim.crashed)
    assert result["victims"] > 0 and result["machines_released"] > 0
    assert result["nodes_returned_to_future"] > 0 and result["nodes_deleted_in_slurm"] == 0
    # Every node let go is still a record: the hosts of released Machines that had joined (each name once).
    gone = {p.capi.assigned[m] for m in p.capi.removed}
    assert set(future_records(slurm)) <= gone and len(future_records(slurm)) == result["nodes_returned_to_future"]
    for state in ("DYNAMIC_NORM", "COMPLETING", "NOT_RESPONDING", "DRAIN"):
        assert any(state in s.split("+") for s in seen), f"{state} never seen: {sorted(seen)}"
    assert any({"DRAIN", "MIXED"} <= set(s.split("+")) or {"DRAIN", "ALLOCATED"} <= set(s.split("+")) for s in seen), (
        sorted(seen)
    )


def _runs(slurm: Slurm, job: int, timeout: float = 10.0) -> bool:
    try:
        return wait_for(
            lambda: slurm.jobs()[job]["job_state"] == ["RUNNING"], timeout, f"job {job} to run", interval=0.2
        )
    except WaitTimeout:
        return False
