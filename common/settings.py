"""Configuration shared by both services: flags, each with an environment twin.

pydantic-settings gives one typed definition for three sources (defaults, ``SLIME_*``
environment variables, ``--kebab-case`` flags) and clear errors naming the bad field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.admission import DEFAULT_MAX_BODY_BYTES


class ServiceSettings(BaseSettings):
    """Settings every webhook process has."""

    model_config = SettingsConfigDict(
        env_prefix="SLIME_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
    )

    host: str = Field("0.0.0.0", description="Address both ports listen on.")
    port: int = Field(8443, ge=0, le=65535, description="TLS port of the admission endpoint.")
    metrics_port: int = Field(8080, ge=0, le=65535, description="Plain-HTTP port for /healthz, /readyz and /metrics.")
    cert_file: str = Field("/tls/tls.crt", description="PEM serving certificate (chain); reloaded when it changes.")
    key_file: str = Field("/tls/tls.key", description="PEM private key of the serving certificate.")
    cert_poll_seconds: float = Field(10.0, gt=0, le=10, description="Backstop poll for certificate changes (at most 10 s).")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024, description="Largest accepted AdmissionReview body.")
    shutdown_delay_seconds: float = Field(0.0, ge=0, description="Stay up, not ready, this long after SIGTERM so endpoints drain.")
    log_level: str = Field("INFO", pattern="^(?i)(debug|info|warning|error)$", description="Log level.")
    kubeconfig: str | None = Field(
        None,
        validation_alias="KUBECONFIG",
        description="kubeconfig file; default: in-cluster config, else ~/.kube/config.",
    )

    @classmethod
    def from_args(cls, args: Sequence[str] | None, prog: str) -> Self:
        """Parse flags (``None``: the process's own) over env over defaults."""
        return cls(_cli_parse_args=list(args) if args is not None else True, _cli_prog_name=prog)  # type: ignore[call-arg]
