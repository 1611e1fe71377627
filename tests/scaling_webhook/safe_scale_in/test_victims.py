"""Victim choice, pure: a Machine's Slurm node, its provisioning evidence, and how many victims are chosen."""

from __future__ import annotations

from typing import Any

import pytest

from common.names import DELETE_MACHINE_ANNOTATION, DELETE_MACHINE_VALUE, SLURM_NODE_ANNOTATION
from scaling_webhook.safe_scale_in.victims import choose_victims, classify, never_joined
from scaling_webhook.slurm.machines import (
    DRAIN_REASON,
    drained_by_us,
    infrastructure_provisioned,
    is_pending_victim,
    machine_addresses,
    node_for,
)
from scaling_webhook.slurm.slurmrestd import SlurmNode, SlurmNodes

IDLE = frozenset({"IDLE"})


def machine(
    name: str,
    addresses: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "status": {"addresses": addresses or [], **(status or {})}}


def test_machine_addresses_keep_the_node_address_types_only() -> None:
    m = machine(
        "m",
        [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "Hostname", "address": "host-1"},
            {"type": "InternalDNS", "address": "host-1.example.org"},
            {"type": "BMCAddress", "address": "10.9.9.9"},  # not the node's own
            {"type": "ExternalIP", "address": ""},
            "not-a-dict",  # type: ignore[list-item]
        ],
    )
    assert machine_addresses(m) == ["10.0.0.1", "host-1", "host-1.example.org"]
    assert machine_addresses({"metadata": {"name": "bare"}}) == []


@pytest.mark.parametrize(
    ("node", "found"),
    [
        (SlurmNode("host-1"), True),  # by name
        (SlurmNode("n", hostname="host-1"), True),  # by hostname
        (SlurmNode("n", address="10.0.0.1"), True),  # by address
        (SlurmNode("n", hostname="other", address="10.0.0.2"), False),
    ],
)
def test_node_for_matches_name_hostname_or_address(node: SlurmNode, found: bool) -> None:
    m = machine("m", [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "host-1"}])
    assert node_for(m, [SlurmNode("unrelated", address="10.0.0.9"), node]) == (node if found else None)


def test_without_addresses_or_a_record_a_machine_has_no_node() -> None:
    # No address and no recorded node: even a node named like the Machine is not its node.
    assert node_for(machine("m"), [SlurmNode("m")]) is None


def test_node_for_finds_the_recorded_node_without_addresses() -> None:
    recorded = SlurmNode("slurm-7", address="10.0.0.7")
    m = machine("m", annotations={SLURM_NODE_ANNOTATION: "slurm-7"})
    assert node_for(m, [SlurmNode("other"), recorded]) == recorded


def test_node_for_takes_the_first_match_in_slurms_order_and_a_recorded_name_by_name_only() -> None:
    """Several nodes may match one Machine (an address reused, a stale record): the first in Slurm's list wins,
    whether the list was read by the service (``SlurmNodes``, its lookups built once) or is a plain list."""
    m = machine("m", [{"type": "InternalIP", "address": "10.0.0.1"}], {SLURM_NODE_ANNOTATION: "rec"})
    by_hostname = SlurmNode("a", hostname="10.0.0.1")
    by_address = SlurmNode("b", address="10.0.0.1")
    recorded = SlurmNode("rec", address="10.0.0.5")
    named_like_the_record = SlurmNode("c", hostname="rec", address="rec")  # a hostname is not the recorded name
    orders = [
        ([named_like_the_record, by_address, recorded, by_hostname], by_address),
        ([recorded, by_hostname, by_address], recorded),
        ([by_hostname, recorded], by_hostname),
    ]
    for nodes, first in orders:
        for listed in (nodes, SlurmNodes(nodes)):
            assert node_for(m, listed) == first
    only_the_record = machine("x", annotations={SLURM_NODE_ANNOTATION: "rec"})
    assert node_for(only_the_record, SlurmNodes([named_like_the_record])) is None


@pytest.mark.parametrize(
    ("status", "provisioned"),
    [
        ({"initialization": {"infrastructureProvisioned": True}}, True),  # v1beta2
        ({"infrastructureReady": True}, True),  # v1beta1
        ({"initialization": {"infrastructureProvisioned": False}, "infrastructureReady": False}, False),
        ({"infrastructureReady": "true"}, False),  # only a real true counts
        ({}, False),
    ],
)
def test_infrastructure_provisioned_reads_both_capi_versions(status: dict[str, Any], provisioned: bool) -> None:
    assert infrastructure_provisioned({"status": status}) is provisioned
    assert never_joined(machine("m", status=status)) is not provisioned


def test_a_recorded_node_is_evidence_of_a_join() -> None:
    assert not never_joined(machine("m", annotations={SLURM_NODE_ANNOTATION: "n1"}))


def test_pending_victim_is_ours_and_not_yet_deleting() -> None:
    ours = {DELETE_MACHINE_ANNOTATION: DELETE_MACHINE_VALUE}
    assert is_pending_victim(machine("m", annotations=ours))
    assert not is_pending_victim(machine("m", annotations=ours, deleting=True))
    assert not is_pending_victim(machine("m", annotations={DELETE_MACHINE_ANNOTATION: "someone-else"}))
    assert not is_pending_victim(machine("m"))


def test_drained_by_us_needs_drain_and_our_reason() -> None:
    assert drained_by_us(SlurmNode("n", states=frozenset({"IDLE", "DRAIN"}), reason=DRAIN_REASON))
    assert not drained_by_us(SlurmNode("n", states=frozenset({"IDLE", "DRAIN"}), reason="maintenance"))
    assert not drained_by_us(SlurmNode("n", states=IDLE, reason=DRAIN_REASON))  # undrained; reason left (24.11)


def test_classify_says_why_a_machine_is_kept() -> None:
    node = SlurmNode("n1", address="10.0.0.1", states=frozenset({"MIXED", "COMPLETING", "DRAIN"}))
    kept = classify(machine("m1", [{"type": "InternalIP", "address": "10.0.0.1"}]), [node])
    assert (kept.eligible, kept.why, kept.node) == (False, "COMPLETING+MIXED", node)
    idle = classify(
        machine("m2", [{"type": "InternalIP", "address": "10.0.0.2"}]),
        [SlurmNode("n2", address="10.0.0.2", states=IDLE)],
    )
    assert (idle.eligible, idle.why) == (True, "IDLE")


def test_choose_victims_takes_at_most_count_in_order() -> None:
    nodes = [SlurmNode(f"n{i}", address=f"10.0.0.{i}", states=IDLE) for i in range(1, 4)]
    machines = [machine(f"m{i}", [{"type": "InternalIP", "address": f"10.0.0.{i}"}]) for i in (3, 1, 2)]
    chosen, ineligible = choose_victims(machines, nodes, 2)
    assert [c.machine for c in chosen] == ["m1", "m2"]  # ties break by name
    assert ineligible == []
    assert choose_victims(machines, nodes, 0)[0] == []
    assert choose_victims(machines, nodes, -1)[0] == []
    assert len(choose_victims(machines, nodes, 10)[0]) == 3
