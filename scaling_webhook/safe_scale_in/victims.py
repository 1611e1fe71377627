"""Which Machines a scale-down may remove, from Slurm's view: pure functions, no I/O.

A node that is ALLOCATED, MIXED or COMPLETING is never chosen, nor a Machine already being
deleted. The others, cheapest to remove first (after Slinky's NodeSet: not-ready before idle,
cordoned late):

0. no Slurm node, and the Machine's infrastructure was never provisioned: nothing has booted; or
   machine health judged it never registered (provisioned longer than ``registrationTimeout``);
1. a node that is DOWN or NOT_RESPONDING and runs nothing;
2. a node SliMe drained (reason ``slime: scale-in``) that runs nothing: already on its way out;
3. an IDLE node;
4. no Slurm node although the infrastructure is provisioned: joining now, or broken. Its
   release must wait until Slurm tells (see :func:`never_joined`), so it comes after idle nodes;
5. a node someone else drained (an admin's reason): kept until last, it is theirs to bring back.

Ties break by the Machine's name, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from common.names import SLURM_NODE_ANNOTATION
from scaling_webhook.slurm.machines import (
    drained_by_us,
    infrastructure_provisioned,
    is_deleting,
    machine_annotations,
    machine_name,
    node_for,
)
from scaling_webhook.slurm.slurmrestd import SlurmNode


@dataclass(frozen=True, slots=True)
class Candidate:
    machine: str  # Machine name
    node: SlurmNode | None
    eligible: bool
    why: str  # for messages: "no Slurm node", "IDLE", "ALLOCATED", "deleting", ...
    rank: tuple[Any, ...] = ()


def never_joined(machine: dict[str, Any]) -> bool:
    """Evidence that a Machine's host has not joined Slurm and cannot before it is gone.

    No node SliMe recorded for it, and its infrastructure never provisioned (see
    :func:`infrastructure_provisioned`). Deleting the Machine deprovisions the host, which then
    never boots the image.
    """
    return SLURM_NODE_ANNOTATION not in machine_annotations(machine) and not infrastructure_provisioned(machine)


def classify(
    machine: dict[str, Any], nodes: Sequence[SlurmNode], never_registered: frozenset[str] = frozenset()
) -> Candidate:
    name = machine_name(machine)
    if is_deleting(machine):
        return Candidate(name, None, False, "already deleting")
    node = node_for(machine, nodes)
    if node is None:
        if never_joined(machine):
            return Candidate(name, None, True, "no Slurm node, not provisioned", (0, name))
        if name in never_registered:
            return Candidate(name, None, True, "never registered with Slurm", (0, name))
        return Candidate(name, None, True, "no Slurm node yet", (4, name))
    if node.busy:
        busy = sorted(node.states & {"ALLOCATED", "MIXED", "COMPLETING"})
        return Candidate(name, node, False, "+".join(busy))
    states = "+".join(sorted(node.states)) or "no state"
    if node.states & {"DOWN", "NOT_RESPONDING"}:
        tier = 1
    elif drained_by_us(node):
        tier = 2
    elif "DRAIN" in node.states:
        tier = 5
    else:
        tier = 3
    return Candidate(name, node, True, states, (tier, name))


def order_candidates(
    machines: Iterable[dict[str, Any]], nodes: Sequence[SlurmNode], never_registered: frozenset[str] = frozenset()
) -> tuple[list[Candidate], list[Candidate]]:
    """(eligible Machines in the order to remove them, ineligible ones with why)."""
    eligible: list[Candidate] = []
    ineligible: list[Candidate] = []
    for machine in machines:
        candidate = classify(machine, nodes, never_registered)
        (eligible if candidate.eligible else ineligible).append(candidate)
    eligible.sort(key=lambda c: c.rank)
    ineligible.sort(key=lambda c: c.machine)
    return eligible, ineligible


def choose_victims(
    machines: Iterable[dict[str, Any]],
    nodes: Sequence[SlurmNode],
    count: int,
    never_registered: frozenset[str] = frozenset(),
) -> tuple[list[Candidate], list[Candidate]]:
    """Up to ``count`` safe victims, and the ineligible Machines (to say why fewer). ``never_registered``: the
    Machines machine health judged never registered (slurmHealth), removed first."""
    eligible, ineligible = order_candidates(machines, nodes, never_registered)
    return eligible[: max(0, count)], ineligible
