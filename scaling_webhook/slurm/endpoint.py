"""Where a mapping's Slurm is: the slurmrestd endpoint every Slurm opt-in names (``safeScaleIn``,
``nodeDemand``, ``slurmHealth``), and the API versions the client speaks."""

from __future__ import annotations

from dataclasses import dataclass

Ref = tuple[str, str]  # (namespace, name): the same shape as scaling_webhook.mappings.Ref

# The slurmrestd API versions the client speaks, newest first: the order in which it probes.
# v0.0.42: Slurm 24.11 (its newest; 26.11 removes it), v0.0.43: 25.05 (deprecated by 26.11, gone
# in 27.05), v0.0.44: 25.11, v0.0.45: 26.05, v0.0.46: 26.11. Each release serves a few older
# ones too; the newest served is used (docs/scaling.md, "Which slurmrestd versions").
SLURM_API_VERSIONS = ("v0.0.46", "v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42")


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
