"""Which Machines a scale-down may remove, from Slurm's view: pure functions, no I/O.

Order (after Slinky's NodeSet): a Machine whose Slurm node is unknown (not joined yet, or gone)
first, then nodes that serve no job (IDLE, IDLE+DRAIN, DOWN without jobs; already drained ones
first). A node that is ALLOCATED, MIXED or COMPLETING is never chosen, nor a Machine already
being deleted. Ties break by the Machine's name, so the choice is deterministic. (Slinky also
orders busy nodes by their jobs' end; busy nodes are never victims here, so that key is moot.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from scaling_webhook.safe_scale_in.slurmrestd import SlurmNode

DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
DELETE_MACHINE_VALUE = "slime"
PRE_DRAIN_HOOK = "pre-drain.delete.hook.machine.cluster.x-k8s.io/slime"
PRE_DRAIN_HOOK_OWNER = "slime-scaling-webhook"
ADDRESS_TYPES = ("Hostname", "InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS")


@dataclass(frozen=True, slots=True)
class Candidate:
    machine: str  # Machine name
    node: SlurmNode | None
    eligible: bool
    why: str  # for messages: "no Slurm node", "IDLE", "ALLOCATED", "deleting", ...
    rank: tuple[Any, ...] = ()


def machine_name(machine: dict[str, Any]) -> str:
    return str((machine.get("metadata") or {}).get("name") or "")


def machine_annotations(machine: dict[str, Any]) -> dict[str, str]:
    return (machine.get("metadata") or {}).get("annotations") or {}


def is_deleting(machine: dict[str, Any]) -> bool:
    return bool((machine.get("metadata") or {}).get("deletionTimestamp"))


def is_pending_victim(machine: dict[str, Any]) -> bool:
    """Marked for deletion by us, not yet being deleted (so it can still be reclaimed)."""
    return machine_annotations(machine).get(DELETE_MACHINE) == DELETE_MACHINE_VALUE and not is_deleting(machine)


def machine_addresses(machine: dict[str, Any]) -> list[str]:
    found = []
    for entry in (machine.get("status") or {}).get("addresses") or []:
        if isinstance(entry, dict) and entry.get("type") in ADDRESS_TYPES and entry.get("address"):
            found.append(str(entry["address"]))
    return found


def node_for(machine: dict[str, Any], nodes: Iterable[SlurmNode]) -> SlurmNode | None:
    """The Slurm node whose name, hostname or address is one of the Machine's addresses."""
    addresses = set(machine_addresses(machine))
    if not addresses:
        return None
    for node in nodes:
        if {node.name, node.hostname, node.address} & addresses:
            return node
    return None


def classify(machine: dict[str, Any], nodes: Sequence[SlurmNode]) -> Candidate:
    name = machine_name(machine)
    if is_deleting(machine):
        return Candidate(name, None, False, "already deleting")
    node = node_for(machine, nodes)
    if node is None:
        return Candidate(name, None, True, "no Slurm node", (0, 0, name))
    if node.busy:
        busy = sorted(node.states & {"ALLOCATED", "MIXED", "COMPLETING"})
        return Candidate(name, node, False, "+".join(busy))
    # Not busy: a drained node first (we or someone already asked it to leave), then the rest.
    tier = 0 if "DRAIN" in node.states else 1
    return Candidate(name, node, True, "+".join(sorted(node.states)) or "no state", (1, tier, name))


def order_candidates(machines: Iterable[dict[str, Any]], nodes: Sequence[SlurmNode]) -> tuple[list[Candidate], list[Candidate]]:
    """(eligible Machines in the order to remove them, ineligible ones with why)."""
    eligible: list[Candidate] = []
    ineligible: list[Candidate] = []
    for machine in machines:
        candidate = classify(machine, nodes)
        (eligible if candidate.eligible else ineligible).append(candidate)
    eligible.sort(key=lambda c: c.rank)
    ineligible.sort(key=lambda c: c.machine)
    return eligible, ineligible


def choose_victims(machines: Iterable[dict[str, Any]], nodes: Sequence[SlurmNode], count: int) -> tuple[list[Candidate], list[Candidate]]:
    """Up to ``count`` safe victims, and the ineligible Machines (to say why fewer)."""
    eligible, ineligible = order_candidates(machines, nodes)
    return eligible[: max(0, count)], ineligible
