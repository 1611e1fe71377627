"""Configuration shared by both services: flags, each with an environment twin, one typed definition.

pydantic-settings reads defaults and environment variables into one typed, validated model; the
flags are generated from the same fields (:mod:`common.cli`), so the help text, the variable
names and the checks cannot drift apart. A flag wins over its variable, a variable over the
default. Each field's variable is ``SLIME_<FIELD>`` unless the field names another (``KUBECONFIG``,
``POD_NAMESPACE``); :meth:`ServiceSettings.env_name` says which.
"""

from __future__ import annotations

import ipaddress
from typing import Literal, Self

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.admission import DEFAULT_MAX_BODY_BYTES


class ServiceSettings(BaseSettings):
    """Settings every webhook process has."""

    model_config = SettingsConfigDict(env_prefix="SLIME_", extra="ignore", populate_by_name=True)

    host: str = Field(
        "0.0.0.0",
        description="IP address both ports listen on (0.0.0.0 or :: for all).",
        json_schema_extra={"metavar": "ADDRESS"},
    )
    port: int = Field(8443, ge=1, le=65535, description="TLS port of the admission endpoint.")
    metrics_port: int = Field(8080, ge=1, le=65535, description="Plain-HTTP port for /healthz, /readyz and /metrics.")
    cert_file: str = Field(
        "/tls/tls.crt", min_length=1, description="PEM serving certificate (chain); reloaded when it changes."
    )
    key_file: str = Field("/tls/tls.key", min_length=1, description="PEM private key of the serving certificate.")
    client_ca_file: str | None = Field(
        None,
        min_length=1,
        description="PEM CA bundle: when set, every client of the admission port must present a certificate it signed "
        "(kube-apiserver's, see docs/install.md); reloaded when it changes.",
    )
    cert_poll_seconds: float = Field(
        10.0, gt=0, le=10, description="Backstop poll for certificate changes (at most 10 s)."
    )
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        le=7 * 1024 * 1024,
        description="Largest accepted AdmissionReview body; a larger one is refused (413) before it is read in full.",
    )
    read_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=60,
        description="A client must send each whole request (headers and body) within this long, else its connection "
        "is closed; also the TLS handshake's bound.",
    )
    max_connections: int = Field(
        512,
        ge=1,
        description="Open connections the admission port keeps; a new one past it takes the place of the longest idle "
        "(or stalled) one, else is closed at once.",
    )
    max_connections_per_peer: int = Field(
        64,
        ge=1,
        description="Open connections one peer address may hold on the admission port; past it the peer's own idle "
        "ones make room, else its new one is closed.",
    )
    max_body_bytes_in_flight: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Request body bytes all admissions together may hold while they are read and handled; a request "
        "that would pass it is answered 503 before its body is read.",
    )
    shutdown_delay_seconds: float = Field(
        0.0, ge=0, description="Stay up, not ready, this long after SIGTERM so endpoints drain."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level: debug, info, warning or error.", json_schema_extra={"metavar": "LEVEL"}
    )
    kubeconfig: str | None = Field(
        None,
        min_length=1,
        validation_alias=AliasChoices("KUBECONFIG"),
        description="kubeconfig file; default: in-cluster config, else ~/.kube/config.",
    )

    @field_validator("host")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _distinct_ports(self) -> Self:
        if self.port == self.metrics_port:
            raise ValueError(f"--port and --metrics-port are both {self.port}; they must differ")
        if self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ValueError(
                f"--max-body-bytes-in-flight ({self.max_body_bytes_in_flight}) is below --max-body-bytes "
                f"({self.max_body_bytes}): no request of the largest accepted size could be read"
            )
        return self

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable of ``field``."""
        alias = cls.model_fields[field].validation_alias
        if isinstance(alias, AliasChoices):
            return str(alias.choices[0])
        if isinstance(alias, str):
            return alias
        return f"{cls.model_config.get('env_prefix', '')}{field.upper()}"

    @classmethod
    def fields(cls) -> dict[str, FieldInfo]:
        return dict(cls.model_fields)
