"""Machine health through the running scaling webhook, on kubemu, with the CAPI stand-in and a fake slurmrestd.

Hosts that never register and nodes slurmctld lost are reported (condition, Event, metric) once past
their timeout; with ``remediate: true`` they are deleted and their MachineSet makes new ones that
join, the pool keeping its size. What a person set, and a node that runs a job, are never touched;
more unhealthy Machines than ``maxUnhealthy`` (a site-wide outage) remediate nothing; an outage of
Slurm itself judges nothing. Time is never waited for: the Machines' provisioning times and Slurm's
reason times are set in the past, as a host that has been broken for a while shows them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from common.names import (
    HEALTH_CONDITION,
    REASON_NODE_HEALTHY,
    REASON_NODE_UNHEALTHY,
    REASON_REMEDIATED,
    REASON_SHORT_CIRCUIT,
    REMEDIATED_ANNOTATION,
)
from testbed.components.capi_sim import MD, MD_NS, MIRROR, Env, pool_config_map
from testbed.components.services import Scaling
from testbed.framework.objects import CAPI, SLIME_NAMESPACE
from testbed.framework.wait import wait_for
from testbed.framework.world import md_events, md_replicas

HOUR = 3600.0


def start(e: Env, slurm_health: dict[str, Any], safe_scale_in: dict[str, Any] | None = None) -> Scaling:
    e.emulator.create(pool_config_map(e.slurm.url, safe_scale_in=safe_scale_in, slurm_health=slurm_health))
    return e.started()


def condition(e: Env, machine: str) -> dict[str, Any] | None:
    found = e.capi.machine(machine)
    for entry in ((found or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == HEALTH_CONDITION:
            return entry
    return None


def machine_events(e: Env, machine: str, reason: str) -> list[dict[str, Any]]:
    return [
        event
        for event in e.emulator.list("v1", "Event", MD_NS)
        if event["involvedObject"].get("kind") == "Machine"
        and event["involvedObject"].get("name") == machine
        and event["reason"] == reason
    ]


def unhealthy(scaling: Scaling, reason: str) -> float | None:
    return scaling.metric("slime_scaling_unhealthy_machines", f'mapping="{MD_NS}/{MD}",reason="{reason}"')


def never_registered(e: Env, machine: str, ago: float = HOUR) -> None:
    """Machine ``machine``'s host was provisioned ``ago`` seconds ago and its slurmd never registered."""
    e.slurm.nodes.pop(e.capi.assigned[machine], None)
    e.capi.provision(machine, join=False, at=time.time() - ago)


def live_names(e: Env) -> list[str]:
    return [m["metadata"]["name"] for m in e.capi.live()]


def settle(e: Env, scaling: Scaling, passes: int = 3) -> None:
    """Cluster API and the leader take turns, a few times (bounded)."""
    for _ in range(passes):
        e.capi.step()
        scaling.reconcile()


def test_a_host_that_never_registers_is_reported_then_replaced_by_one_that_joins(env: Callable[..., Env]) -> None:
    e = env(4)
    never_registered(e, "md-004")
    scaling = start(e, {"remediate": True, "maxUnhealthy": 1})
    scaling.reconcile()
    found = condition(e, "md-004")
    assert found is not None and (found["status"], found["reason"]) == ("False", "NeverRegistered")
    assert "registrationTimeout 900s" in found["message"]
    assert all(condition(e, m) is None for m in ("md-001", "md-002", "md-003"))  # nothing written on healthy ones
    scaling.service.events.flush()
    (event,) = machine_events(e, "md-004", REASON_NODE_UNHEALTHY)
    assert event["type"] == "Warning" and "NeverRegistered" in event["message"]
    assert unhealthy(scaling, "NeverRegistered") == 1 and unhealthy(scaling, "NodeLost") == 0
    deleting = e.capi.machine("md-004")
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    assert deleting["metadata"]["annotations"][REMEDIATED_ANNOTATION] == "NeverRegistered"
    assert md_replicas(e.emulator, MD_NS, MD) == 4  # the pool is never lowered
    assert scaling.metric("slime_scaling_remediations_total", 'reason="NeverRegistered"') == 1
    settle(e, scaling)
    assert live_names(e) == ["md-001", "md-002", "md-003", "md-005"] and "node-005" in e.slurm.nodes
    assert unhealthy(scaling, "NeverRegistered") == 0 and md_replicas(e.emulator, MD_NS, MD) == 4
    assert scaling.metric("slime_scaling_remediations_total", 'reason="NeverRegistered"') == 1


