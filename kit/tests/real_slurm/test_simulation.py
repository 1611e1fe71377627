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
from typing import Any

import pytest

from testbed.components.capi_sim import MIRROR
from testbed.components.slurm import SlurmFailed
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


def test_seeded_scale_in_simulation_with_real_jobs(pool: Callable[..., Pool], figures: dict[str, Any]) -> None:
    rng = random.Random(SEED)
    p = pool(3)
    slurm = p.slurm
    started = time.monotonic()
    jobs: list[int] = []
    holds: dict[int, int] = {}  # job -> events its epilog still holds its node in COMPLETING
    held_jobs: set[int] = set()
    admin: dict[str, str] = {}  # host -> the admin's drain reason
    crashed: set[str] = set()
    seen: set[str] = set()
    undone: list[str] = []
    outage_releases: list[str] = []
    released_before: set[str] = set()
    counts = {"scale_requests": 0, "scale_downs": 0, "scale_ups": 0, "jobs_rejected_at_submit": 0}

    def look() -> dict[str, dict[str, Any]]:
        nodes = slurm.nodes()
        for host, node in nodes.items():
            seen.add("+".join(sorted(node["state"])))
            if host in admin and not ("DRAIN" in node["state"] and node["reason"].startswith(admin[host])):
                undone.append(f"{host}: {node['state']} {node['reason']!r}")
        return nodes

    def submit(width: int, seconds: int, *extra: str) -> int | None:
        try:
            job = slurm.sbatch("-N", str(width), *extra, "--wrap", f"sleep {seconds}")
        except SlurmFailed:  # fewer nodes in the partition than asked: Slurm 24.11 refuses at submission
            counts["jobs_rejected_at_submit"] += 1
            return None
        jobs.append(job)
        return job

    def idle_host(grow: bool) -> str | None:
        """An idle host nobody drained; with ``grow``, scale up by one for a fresh one when there is none."""
        nodes = slurm.nodes()
        candidates = [
            h
            for h, n in nodes.items()
            if set(n["state"]) == {"IDLE", "DYNAMIC_NORM"} and h not in admin and h not in crashed
        ]
        if not candidates and grow:
            counts["scale_requests"] += 1
            counts["scale_ups"] += 1
            p.scale(min(6, len(p.capi.live()) + 1))
            p.capi.step()
            nodes = slurm.nodes()
            candidates = [
                h
                for h, n in nodes.items()
                if set(n["state"]) == {"IDLE", "DYNAMIC_NORM"} and h not in admin and h not in crashed
            ]
        return rng.choice(sorted(candidates)) if candidates else None

    for event in range(EVENTS):
        nodes = look()
        usable = [h for h, n in nodes.items() if not UNUSABLE & set(n["state"])]
        for _ in range(rng.choice([0, 1, 1, 2])):
            width = 2 if len(usable) >= 2 and rng.random() < 0.25 else 1
            job = submit(width, rng.randint(2, 12))
            if job is not None and rng.random() < 0.15:
                (slurm.shared / f"hold-epilog-{job}").touch()  # its epilog will hold its node in COMPLETING
                holds[job] = rng.randint(2, 4)  # for this many events once the job is COMPLETING
                held_jobs.add(job)
        if holds:
            states = slurm.jobs()
            for job in list(holds):
                if "COMPLETING" in states[job]["job_state"] or states[job]["job_state"] in (
                    ["COMPLETED"],
                    ["CANCELLED"],
                ):
                    holds[job] -= 1
                if holds[job] <= 0:
                    (slurm.shared / f"hold-epilog-{job}").unlink(missing_ok=True)
                    del holds[job]
        # The disturbances happen at their event, or at the first event after it when the pool allows them;
        # three events late, a KEDA scale-up by one brings a fresh idle host for them.
        if event >= ADMIN_IDLE_AT and "maintenance: firmware" not in admin.values():
            host = idle_host(event - ADMIN_IDLE_AT >= 3)
            if host:
                admin[host] = "maintenance: firmware"
                p.admin_drain(host, admin[host])
        if event >= ADMIN_BUSY_AT and "maintenance: disk swap" not in admin.values():
            host = idle_host(event - ADMIN_BUSY_AT >= 3)
            busy = submit(1, 30, "-w", host) if host else None
            if host and busy is not None and _runs(slurm, busy):
                admin[host] = "maintenance: disk swap"
                p.admin_drain(host, admin[host])  # DRAIN with a running job: "draining"
            elif busy is not None:  # Slurm kept the host for another job: try again later
                slurm.client(["scancel", str(busy)])
                jobs.remove(busy)
        if event >= CRASH_AT and not crashed:
            host = idle_host(event - CRASH_AT >= 3)
            if host:
                machine = next(m for m, n in p.capi.hosts.items() if n.hostname == host)
                p.capi.hosts[machine].kill_slurmd(signal.SIGKILL)
                crashed.add(host)
                # slurmctld notices at its next ping (SlurmdTimeout 10 s here): wait for it, so the
                # scale-ins after this see NOT_RESPONDING (and later DOWN), not a node that merely looks idle.
                wait_for(
                    lambda h=host: "NOT_RESPONDING" in look().get(h, {}).get("state", ["NOT_RESPONDING"]),
                    60,
                    f"slurmctld to mark {host} NOT_RESPONDING",
                    interval=0.5,
                )
        if event == OUTAGE[0]:
            slurm.stop_restd()
            # Released (hook removed) before the outage, by a pass that ran just before it: CAPI may still act on those.
            released_before = {
                m["metadata"]["name"]
                for m in p.capi.machines()
                if m["metadata"].get("deletionTimestamp") and not p.capi.held(m["metadata"]["name"])
            }
        if event == OUTAGE[1]:
            slurm.start_restd()
        if rng.random() < 0.7:
            target = rng.randint(0, 5)
            current = p.site.emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, MIRROR)["spec"]["replicas"]
            counts["scale_requests"] += 1
            counts["scale_downs" if target < current else "scale_ups"] += target != current
            look()  # what Slurm shows just before the webhook acts
            p.scale(target)
        if rng.random() < 0.3:
            p.reconcile()
        released = p.capi.step()
        if OUTAGE[0] <= event < OUTAGE[1]:
            outage_releases += [m for m in released if m not in released_before]
        time.sleep(0.3)

    # The end: epilogs released, jobs run out, pending ones cancelled (they never ran), the pool converges.
    for job in list(holds):
        (slurm.shared / f"hold-epilog-{job}").unlink(missing_ok=True)
    look()
    running = lambda: [j for j, r in slurm.jobs().items() if set(r["job_state"]) & {"RUNNING", "COMPLETING"}]  # noqa: E731
    wait_for(lambda: not running(), 120, "every running job to end")
    pending = [j for j, r in slurm.jobs().items() if r["job_state"] == ["PENDING"]]
    if pending:
        slurm.client(["scancel", *map(str, pending)])
    deadline = time.monotonic() + 90
    while True:
        p.reconcile()
        p.capi.step()
        mirror = p.site.emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, MIRROR)["spec"]["replicas"]
        if p.replicas() == mirror == len(p.capi.live()) and not any(
            m["metadata"].get("deletionTimestamp") for m in p.capi.machines()
        ):
            break
        assert time.monotonic() < deadline, (
            f"no convergence: mirror {mirror}, MachineDeployment {p.replicas()}, live {len(p.capi.live())}"
        )
        time.sleep(0.5)
    look()

    final = slurm.jobs()
    log = slurm.logs()["slurmctld.log"]
    hit = {int(j) for j, node in re.findall(r"JobId=(\d+) due to failure of node (\S+)", log) if node in crashed}
    hit |= {j for j in jobs if set(slurm.hostnames(final[j].get("nodes") or "")) & crashed}
    hit = {
        j for j in hit if final[j]["job_state"] != ["COMPLETED"] or (final[j].get("restart_cnt") or 0) > 0
    }  # those it cost something
    cancelled_pending = set(pending)
    killed = [
        f"{j}: {final[j]['job_state']} restarts {final[j].get('restart_cnt')}"
        for j in jobs
        if j not in cancelled_pending
        and j not in hit
        and (final[j]["job_state"] != ["COMPLETED"] or (final[j].get("restart_cnt") or 0) > 0)
    ]
    result = {
        "seed": SEED,
        "events": EVENTS,
        "seconds": round(time.monotonic() - started, 1),
        **counts,
        "victims": metric(p, "slime_scaling_scale_in_victims_total"),
        "deferred_scale_ins": len(
            p.events("ScaleInDeferred")
        ),  # scale-downs (admission or reconcile) that deferred replicas
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
        "jobs_held_in_completing_by_the_epilog": len(held_jobs),
        "jobs_cancelled_while_pending": len(cancelled_pending),
        "jobs_hit_by_the_killed_slurmd": len(hit),
        "jobs_hit_by_the_killed_slurmd_ended": sorted(
            f"{'+'.join(final[j]['job_state'])} after {final[j].get('restart_cnt') or 0} requeue(s)" for j in hit
        ),
        "jobs_killed": len(killed),
        "busy_hosts_released": len(p.capi.violations),
        "admin_drains": len(admin),
        "admin_drains_undone": len(undone),
        "releases_while_slurmrestd_down": len(outage_releases),
        "node_states_seen": sorted(seen),
    }
    figures["scale_in_simulation"] = result
    assert killed == [], killed
    assert p.capi.violations == [], p.capi.violations
    assert undone == [], undone
    assert outage_releases == [], outage_releases
    assert len(admin) == 2 and crashed, (admin, crashed)
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


def _runs(slurm: Any, job: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if slurm.jobs()[job]["job_state"] == ["RUNNING"]:
            return True
        time.sleep(0.2)
    return False
