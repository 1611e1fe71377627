"""A mapping's ``safeScaleIn`` block as a validated object.

The ConfigMap parser (:mod:`scaling_webhook.mappings`) validates the block and builds it (with
:func:`parse_released_nodes` for ``safeScaleIn.releasedNodes``); everything in this package
reads only it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaling_webhook.slurm.endpoint import SlurmEndpoint

# What becomes of the Slurm node of a released Machine (``safeScaleIn.releasedNodes``):
# ``future`` returns it to FUTURE, so slurmctld keeps its record: a job as big as the pool is
# still accepted and queues after the pool scaled in to 0, and the host's next ``slurmd -Z`` of
# that name takes the record again. ``delete`` deletes the record, for pools whose host names
# never come back (each kept record would count towards the partition and MaxNodeCount for good).
RELEASED_NODES = ("future", "delete")
DEFAULT_RELEASED_NODES = "future"


@dataclass(frozen=True, slots=True)
class SafeScaleInConfig(SlurmEndpoint):
    """One mapping's safe scale-in settings (validated)."""

    # After this long held for a node that is still busy: Warning Events and a metric. Never a
    # release: a busy node is never let go, however long it takes (None: no warnings).
    drain_timeout_seconds: float | None = None
    # What a released node becomes in Slurm: one of RELEASED_NODES.
    released_nodes: str = DEFAULT_RELEASED_NODES


def parse_released_nodes(value: Any, where: str) -> str:
    """``safeScaleIn.releasedNodes`` (``where`` names it): ``future`` (default when None) or ``delete``;
    ValueError otherwise."""
    if value is None:
        return DEFAULT_RELEASED_NODES
    if not isinstance(value, str) or value.strip() not in RELEASED_NODES:
        raise ValueError(
            f"{where}: {value!r} is not one of {', '.join(RELEASED_NODES)} (future keeps the released node's "
            "record in Slurm as FUTURE, delete removes it)"
        )
    return value.strip()
