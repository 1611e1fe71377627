"""App factory of the scaling webhook: ``POST /validate`` over the shared admission transport."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from common.admission import AdmissionResponse, allow
from common.metrics import WebhookMetrics
from common.webhook import AdmissionEndpoint, admission_app
from scaling_webhook.events import REASON_SCALED, EventRecorder, ScaleEvent
from scaling_webhook.handler import DryRun, Invalid, ScaleIntent, respond, scale_intent
from scaling_webhook.machinedeployments import MachineDeploymentScaler, ScaleError
from scaling_webhook.mappings import MappingTable
from scaling_webhook.metrics import ScalingMetrics

WEBHOOK_NAME = "scaling"
PATH = "/validate"
# Slack over the patch budget for the worker thread hand-off, before we stop waiting.
BUDGET_SLACK_SECONDS = 0.1

log = logging.getLogger("slime.scaling")


def make_handler(
    table: Callable[[], MappingTable],
    scaler: MachineDeploymentScaler,
    events: EventRecorder,
    metrics: ScalingMetrics,
    budget: float,
) -> Any:
    outcome = metrics.outcome

    async def handle(request: dict[str, Any]) -> AdmissionResponse:
        decision = scale_intent(request, table())
        if decision is None:
            outcome["unmapped"].inc()
            return allow()
        if isinstance(decision, Invalid):
            outcome["denied"].inc()
            return respond(decision)
        if isinstance(decision, DryRun):
            outcome["dry_run"].inc()
            return respond(decision)
        return await _scale(decision)

    async def _scale(intent: ScaleIntent) -> AdmissionResponse:
        started = time.perf_counter()
        try:
            await asyncio.wait_for(
                asyncio.to_thread(scaler.set_replicas, intent.namespace, intent.name, intent.replicas, budget),
                budget + BUDGET_SLACK_SECONDS,
            )
        except ScaleError as exc:
            outcome["denied"].inc()
            return respond(intent, exc.cause, exc.code)
        except asyncio.TimeoutError:
            # The patch may still land; the reconciler then sets the MachineDeployment back to the mirror.
            outcome["denied"].inc()
            return respond(intent, f"the API server did not answer within {budget:g}s", 503)
        finally:
            metrics.patch_seconds.observe(time.perf_counter() - started)
        outcome["scaled"].inc()
        mapping = intent.mapping
        events.record(
            ScaleEvent(
                namespace=intent.namespace,
                name=intent.name,
                api_version=scaler.api_version,
                reason=REASON_SCALED,
                message=f"Set replicas to {intent.replicas} from mirror Deployment {mapping.mirror_ref}",
            )
        )
        return respond(intent)

    return handle


def create_app(handler: Any, metrics: WebhookMetrics, max_body_bytes: int) -> Any:
    endpoint = AdmissionEndpoint(WEBHOOK_NAME, handler, metrics, max_body_bytes)
    return admission_app("SliMe scaling webhook", PATH, endpoint)
