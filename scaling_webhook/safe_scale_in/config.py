"""What a mapping says about Slurm: its ``safeScaleIn`` block, and the slurmrestd endpoint that
block shares with ``nodeDemand`` (:mod:`scaling_webhook.demand`).

The ConfigMap parser (:mod:`scaling_webhook.mappings`) validates the blocks and builds these
objects (with :func:`parse_released_nodes` for ``safeScaleIn.releasedNodes``); everything in
this package reads only them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Ref = tuple[str, str]  # (namespace, name): the same shape as scaling_webhook.mappings.Ref

# The slurmrestd API versions the client speaks, newest first: the order in which it probes.
# v0.0.42: Slurm 24.11 (its newest; 26.11 removes it), v0.0.43: 25.05 (deprecated by 26.11, gone
# in 27.05), v0.0.44: 25.11, v0.0.45: 26.05, v0.0.46: 26.11. Each release serves a few older
# ones too; the newest served is used (docs/scaling.md, "Which slurmrestd versions").
SLURM_API_VERSIONS = ("v0.0.46", "v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42")

# What becomes of the Slurm node of a released Machine (``safeScaleIn.releasedNodes``):
# ``future`` returns it to FUTURE, so slurmctld keeps its record: a job as big as the pool is
# still accepted and queues after the pool scaled in to 0, and the host's next ``slurmd -Z`` of
# that name takes the record again. ``delete`` deletes the record, for pools whose host names
# never come back (each kept record would count towards the partition and MaxNodeCount for good).
RELEASED_NODES = ("future", "delete")
DEFAULT_RELEASED_NODES = "future"


@dataclass(frozen=True, slots=True)
class SlurmEndpoint:
    """Where slurmrestd answers and how to sign a token for it (validated)."""

    slurmrestd: str  # base URL, http(s)://host:port
    jwt_secret: Ref  # (namespace, name) of the Secret holding the HS256 signing key
    jwt_key: str = "jwt_hs256.key"
    api_version: str | None = None  # None: probe newest first
    token_user: str = "slurm"

    @property
    def endpoint(self) -> SlurmEndpoint:
        """Just the connection: equal for two blocks that talk to the same slurmrestd as the same user."""
        return SlurmEndpoint(self.slurmrestd, self.jwt_secret, self.jwt_key, self.api_version, self.token_user)


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


@dataclass(frozen=True, slots=True)
class NodeDemandConfig(SlurmEndpoint):
    """One mapping's node-demand source: the Slurm partition whose work its pool serves."""

    partition: str = ""
