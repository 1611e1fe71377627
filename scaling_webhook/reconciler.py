"""Level-triggered healing: every mapped MachineDeployment ends with its mirror's replicas.

Admissions can be missed: the webhook was down and the API server failed open, a patch landed
after the admission was denied for slowness, or another validating webhook denied the scale
after we applied it. The reconciler runs at start, on every mapping change and every
``resync_seconds``. For each mapping it reads the mirror Deployment as persisted and the
MachineDeployment, and when they differ sets the MachineDeployment with the same absolute
``/scale`` merge patch as the admission path.

Safety with 2+ replicas of the service: every write is an absolute value read from the
persisted mirror, so writers can only disagree while the mirror itself is changing. A mirror
scale is validated (and our patch made) *before* the API server persists it, so a reconciler
could read the old mirror just after the admission path set the new value. To stay out of that
window, a drift is corrected only when it is still there after ``settle_seconds`` with the
mirror unchanged (same resourceVersion). A mirror that does not exist is never read as 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scaling_webhook.errors import ScaleError
from scaling_webhook.events import REASON_DRIFT, EventRecorder, ScaleEvent
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import Mapping, MappingSource
from scaling_webhook.metrics import ScalingMetrics

if TYPE_CHECKING:
    from scaling_webhook.safe_scale_in.service import SafeScaleIn

log = logging.getLogger("slime.scaling.reconciler")


@dataclass(frozen=True, slots=True)
class Drift:
    mapping: Mapping
    mirror_version: str
    mirror_replicas: int
    machine_deployment_replicas: int | None


class Reconciler:
    def __init__(
        self,
        source: MappingSource,
        scaler: MachineDeploymentScaler,
        events: EventRecorder,
        metrics: ScalingMetrics,
        resync_seconds: float,
        settle_seconds: float = 1.0,
        safe: SafeScaleIn | None = None,
    ) -> None:
        self.safe = safe  # Slurm-aware scale-in of mappings that opted in (safeScaleIn)
        self.source = source
        self.scaler = scaler
        self.events = events
        self.metrics = metrics
        self.resync_seconds = resync_seconds
        self.settle_seconds = settle_seconds
        self._lock = threading.Lock()  # one pass at a time in this process
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.passes = 0

    # --- one pass (blocking; runs in a worker thread) ----------------------------------------

    def reconcile_once(self) -> list[Drift]:
        """Check every mapping now; return the drifts corrected."""
        with self._lock:
            for mapping in self.source.table:
                self._maintain(mapping)
            drifts = [d for m in self.source.table if (d := self._observe(m)) is not None]
            corrected = []
            if drifts and self.settle_seconds:
                time.sleep(self.settle_seconds)
            for drift in drifts:
                if self._correct(drift):
                    corrected.append(drift)
            self.passes += 1
            return corrected

    def _mirror(self, mapping: Mapping) -> tuple[str, int] | None:
        found = self.scaler.get_mirror(*mapping.mirror)
        if found is None:
            log.warning(
                "mirror Deployment not found; its MachineDeployment is left as it is",
                extra={"mirror": mapping.mirror_ref, "machinedeployment": mapping.machine_deployment_ref},
            )
        return found

    def _observe(self, mapping: Mapping) -> Drift | None:
        try:
            mirror = self._mirror(mapping)
            if mirror is None:
                return None
            current = self.scaler.get_replicas(*mapping.machine_deployment)
        except ScaleError as exc:
            self._failed(mapping, exc)
            return None
        version, replicas = mirror
        if current == replicas:
            return None
        return Drift(mapping, version, replicas, current)

    def _correct(self, drift: Drift) -> bool:
        mapping = drift.mapping
        try:
            mirror = self._mirror(mapping)
            if mirror is None:
                return False
            if mirror[0] != drift.mirror_version:
                # The mirror moved while we looked: the admission path is handling it. Next pass.
                log.info("mirror changed during reconcile; deferring", extra={"mirror": mapping.mirror_ref})
                return False
            current = self.scaler.get_replicas(*mapping.machine_deployment)
            if current == mirror[1]:
                return False
            if self.safe is not None and mapping.safe_scale_in is not None:
                outcome = self.safe.apply(mapping, mirror[1])
                if outcome.replicas is None:
                    return False  # deferred or Slurm unusable: the Events say why; next pass
                self.metrics.drift_corrections.inc()
                log.info("safe scale-in reconcile", extra={"machinedeployment": mapping.machine_deployment_ref, "outcome": outcome.message})
                return True
            self.scaler.set_replicas(*mapping.machine_deployment, mirror[1], timeout=max(self.scaler.timeout, 5.0))
        except ScaleError as exc:
            self._failed(mapping, exc)
            return False
        self.metrics.drift_corrections.inc()
        log.warning(
            "MachineDeployment drifted from its mirror; corrected",
            extra={
                "mirror": mapping.mirror_ref,
                "machinedeployment": mapping.machine_deployment_ref,
                "was": current,
                "replicas": mirror[1],
            },
        )
        self.events.record(
            ScaleEvent.on(
                mapping.machine_deployment, self.scaler.api_version, REASON_DRIFT,
                f"Set replicas to {mirror[1]} (was {current if current is not None else 'unset'}) "
                f"to match mirror Deployment {mapping.mirror_ref}",
            )
        )
        return True

    def _maintain(self, mapping: Mapping) -> None:
        """Safe scale-in: pre-drain hooks and deleting Machines (every pass, drift or not)."""
        if self.safe is None or mapping.safe_scale_in is None:
            return
        try:
            self.safe.maintain(mapping)
        except ScaleError as exc:
            self._failed(mapping, exc)

    def _failed(self, mapping: Mapping, exc: ScaleError) -> None:
        self.metrics.reconcile_errors.inc()
        log.warning(
            "cannot reconcile MachineDeployment with its mirror",
            extra={"mirror": mapping.mirror_ref, "machinedeployment": mapping.machine_deployment_ref, "error": exc.cause},
        )

    # --- the loop ---------------------------------------------------------------------------------

    def trigger(self) -> None:
        """Ask for a pass soon (thread-safe; the mapping source calls it on every change)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(wake.set)

    async def run(self, stop: asyncio.Event) -> None:
        """A ServiceRunner background task: a pass at start, on triggers and every resync period."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while not stop.is_set() and not self.source.loaded:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
        while not stop.is_set():
            self._wake.clear()
            try:
                await asyncio.to_thread(self._discover_and_reconcile)
            except Exception:
                log.exception("reconcile pass failed")
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(waiters, timeout=self.resync_seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    def _discover_and_reconcile(self) -> None:
        try:
            self.scaler.resource_path()  # warm discovery so admissions make one call
        except ScaleError as exc:
            log.warning("cannot discover the MachineDeployment API version", extra={"error": exc.cause})
            self.metrics.reconcile_errors.inc()
            return
        self.reconcile_once()
