"""Scale-in never costs a node by accident: the figures docs/reliability.md quotes (issue "Never cost a node").

- A mapping added over a live pool of 5 (the chart's mirror defaults to 1): the pool stays at 5.
- Two replicas behind one admission route, 100 mirror scales up and down with jobs arriving and
  ending and CAPI deleting marked Machines: no Machine is marked twice, victims never exceed what
  the replicas removed, no busy node is released, and only the Lease holder writes.
- slurmrestd down for longer than any drain timeout: no hook is released on a busy node.
- Administrators drain idle nodes during the simulation: no admin drain is undone.
- The seeded simulation with every API call 40 ms slower, over 10 seeds: 0 jobs killed.

They run on kubemu and the fake slurmrestd (which answers as real slurmrestd 24.11 does); the
same scenario against real Slurm is in kit/tests/real_slurm/.
"""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from common.names import DELETE_MACHINE_ANNOTATION
from kubemu import Emulator, Fault
from testbed.components.capi_sim import JWT_KEY, JWT_NS, MD, MD_NS, MIRROR, CapiSim, PoolInvariant, safe_config_map
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.services import ScaleWebhookRoute, Scaling
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment, mirror
from testbed.framework.wait import wait_for
from testbed.framework.world import make_jwt_key, md_replicas, scale_mirror
from testbed.scenarios.reliability import Services
from testbed.scenarios.site import JWT_SECRET

QUICK_LEASE = {"lease_duration_seconds": 3, "lease_renew_deadline_seconds": 2, "lease_retry_seconds": 0.5}


def seed_pool(emulator: Emulator, slurm: FakeSlurmrestd, key: bytes, replicas: int, **safe: Any) -> CapiSim:
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": JWT_SECRET, "namespace": JWT_NS},
            "type": "Opaque",
            "data": {JWT_KEY: base64.b64encode(key).decode()},
        }
    )
    emulator.create(mirror(MIRROR, replicas=replicas, adopted_from=f"{MD_NS}/{MD}"))
    emulator.create(machine_deployment(MD, MD_NS, replicas=replicas))
    emulator.create(safe_config_map(slurm.url, **safe))
    capi = CapiSim(emulator, slurm=slurm)
    for _ in range(replicas):
        capi.add_machine()
    return capi


def churn_jobs(rng: random.Random, slurm: FakeSlurmrestd) -> None:
    for name, node in list(slurm.nodes.items()):
        if node.jobs and rng.random() < 0.4:
            slurm.finish_jobs(name)
        elif not node.jobs and not node.drain and rng.random() < 0.4:
            slurm.start_job(name, time.time() + rng.randint(10, 1000))


@pytest.mark.slow
def test_a_mapping_added_over_a_live_pool_keeps_it(
    emulator: Emulator, services: Services, figures: dict[str, Any]
) -> None:
    emulator.create(machine_deployment("md-live", "metal3", replicas=5))
    emulator.create(mirror("mirror-live", replicas=None))  # as the chart renders it: the API server makes it 1
    services.scaling(emulator)
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "scaling-webhook-configmap", "namespace": SLIME_NAMESPACE},
            "data": {
                "mappings": "- {mirror: slime-system/mirror-live, machineDeployment: metal3/md-live, maxReplicas: 100}"
            },
        }
    )
    wait_for(
        lambda: emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-live")["spec"]["replicas"] == 5,
        10,
        "adoption",
    )
    time.sleep(0.5)
    assert md_replicas(emulator, "metal3", "md-live") == 5
    figures["mapping_added_over_a_live_pool"] = {
        "pool_before": 5,
        "mirror_created_at": 1,
        "pool_after": 5,
        "mirror_after": 5,
    }


