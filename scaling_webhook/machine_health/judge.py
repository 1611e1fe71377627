"""Is a pool's Machine a working Slurm node? Pure judgments, no I/O (docs/scaling.md, "Slurm-aware machine health").

A Machine is related to its Slurm node by the rule safe scale-in uses (:func:`node_for`: the node
SliMe recorded on it, else one whose name, hostname or address is a Machine address). Two
judgments, each after its own timeout:

* **never registered**: the Machine's infrastructure is provisioned (CAPM3 wrote the image and
  booted the host), it never had a Slurm node, and Slurm has none for it (a FUTURE placeholder
  is hidden from Slurm's node list, so it counts as none) for longer than
  ``registrationTimeout``, counted from when Cluster API reported it provisioned;
* **lost**: its node is DOWN, NOT_RESPONDING or FAIL for longer than ``unhealthyTimeout``, and
  no person set that: a node drained by anyone but SliMe, or whose reason was set by another
  user than ``slurmUser`` (slurmctld writes its own reasons as SlurmUser), is an administrator's
  and is never judged lost; nor is a node an administrator is rebooting.

Machines being deleted, or marked for a scale-in, are judged ``leaving``: on their way out, they are
neither reported nor remediated, but safe scale-in lets a never-registered one go at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from common.names import SLURM_NODE_ANNOTATION
from scaling_webhook.machine_health.config import SlurmHealthConfig
from scaling_webhook.slurm.machines import (
    DRAIN_REASON,
    infrastructure_provisioned,
    is_deleting,
    is_pending_victim,
    machine_addresses,
    machine_annotations,
    machine_name,
    node_for,
)
from scaling_webhook.slurm.slurmrestd import SlurmNode

NEVER_REGISTERED = "NeverRegistered"
NODE_LOST = "NodeLost"
REASONS = (NEVER_REGISTERED, NODE_LOST)
LOST_STATES = frozenset({"DOWN", "NOT_RESPONDING", "FAIL"})
# An administrator's reboot (scontrol reboot) takes the node down for a while on purpose.
REBOOTING_STATES = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
PROVISIONED_PHASES = ("Provisioned", "Running")

# (Machine name, judgment) -> when this leader first saw the Machine so (for Machines without a
# timestamp of their own): called with the time now, returns the time the clock started.
FirstSeen = Callable[[str, str, float], float]


@dataclass(frozen=True, slots=True)
class Judgment:
    """What one Machine is now. ``reason`` is one of :data:`REASONS` when it is unhealthy, "" otherwise."""

    machine: str
    reason: str = ""
    message: str = ""
    node: SlurmNode | None = None
    leaving: bool = False  # being deleted, or marked for a scale-in: judged for safe scale-in, not reported

    @property
    def unhealthy(self) -> bool:
        return bool(self.reason)

    @property
    def busy(self) -> bool:
        """Its node runs or completes a job: never remediated."""
        return self.node is not None and self.node.busy


def _stamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def provisioned_at(machine: dict[str, Any]) -> float | None:
    """When Cluster API reported the Machine's infrastructure provisioned: the ``InfrastructureReady``
    condition's lastTransitionTime (v1beta2's conditions, their v1beta1 copy, or v1beta1's), else
    ``status.lastUpdated`` of a Provisioned or Running Machine (its last phase change: no earlier than
    provisioning). None when neither is there."""
    status = machine.get("status") or {}
    lists = (
        status.get("conditions"),
        ((status.get("deprecated") or {}).get("v1beta1") or {}).get("conditions"),
    )
    for conditions in lists:
        for condition in conditions if isinstance(conditions, list) else []:
            if (
                isinstance(condition, dict)
                and condition.get("type") == "InfrastructureReady"
                and condition.get("status") == "True"
            ):
                found = _stamp(condition.get("lastTransitionTime"))
                if found is not None:
                    return found
    if status.get("phase") in PROVISIONED_PHASES:
        return _stamp(status.get("lastUpdated"))
    return None


def set_by_a_person(node: SlurmNode, slurm_user: str) -> bool:
    """An administrator drained it (any drain but SliMe's), or set its reason as a user other than SlurmUser."""
    if "DRAIN" in node.states and node.reason != DRAIN_REASON:
        return True
    return bool(node.reason) and node.reason_set_by_user not in ("", slurm_user)


def looks_lost(node: SlurmNode, slurm_user: str) -> bool:
    """DOWN, NOT_RESPONDING or FAIL, and not by a person's hand (nor an administrator's reboot)."""
    return (
        bool(node.states & LOST_STATES) and not node.states & REBOOTING_STATES and not set_by_a_person(node, slurm_user)
    )


def judge(
    machine: dict[str, Any],
    nodes: Iterable[SlurmNode],
    config: SlurmHealthConfig,
    now: float,
    first_seen: FirstSeen,
) -> Judgment | None:
    """The Machine's judgment, or None when it is not judged: its infrastructure is not provisioned yet
    (nothing has booted). A Machine being deleted or marked for a scale-in is judged ``leaving``. A suspect
    not past its timeout is healthy for now; ``first_seen`` starts its clock when neither Cluster API nor
    Slurm gives one."""
    name = machine_name(machine)
    if not infrastructure_provisioned(machine):
        return None
    leaving = is_deleting(machine) or is_pending_victim(machine)
    node = node_for(machine, nodes)
    if node is None:
        if SLURM_NODE_ANNOTATION in machine_annotations(machine):
            # It joined once: its record was removed in Slurm (by SliMe's release or a person), not the host's fault.
            return Judgment(name, leaving=leaving)
        if not machine_addresses(machine):
            return Judgment(name, leaving=leaving)  # nothing to relate a node to (yet): no judgment to take back
        since = provisioned_at(machine)
        if since is None:
            since = first_seen(name, NEVER_REGISTERED, now)
        waited = now - since
        if waited <= config.registration_timeout_seconds:
            return Judgment(name, leaving=leaving)
        return Judgment(
            name,
            NEVER_REGISTERED,
            f"provisioned {waited:.0f}s ago and no Slurm node registered for it (registrationTimeout "
            f"{config.registration_timeout_seconds:g}s)",
            leaving=leaving,
        )
    if not looks_lost(node, config.slurm_user):
        return Judgment(name, node=node, leaving=leaving)
    states = "+".join(sorted(node.states))
    since = float(node.reason_changed_at) if node.reason and node.reason_changed_at else None
    if since is None:
        since = first_seen(name, NODE_LOST, now)
    waited = now - since
    if waited <= config.unhealthy_timeout_seconds:
        return Judgment(name, node=node, leaving=leaving)
    why = f" ({node.reason})" if node.reason else ""
    return Judgment(
        name,
        NODE_LOST,
        f"Slurm node {node.name} has been {states}{why} for {waited:.0f}s, set by slurmctld, not a person "
        f"(unhealthyTimeout {config.unhealthy_timeout_seconds:g}s)",
        node,
        leaving,
    )
