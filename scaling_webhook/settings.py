"""Settings of the scaling webhook (flags, ``SLIME_*`` environment variables and ``POD_NAMESPACE``).

Its default ports (8444, 8081) differ from the injection webhook's (8443, 8080), so both run side
by side on one machine as the README's "running against a real cluster" steps show. The chart
sets the ports explicitly.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator

from common.meta import is_dns1123_label, is_dns1123_subdomain
from common.settings import ServiceSettings

DEFAULT_CONFIG_MAP = "scaling-webhook-configmap"


class ScalingSettings(ServiceSettings):
    port: int = Field(8444, ge=1, le=65535, description="TLS port of the admission endpoint.")
    metrics_port: int = Field(8081, ge=1, le=65535, description="Plain-HTTP port for /healthz, /readyz and /metrics.")
    config_map: str = Field(
        DEFAULT_CONFIG_MAP,
        description="Name of the ConfigMap holding the mirror -> MachineDeployment mappings (in --namespace).",
    )
    namespace: str = Field(
        "default",
        validation_alias=AliasChoices("POD_NAMESPACE"),
        description="The webhook's own namespace: where the ConfigMap lives, and the default mirror namespace.",
    )
    resync_seconds: float = Field(30.0, gt=0, description="Period of the reconciler that heals MachineDeployment drift.")
    patch_timeout_seconds: float = Field(
        2.0, gt=0, le=25,
        description="Budget of the MachineDeployment /scale patch on the admission path; keep below the webhook timeout.",
    )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not is_dns1123_label(value):
            raise ValueError(f"{value!r} is not a valid namespace name (DNS-1123 label: lower case letters, digits and '-', at most 63)")
        return value

    @field_validator("config_map")
    @classmethod
    def _config_map(cls, value: str) -> str:
        if not is_dns1123_subdomain(value):
            raise ValueError(f"{value!r} is not a valid ConfigMap name (DNS-1123 subdomain: lower case letters, digits, '-' and '.', at most 253)")
        return value