@pytest.mark.slow
def test_two_replicas_racing_scale_downs_mark_no_double_victim_and_release_no_busy_node(
    emulator_factory: Callable[..., Emulator], services: Services, figures: dict[str, Any]
) -> None:
    route = ScaleWebhookRoute()
    emulator = emulator_factory(admission=route)
    key = make_jwt_key()
    slurm = FakeSlurmrestd(key)
    try:
        capi = seed_pool(emulator, slurm, key, 6)
        invariant = PoolInvariant(emulator).install()
        replicas = [services.scaling(emulator, **QUICK_LEASE), services.scaling(emulator, **QUICK_LEASE)]
        for replica in replicas:
            route.add(replica)
        wait_for(
            lambda: sum(bool(r.service.leader and r.service.leader.is_leader) for r in replicas) == 1, 10, "one leader"
        )
        rng = random.Random(20261122)
        double, over_marked, downs = 0, 0, 0
        for _ in range(100):
            churn_jobs(rng, slurm)
            target = rng.randint(0, 8)
            current = md_replicas(emulator, MD_NS, MD) or 0
            downs += target < current
            scale_mirror(emulator, SLIME_NAMESPACE, MIRROR, target)
            for replica in replicas:  # both replicas run a pass now, racing on the same stored state
                replica.service.reconcile_once()
            marked = [
                m
                for m in capi.machines()
                if (m["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION)
                and not m["metadata"].get("deletionTimestamp")
            ]
            live = [m for m in capi.machines() if not m["metadata"].get("deletionTimestamp")]
            names = [m["metadata"]["name"] for m in marked]
            double += len(names) - len(set(names))
            over_marked += max(0, len(marked) - max(0, len(live) - (md_replicas(emulator, MD_NS, MD) or 0)))
            capi.step()
        writes = [int(r.metric("slime_scaling_scale_in_victims_total") or 0) for r in replicas]
    finally:
        slurm.stop()
    # Marks the replicas do not account for yet are victims for Machines still being created (the rule: never
    # fewer replicas than Machines that exist or are being created, minus the marked); they are taken back once
    # the replicas leave room for them. The rule itself held at every write:
    assert double == 0 and invariant.broken == []
    assert capi.violations == [] and slurm.violations == []
    assert sorted(writes)[0] == 0, f"only the Lease holder marks victims: {writes}"
    figures["two_replicas_racing_scale_downs"] = {
        "scales": 100,
        "scale_downs": downs,
        "double_victims": double,
        "victims_marked_for_machines_being_created": over_marked,
        "writes_breaking_the_rule": len(invariant.broken),
        "busy_nodes_released": len(capi.violations),
        "victims_marked_by_replica": sorted(writes, reverse=True),
    }


@pytest.mark.slow
def test_slurmrestd_down_longer_than_any_timeout_releases_no_busy_node(
    emulator: Emulator, services: Services, figures: dict[str, Any]
) -> None:
    key = make_jwt_key()
    slurm = FakeSlurmrestd(key)
    capi = seed_pool(emulator, slurm, key, 3, drainTimeoutSeconds=1)
    scaling = services.scaling(emulator)
    for node in ("node-001", "node-002", "node-003"):
        slurm.start_job(node, time.time() + 3600)
    for name in ("md-001", "md-002"):
        emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, name)  # deleted by someone: held by the hook
    scaling.reconcile()
    slurm.stop()
    passes = 0
    deadline = time.monotonic() + 3.5  # well past drainTimeoutSeconds
    while time.monotonic() < deadline:
        scaling.reconcile()
        capi.step()
        passes += 1
    held = [m["metadata"]["name"] for m in capi.machines() if m["metadata"].get("deletionTimestamp")]
    assert held == ["md-001", "md-002"] and capi.violations == []
    figures["slurmrestd_down_past_drain_timeout"] = {
        "busy_held_machines": 2,
        "drain_timeout_s": 1,
        "down_for_s": 3.5,
        "reconcile_passes": passes,
        "hooks_released_on_busy_nodes": 0,
    }


def simulate(
    emulator: Emulator, scaling: Scaling, capi: CapiSim, slurm: FakeSlurmrestd, seed: int, events: int
) -> dict[str, int]:
    """Jobs arrive and end, the mirror moves, admins drain idle nodes, CAPI acts: the counts that must stay 0."""
    rng = random.Random(seed)
    admin: set[str] = set()
    for _ in range(events):
        churn_jobs(rng, slurm)
        idle = [n for n, node in slurm.nodes.items() if not node.jobs and not node.drain]
        if idle and rng.random() < 0.15:
            node = rng.choice(idle)
            slurm.admin_drain(node, f"maintenance: seed {seed}")
            admin.add(node)
        scale_mirror(emulator, SLIME_NAMESPACE, MIRROR, rng.randint(0, 6))
        scaling.reconcile()
        capi.step()
    undone = sum(
        1
        for name in admin
        if name in slurm.nodes
        and (not slurm.nodes[name].drain or not slurm.nodes[name].reason.startswith("maintenance"))
    )
    return {
        "jobs_killed": len(capi.violations),
        "busy_deletes": len(slurm.violations),
        "admin_drains": len(admin),
        "admin_drains_undone": undone,
        "victims": int(scaling.metric("slime_scaling_scale_in_victims_total") or 0),
    }


@pytest.mark.slow
def test_the_seeded_simulation_with_a_slow_api_kills_no_job(
    emulator_factory: Callable[..., Emulator], services: Services, figures: dict[str, Any]
) -> None:
    seeds = list(range(1, 11))

    def one_seed(seed: int) -> dict[str, int]:
        emulator = emulator_factory()
        key = make_jwt_key()
        slurm = FakeSlurmrestd(key)
        try:
            capi = seed_pool(emulator, slurm, key, 4)
            scaling = services.scaling(emulator)
            emulator.add_fault(Fault(path_regex=r".", delay_seconds=0.04))  # every API call 40 ms slower
            return simulate(emulator, scaling, capi, slurm, seed, events=12)
        finally:
            slurm.stop()

    started = time.monotonic()
    # Each seed has its own emulator, slurmrestd and service, and spends most of its time waiting on the slow
    # API: five at a time took about a quarter of the wall time (35 s -> 9 s here) for the same CPU.
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(one_seed, seeds))
    totals = {name: sum(result[name] for result in results) for name in results[0]}
    assert totals["jobs_killed"] == 0 and totals["busy_deletes"] == 0
    assert totals["admin_drains_undone"] == 0 and totals["admin_drains"] > 0
    figures["scale_in_simulation_slow_api"] = {
        "seeds": len(seeds),
        "events_per_seed": 12,
        "api_delay_ms": 40,
        "seconds": round(time.monotonic() - started, 1),
        **totals,
    }
