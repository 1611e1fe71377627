"""The judgments of one Machine, as pure functions: never registered, lost, or working; what a person set is theirs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from common.names import DELETE_MACHINE_ANNOTATION, DELETE_MACHINE_VALUE, SLURM_NODE_ANNOTATION
from scaling_webhook.machine_health.config import SlurmHealthConfig
from scaling_webhook.machine_health.judge import NEVER_REGISTERED, NODE_LOST, judge, provisioned_at
from scaling_webhook.slurm.machines import DRAIN_REASON
from scaling_webhook.slurm.slurmrestd import SlurmNode

NOW = 1_800_000_000.0
CONFIG = SlurmHealthConfig(slurmrestd="http://127.0.0.1:1", jwt_secret=("slurm", "jwt"))  # 15 min, 10 min


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def machine(
    name: str = "md-001",
    provisioned: float | None = NOW - 3600,
    addresses: tuple[str, ...] = ("node-001", "10.0.0.1"),
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
    v1beta2: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "addresses": [{"type": "Hostname" if i == 0 else "InternalIP", "address": a} for i, a in enumerate(addresses)]
    }
    if provisioned is not None:
        condition = {"type": "InfrastructureReady", "status": "True", "lastTransitionTime": _stamp(provisioned)}
        if v1beta2:
            status["initialization"] = {"infrastructureProvisioned": True}
        else:
            status["infrastructureReady"] = True
        status["conditions"] = [condition]
    metadata: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if deleting:
        metadata["deletionTimestamp"] = _stamp(NOW - 5)
    return {"metadata": metadata, "status": status}


def node(
    states: tuple[str, ...] = ("IDLE",), reason: str = "", by: str = "", changed: float | None = None
) -> SlurmNode:
    return SlurmNode(
        "node-001",
        "node-001",
        "10.0.0.1",
        frozenset(states),
        reason,
        by,
        int(changed) if changed else None,
    )


def never_seen(_machine: str, _reason: str, at: float) -> float:
    return at  # the clock starts now: only the Machine's or Slurm's own time can make it overdue


def test_a_working_node_is_healthy() -> None:
    judged = judge(machine(), [node()], CONFIG, NOW, never_seen)
    assert judged is not None and not judged.unhealthy and judged.node is not None


@pytest.mark.parametrize("v1beta2", [False, True])
def test_no_node_past_the_registration_timeout_is_never_registered(v1beta2: bool) -> None:
    judged = judge(machine(provisioned=NOW - 901, v1beta2=v1beta2), [], CONFIG, NOW, never_seen)
    assert judged is not None and judged.reason == NEVER_REGISTERED
    assert "provisioned 901s ago" in judged.message and "registrationTimeout 900s" in judged.message


def test_no_node_within_the_registration_timeout_is_healthy_for_now() -> None:
    judged = judge(machine(provisioned=NOW - 899), [], CONFIG, NOW, never_seen)
    assert judged is not None and not judged.unhealthy


def test_a_machine_not_provisioned_is_not_judged() -> None:
    assert judge(machine(provisioned=None), [], CONFIG, NOW, never_seen) is None


def test_a_machine_that_joined_once_is_not_never_registered() -> None:
    """Its node was removed in Slurm (a release returned it to FUTURE, or a person deleted it): not the host's fault."""
    joined = machine(provisioned=NOW - 7200, annotations={SLURM_NODE_ANNOTATION: "node-001"})
    judged = judge(joined, [], CONFIG, NOW, never_seen)
    assert judged is not None and not judged.unhealthy


def test_a_machine_without_addresses_is_not_judged_never_registered() -> None:
    judged = judge(machine(provisioned=NOW - 7200, addresses=()), [], CONFIG, NOW, never_seen)
    assert judged is not None and not judged.unhealthy


def test_without_a_provisioning_time_the_clock_starts_when_first_seen() -> None:
    bare = machine(provisioned=NOW - 7200)
    bare["status"]["conditions"] = []
    clocks: dict[tuple[str, str], float] = {}

    def first_seen(name: str, reason: str, at: float) -> float:
        return clocks.setdefault((name, reason), at)

    assert not judge(bare, [], CONFIG, NOW, first_seen).unhealthy  # type: ignore[union-attr]
    assert not judge(bare, [], CONFIG, NOW + 900, first_seen).unhealthy  # type: ignore[union-attr]
    assert judge(bare, [], CONFIG, NOW + 901, first_seen).reason == NEVER_REGISTERED  # type: ignore[union-attr]


