"""One scale admission end to end: the pure decision, the side effect, the Event, one outcome.

:class:`ScaleAdmission` is the admission handler of the scaling webhook. It asks the pure
handler (:mod:`scaling_webhook.handler`) what the request wants, carries it out (one ``/scale``
patch, or safe scale-in for mappings that opted in), records the Event, and counts the outcome
once, where the answer is made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from common.admission import AdmissionResponse, allow
from scaling_webhook.errors import ScaleError
from scaling_webhook.events import REASON_SCALED, EventRecorder, ScaleEvent
from scaling_webhook.handler import DryRun, Invalid, ScaleIntent, respond, scale_intent
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import MappingTable
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.safe_scale_in.service import SafeScaleIn

# Slack over the patch budget for the worker thread hand-off, before we stop waiting.
BUDGET_SLACK_SECONDS = 0.1
# Safe scale-in makes several calls (Machines, slurmrestd, patches): allow it twice the budget
# (4 s with the defaults, under the webhook's 5 s timeout) before answering and letting it finish.
SAFE_BUDGET_FACTOR = 2.0

Outcome = str  # one of scaling_webhook.metrics.DECISION_OUTCOMES


class ScaleAdmission:
    """The scaling webhook's admission handler (an ``AdmissionHandler``)."""

    def __init__(
        self,
        table: Callable[[], MappingTable],
        scaler: MachineDeploymentScaler,
        events: EventRecorder,
        metrics: ScalingMetrics,
        budget: float,
        safe: SafeScaleIn | None = None,
    ) -> None:
        self.table = table
        self.scaler = scaler
        self.events = events
        self.metrics = metrics
        self.budget = budget
        self.safe = safe

    async def __call__(self, request: dict[str, Any]) -> AdmissionResponse:
        outcome, response = await self._admit(request)
        self.metrics.outcome[outcome].inc()
        return response

    async def _admit(self, request: dict[str, Any]) -> tuple[Outcome, AdmissionResponse]:
        decision = scale_intent(request, self.table())
        if decision is None:
            return "unmapped", allow()
        if isinstance(decision, Invalid):
            return "denied", respond(decision)
        if isinstance(decision, DryRun):
            return "dry_run", respond(decision)
        if self.safe is not None and decision.mapping.safe_scale_in is not None:
            return await self._safe_scale(self.safe, decision)
        return await self._scale(decision)

    async def _scale(self, intent: ScaleIntent) -> tuple[Outcome, AdmissionResponse]:
        started = time.perf_counter()
        try:
            await asyncio.wait_for(
                asyncio.to_thread(self.scaler.set_replicas, intent.namespace, intent.name, intent.replicas, self.budget),
                self.budget + BUDGET_SLACK_SECONDS,
            )
        except ScaleError as exc:
            return "denied", respond(intent, exc.cause, exc.code)
        except TimeoutError:
            # The patch may still land; the reconciler then sets the MachineDeployment back to the mirror.
            return "denied", respond(intent, f"the API server did not answer within {self.budget:g}s", 503)
        finally:
            self.metrics.patch_seconds.observe(time.perf_counter() - started)
        mapping = intent.mapping
        self.events.record(
            ScaleEvent.on(
                mapping.machine_deployment, self.scaler.api_version, REASON_SCALED,
                f"Set replicas to {intent.replicas} from mirror Deployment {mapping.mirror_ref}",
            )
        )
        return "scaled", respond(intent)

    async def _safe_scale(self, safe: SafeScaleIn, intent: ScaleIntent) -> tuple[Outcome, AdmissionResponse]:
        """Opted-in mapping: drain and mark victims before lowering (docs/scaling.md, "Safe scale-in").

        Slurm trouble or too few idle nodes never deny: the mirror may go to the new value and
        the reconciler converges the MachineDeployment as nodes become idle.
        """
        started = time.perf_counter()
        limit = SAFE_BUDGET_FACTOR * self.budget
        task = asyncio.ensure_future(asyncio.to_thread(safe.apply, intent.mapping, intent.replicas))
        ref = intent.mapping.machine_deployment_ref
        try:
            result = await asyncio.wait_for(asyncio.shield(task), limit)
        except ScaleError as exc:
            return "denied", respond(intent, exc.cause, exc.code)
        except TimeoutError:
            return "scaled", allow(f"safe scale-in of MachineDeployment {ref} to {intent.replicas} "
                                   f"still running after {limit:g}s; it continues, and the reconciler finishes it")
        finally:
            self.metrics.patch_seconds.observe(time.perf_counter() - started)
        return "scaled", allow(f"MachineDeployment {ref} (safe scale-in, target {intent.replicas}): {result.message}")