def test_a_lost_node_is_replaced_what_a_person_set_and_a_busy_node_are_not(env: Callable[..., Env]) -> None:
    e = env(6)
    now = time.time()
    e.slurm.lose("node-001", since=now - 11 * 60)  # slurmctld: DOWN+NOT_RESPONDING 11 minutes ago
    e.slurm.lose("node-002", since=now - 2 * 60)  # within unhealthyTimeout: not yet
    e.slurm.admin_down("node-003", "PSU swap", since=now - HOUR)  # a person's
    e.slurm.start_job("node-004", now + HOUR)
    e.slurm.lose("node-004", since=now - HOUR, busy=True)  # still shows its job
    e.slurm.admin_drain("node-005", "bad DIMM")
    e.slurm.lose("node-005", since=now - HOUR)  # drained by a person first: theirs
    e.slurm.admin_drain("node-005", "bad DIMM")
    scaling = start(e, {"remediate": True, "maxUnhealthy": "100%"})
    scaling.reconcile()
    assert condition(e, "md-001")["reason"] == "NodeLost"  # type: ignore[index]
    assert condition(e, "md-004")["reason"] == "NodeLost"  # type: ignore[index]
    assert all(condition(e, m) is None for m in ("md-002", "md-003", "md-005", "md-006"))
    assert unhealthy(scaling, "NodeLost") == 2
    assert (e.capi.machine("md-001") or {})["metadata"].get("deletionTimestamp")
    assert not (e.capi.machine("md-004") or {})["metadata"].get("deletionTimestamp")  # busy: never remediated
    settle(e, scaling)
    assert live_names(e) == ["md-002", "md-003", "md-004", "md-005", "md-006", "md-007"]
    assert e.capi.violations == [] and md_replicas(e.emulator, MD_NS, MD) == 6
    e.slurm.finish_jobs("node-004")  # the job ended: the lost node can go now
    e.slurm.lose("node-004", since=now - HOUR)
    settle(e, scaling)
    assert "md-004" not in live_names(e) and len(live_names(e)) == 6
    assert "md-003" in live_names(e) and "md-005" in live_names(e)  # a person's, kept


def test_a_site_wide_outage_short_circuits_remediation(env: Callable[..., Env]) -> None:
    e = env(5)
    for node in list(e.slurm.nodes):
        e.slurm.lose(node, since=time.time() - HOUR)  # slurmctld cut off from every host
    scaling = start(e, {"remediate": True})  # maxUnhealthy 40%: 2 of 5
    scaling.reconcile()
    scaling.reconcile()
    assert unhealthy(scaling, "NodeLost") == 5 and all(condition(e, m) for m in live_names(e))
    assert len(live_names(e)) == 5 and not any(m["metadata"].get("deletionTimestamp") for m in e.capi.machines())
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, REASON_SHORT_CIRCUIT)[:1], what="the short-circuit")
    assert "5 of 5 Machines" in event["message"] and "maxUnhealthy 40% allows (2)" in event["message"]
    assert (scaling.metric("slime_scaling_remediation_short_circuits_total") or 0) >= 2
    for node in ("node-001", "node-002", "node-003", "node-004"):
        e.slurm.recover(node)  # the network comes back for all but one: remediation resumes for that one
    scaling.reconcile()
    assert [m for m in live_names(e) if (e.capi.machine(m) or {})["metadata"].get("deletionTimestamp")] == []
    assert e.capi.machine("md-005")["metadata"].get("deletionTimestamp")  # type: ignore[index]
    assert condition(e, "md-001")["status"] == "True"  # type: ignore[index]


def test_an_outage_of_slurm_itself_judges_nothing(env: Callable[..., Env]) -> None:
    e = env(3)
    never_registered(e, "md-003")
    e.slurm.stop()
    scaling = start(e, {"remediate": True, "maxUnhealthy": 3})
    scaling.reconcile()
    assert condition(e, "md-003") is None and len(live_names(e)) == 3
    assert not any(m["metadata"].get("deletionTimestamp") for m in e.capi.machines())
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "SlurmUnavailable")[:1], what="SlurmUnavailable")
    assert "machine health judges nothing" in event["message"]


