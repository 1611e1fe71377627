"""Settings of the scaling webhook (flags, ``SLIME_*`` environment variables and ``POD_NAMESPACE``).

Its default ports (8444, 8081) differ from the injection webhook's (8443, 8080), so both run side
by side on one machine as the README's "running against a real cluster" steps show. The chart
sets the ports explicitly.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator, model_validator

from common.meta import is_dns1123_label, is_dns1123_subdomain
from common.settings import ServiceSettings

DEFAULT_CONFIG_MAP = "scaling-webhook-configmap"


class ScalingSettings(ServiceSettings):
    port: int = Field(8444, ge=1, le=65535, description="TLS port of the admission endpoint.")
    metrics_port: int = Field(8081, ge=1, le=65535, description="Plain-HTTP port for /healthz, /readyz and /metrics.")
    config_map: str = Field(
        DEFAULT_CONFIG_MAP,
        description="Name of the ConfigMap holding the mirror -> MachineDeployment mappings (in --namespace).",
        json_schema_extra={"metavar": "NAME"},
    )
    namespace: str = Field(
        "default",
        validation_alias=AliasChoices("POD_NAMESPACE"),
        description="The webhook's own namespace: where the ConfigMap lives, and the default mirror namespace.",
        json_schema_extra={"metavar": "NAME"},
    )
    resync_seconds: float = Field(
        30.0, gt=0, description="Period of the reconciler that heals MachineDeployment drift."
    )
    patch_timeout_seconds: float = Field(
        2.0,
        gt=0,
        le=25,
        description="Timeout of one MachineDeployment /scale patch and of the admission's mirror read.",
    )
    leader_election: bool = Field(
        True,
        description="Elect one writer among the replicas with a Lease (turn off only when a single replica runs).",
    )
    lease_name: str = Field(
        "slime-scaling-webhook",
        description="Name of the coordination.k8s.io Lease, in --namespace, that elects the one writer.",
    )
    lease_duration_seconds: float = Field(
        15.0,
        gt=0,
        le=300,
        description="How long a Lease nobody renews stays held before another replica takes it (client-go's default).",
    )
    lease_renew_deadline_seconds: float = Field(
        10.0,
        gt=0,
        description=(
            "The leader stops writing this long after its last renewal; must be shorter than the lease duration."
        ),
    )
    lease_retry_seconds: float = Field(2.0, gt=0, description="How often replicas try to take or renew the Lease.")
    scale_requesters: str = Field(
        "",
        description="Comma list of the users (request.userInfo.username) allowed to scale mapped mirrors, e.g. KEDA's "
        "operator; empty (default): whoever the API server authorized. Others are refused 403.",
    )
    demand_interval_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description=(
            "How often node demand is read from slurmrestd, for mappings with nodeDemand (an older reading is served "
            "for 3 periods)."
        ),
    )

    def scale_requester_set(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.scale_requesters.split(",") if name.strip())

    @model_validator(mode="after")
    def _lease_timing(self) -> ScalingSettings:
        if not self.lease_retry_seconds < self.lease_renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "need --lease-retry-seconds < --lease-renew-deadline-seconds < --lease-duration-seconds, got "
                f"{self.lease_retry_seconds:g}, {self.lease_renew_deadline_seconds:g}, {self.lease_duration_seconds:g}"
            )
        return self

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not is_dns1123_label(value):
            raise ValueError(
                f"{value!r} is not a valid namespace name (DNS-1123 label: lower case letters, digits and '-', at "
                "most 63)"
            )
        return value

    @field_validator("config_map", "lease_name")
    @classmethod
    def _config_map(cls, value: str) -> str:
        if not is_dns1123_subdomain(value):
            raise ValueError(
                f"{value!r} is not a valid object name (DNS-1123 subdomain: lower case letters, digits, '-' and '.', "
                "at most 253)"
            )
        return value
