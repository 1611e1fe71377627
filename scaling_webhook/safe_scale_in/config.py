"""The opt-in of one mapping to Slurm-aware scale-in: what the ``safeScaleIn`` block says.

The ConfigMap parser (:mod:`scaling_webhook.mappings`) validates the block and builds a
:class:`SafeScaleInConfig`; everything in this package reads only this object.
"""

from __future__ import annotations

from dataclasses import dataclass

Ref = tuple[str, str]  # (namespace, name): the same shape as scaling_webhook.mappings.Ref

# The slurmrestd API versions the client speaks, newest first: the order in which it probes.
SLURM_API_VERSIONS = ("v0.0.44", "v0.0.43", "v0.0.42")


@dataclass(frozen=True, slots=True)
class SafeScaleInConfig:
    """One mapping's safe scale-in settings (validated)."""

    slurmrestd: str  # base URL, http(s)://host:port
    jwt_secret: Ref  # (namespace, name) of the Secret holding the HS256 signing key
    jwt_key: str = "jwt_hs256.key"
    api_version: str | None = None  # None: probe newest first
    # After this long held for a node that is still busy: Warning Events and a metric. Never a
    # release: a busy node is never let go, however long it takes (None: no warnings).
    drain_timeout_seconds: float | None = None
    token_user: str = "slurm"
