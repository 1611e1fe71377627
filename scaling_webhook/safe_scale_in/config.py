"""What a mapping says about Slurm: its ``safeScaleIn`` block, and the slurmrestd endpoint that
block shares with ``nodeDemand`` (:mod:`scaling_webhook.demand`).

The ConfigMap parser (:mod:`scaling_webhook.mappings`) validates the blocks and builds these
objects; everything in this package reads only them.
"""

from __future__ import annotations

from dataclasses import dataclass

Ref = tuple[str, str]  # (namespace, name): the same shape as scaling_webhook.mappings.Ref

# The slurmrestd API versions the client speaks, newest first: the order in which it probes.
SLURM_API_VERSIONS = ("v0.0.44", "v0.0.43", "v0.0.42")


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


@dataclass(frozen=True, slots=True)
class NodeDemandConfig(SlurmEndpoint):
    """One mapping's node-demand source: the Slurm partition whose work its pool serves."""

    partition: str = ""
