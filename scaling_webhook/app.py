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
from scaling_webhook.safe_scale_in import SafeScaleIn

WEBHOOK_NAME = "scaling"
PATH = "/validate"
# Slack over the patch budget for the worker thread hand-off, before we stop waiting.
BUDGET_SLACK_SECONDS = 0.1
# Safe scale-in makes several calls (Machines, slurmrestd, patches): allow it twice the budget
# (4 s with the defaults, under the webhook's 5 s timeout) before answering and letting it finish.
SAFE_BUDGET_FACTOR = 2.0

log = logging.getLogger("slime.scaling")


def make_handler(
    table: Callable[[], MappingTable],
    scaler: MachineDeploymentScaler,
    events: EventRecorder,
    metrics: ScalingMetrics,
    budget: float,
    safe: SafeScaleIn | None = None,
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

    async def _safe_scale(intent: ScaleIntent) -> AdmissionResponse:
        """Opted-in mapping: drain and mark victims before lowering (docs/scaling.md, "Safe scale-in").

        Slurm trouble or too few idle nodes never deny: the mirror may go to the new value and
        the reconciler converges the MachineDeployment as nodes become idle.
        """
        assert safe is not None
        started = time.perf_counter()
        limit = SAFE_BUDGET_FACTOR * budget
        task = asyncio.ensure_future(asyncio.to_thread(safe.apply, intent.mapping, intent.replicas))
        try:
            result = await asyncio.wait_for(asyncio.shield(task), limit)
        except ScaleError as exc:
            outcome["denied"].inc()
            return respond(intent, exc.cause, exc.code)
        except asyncio.TimeoutError:
            outcome["scaled"].inc()
            return allow(f"safe scale-in of MachineDeployment {intent.mapping.machine_deployment_ref} to {intent.replicas} "
                         f"still running after {limit:g}s; it continues, and the reconciler finishes it")
        finally:
            metrics.patch_seconds.observe(time.perf_counter() - started)
        outcome["scaled"].inc()
        return allow(f"MachineDeployment {intent.mapping.machine_deployment_ref} (safe scale-in, target {intent.replicas}): {result.message}")

    async def _scale(intent: ScaleIntent) -> AdmissionResponse:
        if safe is not None and intent.mapping.safe_scale_in is not None:
            return await _safe_scale(intent)
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
            ScaleEvent.on(
                mapping.machine_deployment, scaler.api_version, REASON_SCALED,
                f"Set replicas to {intent.replicas} from mirror Deployment {mapping.mirror_ref}",
            )
        )
        return respond(intent)

    return handle


def create_app(handler: Any, metrics: WebhookMetrics, max_body_bytes: int) -> Any:
    endpoint = AdmissionEndpoint(WEBHOOK_NAME, handler, metrics, max_body_bytes)
    return admission_app("SliMe scaling webhook", PATH, endpoint)
