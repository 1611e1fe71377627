"""Settings of the injection webhook (flags and ``SLIME_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field, field_validator

from common.meta import label_selector_problem
from common.settings import ServiceSettings

DEFAULT_CONTROLLER_SELECTOR = "app.kubernetes.io/name=slurmctld,app.kubernetes.io/component=controller"


class InjectionSettings(ServiceSettings):
    controller_selector: str = Field(
        DEFAULT_CONTROLLER_SELECTOR,
        min_length=1,
        description="Label selector of the slurmctld pod and StatefulSet (older Slinky and the thesis: app.kubernetes.io/name=slurm-ctld).",
    )
    cache_sync_timeout_seconds: float = Field(
        3.0, gt=0, le=25,
        description="How long a first admission for a new cluster or namespace waits for its caches; keep below the webhook timeout.",
    )

    @field_validator("controller_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        problem = label_selector_problem(value)
        if problem:
            raise ValueError(problem)
        return value
