"""Settings of the scaling webhook (flags, ``SLIME_*`` environment variables and ``POD_NAMESPACE``)."""

from __future__ import annotations

from pydantic import AliasChoices, Field

from common.settings import ServiceSettings

DEFAULT_CONFIG_MAP = "scaling-webhook-configmap"


class ScalingSettings(ServiceSettings):
    config_map: str = Field(
        DEFAULT_CONFIG_MAP,
        min_length=1,
        max_length=253,
        description="Name of the ConfigMap holding the mirror -> MachineDeployment mappings (in --namespace).",
    )
    namespace: str = Field(
        "default",
        min_length=1,
        max_length=63,
        validation_alias=AliasChoices("namespace", "POD_NAMESPACE"),
        description="The webhook's own namespace (env POD_NAMESPACE): where the ConfigMap lives, and the default mirror namespace.",
    )
    resync_seconds: float = Field(30.0, gt=0, description="Period of the reconciler that heals MachineDeployment drift.")
    patch_timeout_seconds: float = Field(
        2.0, gt=0, le=25,
        description="Budget of the MachineDeployment /scale patch on the admission path; keep below the webhook timeout.",
    )