def test_provisioned_at_falls_back_to_the_phase_change_of_a_running_machine() -> None:
    bare = machine(provisioned=None)
    bare["status"].update({"phase": "Running", "lastUpdated": _stamp(NOW - 100)})
    assert provisioned_at(bare) == NOW - 100
    bare["status"]["phase"] = "Provisioning"
    assert provisioned_at(bare) is None


@pytest.mark.parametrize(
    "states",
    [("DOWN", "DYNAMIC_NORM", "NOT_RESPONDING"), ("IDLE", "NOT_RESPONDING"), ("FAIL", "IDLE"), ("DOWN",)],
)
def test_a_node_slurmctld_took_down_past_the_timeout_is_lost(states: tuple[str, ...]) -> None:
    lost = node(states, "Not responding", "slurm", NOW - 601)
    judged = judge(machine(), [lost], CONFIG, NOW, never_seen)
    assert judged is not None and judged.reason == NODE_LOST and "Not responding" in judged.message


def test_a_lost_node_within_the_timeout_is_healthy_for_now() -> None:
    judged = judge(machine(), [node(("DOWN",), "Not responding", "slurm", NOW - 599)], CONFIG, NOW, never_seen)
    assert judged is not None and not judged.unhealthy


@pytest.mark.parametrize(
    "what",
    [
        node(("DOWN",), "disk swap", "root", NOW - 7200),  # an administrator downed it
        node(("IDLE", "DRAIN", "NOT_RESPONDING"), "bad DIMM", "slurm", NOW - 7200),  # drained, even as SlurmUser
        node(("DOWN", "DRAIN"), "maintenance", "alice", NOW - 7200),
        node(("DOWN", "REBOOT_ISSUED"), "Reboot ASAP", "slurm", NOW - 7200),  # scontrol reboot
        node(("FAIL",), "will fail", "bob", NOW - 7200),
    ],
)
def test_what_a_person_set_is_never_lost(what: SlurmNode) -> None:
    judged = judge(machine(), [what], CONFIG, NOW, never_seen)
    assert judged is not None and not judged.unhealthy


def test_slime_own_drain_does_not_hide_a_lost_node() -> None:
    ours = node(("DOWN", "DRAIN", "NOT_RESPONDING"), DRAIN_REASON, "slurm", NOW - 7200)
    assert judge(machine(), [ours], CONFIG, NOW, never_seen).reason == NODE_LOST  # type: ignore[union-attr]


def test_a_busy_lost_node_is_judged_and_said_busy() -> None:
    busy = node(("ALLOCATED", "NOT_RESPONDING"), "Not responding", "slurm", NOW - 7200)
    judged = judge(machine(), [busy], CONFIG, NOW, never_seen)
    assert judged is not None and judged.reason == NODE_LOST and judged.busy


def test_leaving_machines_are_judged_and_marked_leaving() -> None:
    deleting = judge(machine(provisioned=NOW - 7200, deleting=True), [], CONFIG, NOW, never_seen)
    marked = judge(
        machine(provisioned=NOW - 7200, annotations={DELETE_MACHINE_ANNOTATION: DELETE_MACHINE_VALUE}),
        [],
        CONFIG,
        NOW,
        never_seen,
    )
    assert deleting is not None and deleting.leaving and deleting.reason == NEVER_REGISTERED
    assert marked is not None and marked.leaving


def test_a_custom_slurm_user_and_timeouts() -> None:
    config = SlurmHealthConfig(
        slurmrestd="http://127.0.0.1:1",
        jwt_secret=("slurm", "jwt"),
        registration_timeout_seconds=60,
        unhealthy_timeout_seconds=30,
        slurm_user="slurmctl",
    )
    assert judge(machine(provisioned=NOW - 61), [], config, NOW, never_seen).reason == NEVER_REGISTERED  # type: ignore[union-attr]
    by_slurm = node(("DOWN",), "Not responding", "slurm", NOW - 31)  # "slurm" is a person here
    by_slurmctl = node(("DOWN",), "Not responding", "slurmctl", NOW - 31)
    assert not judge(machine(), [by_slurm], config, NOW, never_seen).unhealthy  # type: ignore[union-attr]
    assert judge(machine(), [by_slurmctl], config, NOW, never_seen).reason == NODE_LOST  # type: ignore[union-attr]