def test_a_node_that_comes_back_is_reported_healthy_again(env: Callable[..., Env]) -> None:
    e = env(2)
    e.slurm.lose("node-001", since=time.time() - HOUR)
    scaling = start(e, {})  # report only
    scaling.reconcile()
    assert condition(e, "md-001")["status"] == "False"  # type: ignore[index]
    first = condition(e, "md-001")
    scaling.reconcile()
    assert condition(e, "md-001") == first  # said once: no second write, no second Event
    e.slurm.recover("node-001")
    scaling.reconcile()
    back = condition(e, "md-001")
    assert back is not None and (back["status"], back["reason"]) == ("True", "NodeHealthy")
    scaling.service.events.flush()
    assert len(machine_events(e, "md-001", REASON_NODE_UNHEALTHY)) == 1
    assert len(machine_events(e, "md-001", REASON_NODE_HEALTHY)) == 1
    assert len(live_names(e)) == 2 and unhealthy(scaling, "NodeLost") == 0


def test_a_paused_pool_is_reported_not_remediated(env: Callable[..., Env]) -> None:
    e = env(2)
    never_registered(e, "md-002")
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"paused": True}})
    scaling = start(e, {"remediate": True, "maxUnhealthy": 2})
    scaling.reconcile()
    assert condition(e, "md-002")["reason"] == "NeverRegistered"  # type: ignore[index]
    assert not (e.capi.machine("md-002") or {})["metadata"].get("deletionTimestamp")
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"paused": False}})
    wait_for(
        lambda: (
            not (
                scaling.service.objects.machine_deployment(scaling.service.source.table.get(SLIME_NAMESPACE, MIRROR))
                or {}
            )
            .get("spec", {})
            .get("paused")
        ),  # type: ignore[arg-type]
        what="the unpause in the cache",
    )
    scaling.reconcile()
    assert (e.capi.machine("md-002") or {})["metadata"].get("deletionTimestamp")


def test_with_safe_scale_in_a_never_registered_machine_goes_first_and_is_let_go_at_once(
    env: Callable[..., Env],
) -> None:
    e = env(3)
    never_registered(e, "md-003")
    scaling = start(e, {}, safe_scale_in={})  # report only: the scale-in removes it
    e.scale(scaling, 2)
    assert e.annotated() == ["md-003"]  # first, though node-001 and node-002 are idle
    e.capi.step()
    assert e.hooked("md-003") and e.capi.machine("md-003")["metadata"].get("deletionTimestamp")  # type: ignore[index]
    scaling.reconcile()
    assert not e.hooked("md-003")  # released at once: no node will come to drain
    e.capi.step()
    assert live_names(e) == ["md-001", "md-002"] and e.slurm.drains == []
    scaling.service.events.flush()
    (released,) = md_events(e.emulator, MD_NS, MD, "ReleasedNeverJoined")
    assert "judged it never registered" in released["message"]


def test_with_safe_scale_in_a_remediated_lost_node_is_drained_then_let_go(env: Callable[..., Env]) -> None:
    e = env(3)
    e.slurm.lose("node-002", since=time.time() - HOUR)
    scaling = start(e, {"remediate": True, "maxUnhealthy": 1}, safe_scale_in={})
    scaling.reconcile()
    settle(e, scaling, passes=4)
    assert "node-002" in e.slurm.drains and "node-002" in e.slurm.returned  # drained, then back to FUTURE
    assert live_names(e) == ["md-001", "md-003", "md-004"] and e.capi.violations == [] and e.slurm.violations == []
    scaling.service.events.flush()
    assert md_events(e.emulator, MD_NS, MD, REASON_REMEDIATED)
    # The hook held the Machine until the drain: the host went only after Slurm let its node go.
    assert e.capi.removed == ["md-002"]


def test_a_pass_on_a_cache_that_missed_the_remediation_does_not_remediate_again(env: Callable[..., Env]) -> None:
    """Two passes, the second judging from Machines as they were before the first deleted one (a watch behind):
    the mark is conditional on the Machine as judged, so one fault is remediated once."""
    e = env(3)
    never_registered(e, "md-003")
    before = e.emulator.list(f"{CAPI}/v1beta1", "Machine", MD_NS)  # as judged before any pass ran
    scaling = start(e, {"remediate": True, "maxUnhealthy": 1})
    scaling.reconcile()
    assert (e.capi.machine("md-003") or {})["metadata"].get("deletionTimestamp")
    health = scaling.service.reconciler.health
    assert health is not None
    mapping = scaling.service.source.table.get(SLIME_NAMESPACE, MIRROR)
    assert mapping is not None
    health.reads.begin_pass()
    report = health.check(mapping, before)
    assert report.remediated == [] and report.unhealthy == {"md-003": "NeverRegistered"}
    assert scaling.metric("slime_scaling_remediations_total", 'reason="NeverRegistered"') == 1
    scaling.service.events.flush()
    assert len(machine_events(e, "md-003", REASON_REMEDIATED)) == 1
