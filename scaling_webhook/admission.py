"""One scale admission: find the mapping, check the review against the watches, answer, count once.

:class:`ScaleAdmission` is the admission handler of the scaling webhook. It makes no write and,
with warm caches, no API call: the MachineDeployment follows the mirror only once the API
server has stored it (the leader's reconciler, woken by the mirror's watch). When the review's
``oldObject`` disagrees with the cached mirror (the cache may be a watch event behind), it reads
the mirror once from the API server before it decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from common.admission import AdmissionResponse, allow, requester
from common.kube import KubeError
from scaling_webhook.decision import (
    Accepted,
    DryRun,
    Invalid,
    Observed,
    Recheck,
    Refused,
    decide,
    refused_requester,
    respond,
    scale_target,
)
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import Mapping, MappingTable
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.watches import MappedObjects

_OUTCOMES: dict[type, str] = {Accepted: "accepted", DryRun: "dry_run", Invalid: "denied", Refused: "denied"}


class ScaleAdmission:
    """The scaling webhook's admission handler (an ``AdmissionHandler``)."""

    def __init__(
        self,
        table: Callable[[], MappingTable],
        objects: MappedObjects,
        scaler: MachineDeploymentScaler,
        metrics: ScalingMetrics,
        allowed_requesters: frozenset[str] = frozenset(),
    ) -> None:
        self.table = table
        self.objects = objects
        self.scaler = scaler
        self.metrics = metrics
        self.allowed_requesters = allowed_requesters

    def _observed(self, mapping: Mapping) -> Observed | None:
        if not self.objects.synced(mapping):
            return None
        return Observed(
            self.objects.mirror(mapping), self.objects.machine_deployment(mapping), self.objects.cluster(mapping)
        )

    def _fresh(self, mapping: Mapping, cached: Observed | None) -> Observed | None:
        try:
            mirror = self.scaler.read_mirror(*mapping.mirror)
        except KubeError:
            return None  # cannot tell: answered as not synced (503), the scaler retries
        md = cached.machine_deployment if cached else None
        return Observed(mirror, md, cached.cluster if cached else None, fresh=True)

    async def __call__(self, request: dict[str, Any]) -> AdmissionResponse:
        mapping = scale_target(request, self.table())
        if mapping is None:
            self.metrics.outcome["unmapped"].inc()
            return allow()
        self.metrics.count_requester(requester(request))
        not_allowed = refused_requester(request, mapping, self.allowed_requesters)
        if not_allowed is not None:
            self.metrics.outcome["denied"].inc()
            return respond(not_allowed)
        observed = self._observed(mapping)
        decision = decide(request, mapping, observed)
        if isinstance(decision, Recheck):
            decision = decide(request, mapping, await asyncio.to_thread(self._fresh, mapping, observed))
            assert not isinstance(decision, Recheck), "a fresh read is decided for good"
        self.metrics.outcome[_OUTCOMES[type(decision)]].inc()
        if isinstance(decision, Accepted) and decision.capped:
            self.metrics.capped_admissions.inc()
        return respond(decision)
