"""A pool's Machine and its Slurm node: how SliMe relates the two and reads a Machine's state (pure).

Every Slurm opt-in goes by these: safe scale-in chooses and releases by them, machine health
judges by them. A Machine's Slurm node is the one SliMe recorded on it
(:data:`~common.names.SLURM_NODE_ANNOTATION`), else one whose name, hostname or address is one of
the Machine's addresses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from common.names import DELETE_MACHINE_ANNOTATION, DELETE_MACHINE_VALUE, SLURM_NODE_ANNOTATION
from scaling_webhook.slurm.slurmrestd import SlurmNode, SlurmNodes

# The reason SliMe drains a node with for a scale-in: a drain with any other reason is someone else's.
DRAIN_REASON = "slime: scale-in"
ADDRESS_TYPES = ("Hostname", "InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS")


def machine_name(machine: dict[str, Any]) -> str:
    return str((machine.get("metadata") or {}).get("name") or "")


def machine_annotations(machine: dict[str, Any]) -> dict[str, str]:
    return (machine.get("metadata") or {}).get("annotations") or {}


def is_deleting(machine: dict[str, Any]) -> bool:
    return bool((machine.get("metadata") or {}).get("deletionTimestamp"))


def is_pending_victim(machine: dict[str, Any]) -> bool:
    """Marked for deletion by us, not yet being deleted (so it can still be reclaimed)."""
    return machine_annotations(machine).get(DELETE_MACHINE_ANNOTATION) == DELETE_MACHINE_VALUE and not is_deleting(
        machine
    )


def drained_by_us(node: SlurmNode) -> bool:
    return "DRAIN" in node.states and node.reason == DRAIN_REASON


def infrastructure_provisioned(machine: dict[str, Any]) -> bool:
    """Cluster API's contract: the infrastructure provider reported the machine provisioned.

    v1beta2: ``status.initialization.infrastructureProvisioned``; v1beta1:
    ``status.infrastructureReady``. CAPM3 reports it once the BareMetalHost is provisioned, that
    is once the image is written and the host set to boot it: before that, no operating system
    (so no cloud-init, no slurmd) has run on the host.
    """
    status = machine.get("status") or {}
    initialization = status.get("initialization") or {}
    return initialization.get("infrastructureProvisioned") is True or status.get("infrastructureReady") is True


def machine_addresses(machine: dict[str, Any]) -> list[str]:
    found = []
    for entry in (machine.get("status") or {}).get("addresses") or []:
        if isinstance(entry, dict) and entry.get("type") in ADDRESS_TYPES and entry.get("address"):
            found.append(str(entry["address"]))
    return found


def node_for(machine: dict[str, Any], nodes: Iterable[SlurmNode]) -> SlurmNode | None:
    """The Slurm node of a Machine: the one SliMe recorded, else one whose
    name, hostname or address is a Machine address."""
    recorded = machine_annotations(machine).get(SLURM_NODE_ANNOTATION)
    addresses = set(machine_addresses(machine))
    if not addresses and not recorded:
        return None
    listed = nodes if isinstance(nodes, SlurmNodes) else SlurmNodes(nodes)
    by_name, by_any = listed.lookups()
    found = [by_any[a] for a in addresses if a in by_any]
    if recorded and recorded in by_name:
        found.append(by_name[recorded])
    return listed[min(found)] if found else None  # the first in Slurm's order, as a scan of the list finds it
