"""The one writer: every mapped MachineDeployment follows its mirror as the API server stored it.

Only the replica that holds the Lease (:mod:`scaling_webhook.leader`) writes, and only from
watched, stored state (:mod:`scaling_webhook.watches`): a review, which may be forged or never
stored, moves nothing. A pass runs at start, on every watch event of a mapped mirror,
MachineDeployment or Cluster, on every mapping change, on gaining the Lease, and every
``resync_seconds``. For each mapping:

1. **Adopt, never reset.** A mirror not yet adopted for its MachineDeployment (annotation
   ``slime/machine-deployment``) is first set *to the MachineDeployment's* replicas, in one patch
   with the annotation: mapping a pool (or a fresh ``helm install`` whose mirror the API server
   defaulted to 1) never changes the pool. Removing a mapping leaves the MachineDeployment as it
   is and takes the annotation off, so mapping it again adopts again.
2. **Refuse a second writer.** A MachineDeployment that is a cluster-autoscaler node group is not
   touched (Warning Event, ``slime_scaling_waiting_mappings{reason="autoscaler"}``).
3. **Respect pauses.** A paused MachineDeployment or Cluster (``spec.paused`` or the
   ``cluster.x-k8s.io/paused`` annotation) is not written; the pass after the pause is lifted
   applies the change (Event ``WaitingForUnpause``, gauge ``reason="paused"``).
4. **Follow.** Target = the mirror's replicas, capped at the mapping's ``maxReplicas`` (Event
   ``ReplicasCapped``) and, for ``capacityAware`` mappings, an increase capped at the hosts that
   can take it (Event ``CapacityLimited``; :mod:`scaling_webhook.capacity`); a host becoming
   available wakes the reconciler, which raises the rest. When the MachineDeployment differs,
   set it: one absolute ``/scale`` merge patch, or safe scale-in for mappings that opted in.
   ``ScaledFromMirror`` when the mirror moved, ``DriftCorrected`` when the MachineDeployment had
   been changed by someone else.

Before any of it, a pool with ``slurmHealth`` has its Machines judged against Slurm and reported,
and unhealthy ones remediated unless it is paused (:mod:`scaling_webhook.machine_health`).

A mirror or MachineDeployment that does not exist is never read as 0: the mapping waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from common.events import EventRecorder, machine_deployment_event
from common.names import (
    ADOPTED_ANNOTATION,
    REASON_ADOPTED,
    REASON_AUTOSCALER,
    REASON_CAPACITY,
    REASON_CAPPED,
    REASON_DRIFT,
    REASON_PAUSED,
    REASON_SAFE_SCALE_IN_OFF,
    REASON_SAFE_SCALE_IN_OFF_WAITING,
    REASON_SCALED,
)
from scaling_webhook.capacity import CapacityUnknown
from scaling_webhook.decision import autoscaler_annotations, pause_reason, replicas_of, target_replicas
from scaling_webhook.errors import ScaleError
from scaling_webhook.leader import LeaderElector, NotLeader
from scaling_webhook.machine_health.service import MachineHealth
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import Mapping, MappingSource, MappingTable, Ref
from scaling_webhook.metrics import WAIT_REASONS, ScalingMetrics
from scaling_webhook.safe_scale_in.service import SafeScaleIn, Seen
from scaling_webhook.slurm.reads import SlurmReads
from scaling_webhook.watches import MappedObjects

log = logging.getLogger("slime.scaling.reconciler")

SYNC_WAIT_SECONDS = 5.0  # a pass waits this long for new watches to list once (then the next pass tries)
RETRY_SECONDS = (1.0, 30.0)  # after a failed write: retry after 1 s, doubling, at most 30 s (or the resync, if shorter)


@dataclass(frozen=True, slots=True)
class Change:
    """A write the reconciler made."""

    mapping: Mapping
    what: str  # "mirror", "drift" or "adopt" (the slime_scaling_writes_total reason)
    replicas: int


def _annotations(obj: dict[str, Any]) -> dict[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _version(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


class Wakeup:
    """Asks the reconciler for a pass soon. Made first and handed to every part whose changes matter
    (the watches, the mapping source, the elector), so none needs the reconciler itself; any thread may
    call it, with any arguments (each part passes what its callback carries)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def __call__(self, *_: object) -> None:
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(event.set)

    def attach(self) -> asyncio.Event:
        """The event the running loop's reconciler waits on (called once, from that loop)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        return self._event


class Reconciler:
    def __init__(
        self,
        source: MappingSource,
        objects: MappedObjects,
        scaler: MachineDeploymentScaler,
        events: EventRecorder,
        metrics: ScalingMetrics,
        resync_seconds: float,
        wakeup: Wakeup,
        reads: SlurmReads,
        leader: LeaderElector | None = None,
        safe: SafeScaleIn | None = None,
        health: MachineHealth | None = None,
    ) -> None:
        self.source = source
        self.objects = objects
        self.scaler = scaler
        self.events = events
        self.metrics = metrics
        self.resync_seconds = resync_seconds
        self.leader = leader
        self.reads = reads  # Slurm's node list, read once per pass for every Slurm opt-in
        self.safe = safe  # Slurm-aware scale-in of mappings that opted in (safeScaleIn)
        self.health = health  # Slurm-aware machine health of mappings that opted in (slurmHealth)
        self._lock = threading.Lock()  # one pass at a time in this process
        self.wakeup = wakeup
        self._applied: dict[Ref, int] = {}  # MachineDeployment -> the replicas this process last set
        self._told: dict[tuple[Ref, str], str] = {}  # (MachineDeployment, reason) -> message last recorded
        self._followed = MappingTable()
        self._leaving: dict[Ref, Mapping] = {}  # pools that left safe scale-in, with SliMe's hooks still to take off
        self._errors = 0  # failed mappings in the last pass
        self._shortfall = 0  # replicas capacityAware mappings could not have in the last pass
        self._retry_in = RETRY_SECONDS[0]
        self.passes = 0

    # --- one pass (blocking; runs in a worker thread) ----------------------------------------

    def fence(self) -> None:
        """Raise :class:`NotLeader` unless this replica may write (every write calls it first)."""
        if self.leader is not None:
            self.leader.ensure()

    @property
    def leading(self) -> bool:
        return self.leader is None or self.leader.is_leader

    def reconcile_once(self) -> list[Change]:
        """Check every mapping now; return the writes made (none unless this replica leads)."""
        with self._lock:
            table = self.source.table
            self.objects.follow(table, SYNC_WAIT_SECONDS)  # every replica watches: admissions read these caches too
            changes: list[Change] = []
            self._errors = 0
            if self.leading:
                self.reads.begin_pass()
                self._release_removed(table)
                self._leave_safe_scale_in(table)
                if self.health is not None:
                    self.health.retain({m.machine_deployment for m in table if m.slurm_health is not None})
                waiting: Counter[str] = Counter()
                self._shortfall = 0
                for mapping in table:
                    try:
                        change = self._reconcile(mapping, waiting)
                    except NotLeader as exc:
                        log.info("lost the Lease during a pass; stopping", extra={"reason": str(exc)})
                        break
                    except ScaleError as exc:
                        self._failed(mapping, exc)
                        continue
                    if change is not None:
                        changes.append(change)
                for reason in WAIT_REASONS:
                    self.metrics.waiting.labels(reason).set(waiting[reason])
                self.metrics.capacity_shortfall.set(self._shortfall)
            self._followed = table
            self.passes += 1
            return changes

    def _reconcile(self, mapping: Mapping, waiting: Counter[str]) -> Change | None:
        if not self.objects.synced(mapping):
            return None
        mirror, md = self.objects.mirror(mapping), self.objects.machine_deployment(mapping)
        if mirror is None or md is None:
            waiting["missing"] += 1
            absent = (
                f"mirror Deployment {mapping.mirror_ref}"
                if mirror is None
                else f"MachineDeployment {mapping.machine_deployment_ref}"
            )
            self._tell(mapping, "missing", f"{absent} not found; the MachineDeployment is left as it is")
            return None
        current = replicas_of(md)
        never_registered = self._check_health(mapping, md)
        if _annotations(mirror).get(ADOPTED_ANNOTATION) != mapping.machine_deployment_ref:
            return self._adopt(mapping, current)
        managed = autoscaler_annotations(md)
        if managed:
            waiting["autoscaler"] += 1
            self._tell(
                mapping,
                REASON_AUTOSCALER,
                f"MachineDeployment {mapping.machine_deployment_ref} is a cluster-autoscaler node "
                f"group ({', '.join(managed)}); SliMe does not scale it (one writer per MachineDeployment)",
                warning=True,
            )
            return None
        mirror_replicas = replicas_of(mirror)
        if mirror_replicas is None:
            return None
        target = target_replicas(mapping, mirror_replicas)
        if target != mirror_replicas:
            waiting["capped"] += 1
            self._tell(
                mapping,
                REASON_CAPPED,
                f"mirror {mapping.mirror_ref} asks {mirror_replicas}; MachineDeployment "
                f"{mapping.machine_deployment_ref} is capped at maxReplicas {mapping.max_replicas}",
                warning=True,
            )
        if mapping.capacity_aware and current is not None and target > current:
            target = self._within_capacity(mapping, current, target, waiting)
        paused = pause_reason(mapping, md, self.objects.cluster(mapping))
        if paused:
            if current != target:
                waiting["paused"] += 1
                self._tell(
                    mapping, REASON_PAUSED, f"set to {target} from mirror {mapping.mirror_ref} once unpaused: {paused}"
                )
            return None
        safe = self.safe if mapping.safe_scale_in is not None else None
        scale_up = current is None or target > current
        if safe is not None and not scale_up:
            safe.maintain(
                mapping,
                scale_in_pending=current is not None and current > target,
                fence=self.fence,
                machines=self.objects.machines(mapping),
                replicas=current,
                never_registered=never_registered,
            )
        if current == target:
            self._applied[mapping.machine_deployment] = target
            return None
        change = self._follow(mapping, md, current, target, never_registered)
        if safe is not None and scale_up:
            # After the write, not before: nothing maintain does (hooks on existing Machines, releases,
            # undrains) holds a new host back, and its Machine list and slurmrestd read would delay
            # every scale-up by their round trips.
            safe.maintain(
                mapping,
                scale_in_pending=False,
                fence=self.fence,
                machines=self.objects.machines(mapping),
                replicas=target,
                never_registered=never_registered,
            )
        return change

    def _check_health(self, mapping: Mapping, md: dict[str, Any]) -> frozenset[str]:
        """Machine health of a slurmHealth pool, before anything moves it: reported whatever the pool does next,
        remediated unless paused. The Machines it judged never registered (safe scale-in removes them first)."""
        if self.health is None or mapping.slurm_health is None:
            return frozenset()
        machines = self.objects.machines(mapping)
        if machines is None:
            return frozenset()
        paused = pause_reason(mapping, md, self.objects.cluster(mapping))
        try:
            report = self.health.check(mapping, machines, paused, self.fence)
        except ScaleError as exc:
            self._failed(mapping, exc)
            return frozenset()
        return report.never_registered

    def _follow(
        self,
        mapping: Mapping,
        md: dict[str, Any],
        current: int | None,
        target: int,
        never_registered: frozenset[str] = frozenset(),
    ) -> Change | None:
        moved = self._applied.get(mapping.machine_deployment) == current  # the MachineDeployment is where we left it
        before = _version(self.objects.machine_deployment(mapping))
        if self.safe is not None and mapping.safe_scale_in is not None:
            seen, decided_on = None, _version(md)
            if current is not None and target > current and decided_on:
                # A scale-up is decided from the caches (current and version of the same cached object),
                # its write conditional on that version; a scale-down reads afresh, as it chooses victims.
                seen = Seen(current, decided_on, self.objects.machines(mapping))
            outcome = self.safe.apply(mapping, target, fence=self.fence, seen=seen, never_registered=never_registered)
            # The next pass's scale-up reads the pending victims from the Machine cache: let it hold these marks.
            self.objects.wait_marks(mapping, outcome.victims, outcome.reclaimed)
            if outcome.replicas is None:
                return None  # deferred or Slurm unusable: the Events say why; a later pass retries
            replicas = outcome.replicas
            detail = f" (safe scale-in: {outcome.message})"
        else:
            self.fence()
            started = time.perf_counter()
            try:
                self.scaler.set_replicas(*mapping.machine_deployment, target, timeout=max(self.scaler.timeout, 5.0))
            finally:
                self.metrics.patch_seconds.observe(time.perf_counter() - started)
            replicas, detail = target, ""
        self._applied[mapping.machine_deployment] = replicas
        self.objects.wait_changed("machinedeployment", mapping.machine_deployment, before)
        what = "mirror" if moved else "drift"
        self.metrics.write[what].inc()
        was = current if current is not None else "unset"
        if moved:
            reason, message = (
                REASON_SCALED,
                f"Set replicas to {replicas} from mirror Deployment {mapping.mirror_ref}{detail}",
            )
        else:
            reason, message = (
                REASON_DRIFT,
                f"Set replicas to {replicas} (was {was}) to match mirror Deployment {mapping.mirror_ref}{detail}",
            )
            log.warning(
                "MachineDeployment differed from its mirror; set",
                extra={
                    "mirror": mapping.mirror_ref,
                    "machinedeployment": mapping.machine_deployment_ref,
                    "was": was,
                    "replicas": replicas,
                },
            )
        self.events.record(
            machine_deployment_event(mapping.machine_deployment, self.scaler.api_version, reason, message)
        )
        return Change(mapping, what, replicas)

    def _within_capacity(self, mapping: Mapping, current: int, target: int, waiting: Counter[str]) -> int:
        """The part of an increase the free hosts can take (never below ``current``)."""
        try:
            capacity = self.objects.capacity(mapping)
        except CapacityUnknown as exc:
            allowed, why = current, f"the hosts that could take them cannot be counted: {exc}"
        else:
            if capacity.ceiling >= target:
                self._told.pop((mapping.machine_deployment, REASON_CAPACITY), None)  # a later shortage is told again
                return target
            allowed = max(current, capacity.ceiling)
            why = (
                f"{capacity.bound} host(s) are in use by this pool and {capacity.free} available BareMetalHost(s) "
                "match its Metal3MachineTemplate's hostSelector"
            )
            if capacity.reuse:
                why += f" ({capacity.reuse} of them booked for this pool's node reuse)"
            if capacity.stale:
                why += (
                    f"; {capacity.stale} more carry this pool's node-reuse label but a consumerRef that is not its "
                    "Cluster's, a stale booking not counted"
                )
        waiting["capacity"] += 1
        self._shortfall += target - allowed
        self._tell(
            mapping,
            REASON_CAPACITY,
            f"mirror {mapping.mirror_ref} asks {target}; MachineDeployment {mapping.machine_deployment_ref} is held "
            f"at {allowed} because {why}; the rest follows when hosts become available",
            warning=True,
        )
        return allowed

    def _adopt(self, mapping: Mapping, current: int | None) -> Change | None:
        if current is None:
            self._tell(
                mapping,
                REASON_ADOPTED,
                f"MachineDeployment {mapping.machine_deployment_ref} has no spec.replicas; "
                f"mirror {mapping.mirror_ref} is not adopted until it has",
                warning=True,
            )
            return None
        self.fence()
        before = _version(self.objects.mirror(mapping))
        self.scaler.adopt(mapping.mirror, current, ADOPTED_ANNOTATION, mapping.machine_deployment_ref)
        self.objects.wait_changed("mirror", mapping.mirror, before)
        self._applied[mapping.machine_deployment] = current
        self.metrics.write["adopt"].inc()
        log.info(
            "mirror adopted",
            extra={
                "mirror": mapping.mirror_ref,
                "machinedeployment": mapping.machine_deployment_ref,
                "replicas": current,
            },
        )
        self.events.record(
            machine_deployment_event(
                mapping.machine_deployment,
                self.scaler.api_version,
                REASON_ADOPTED,
                f"Mapped to mirror Deployment {mapping.mirror_ref}: the mirror was set to this MachineDeployment's "
                f"{current} replicas (mapping never changes the pool); from now on the MachineDeployment follows the "
                "mirror",
            )
        )
        return Change(mapping, "adopt", current)

    def _leave_safe_scale_in(self, table: MappingTable) -> None:
        """Pools that left safe scale-in since the last pass (mapping removed, opt-in turned off): take SliMe's
        hooks and marks off and resume its drains (:meth:`SafeScaleIn.release_pool`), pass after pass until
        nothing of SliMe's holds a Machine there; a busy node is never let go, it is waited for and reported."""
        if self.safe is None:
            return
        safe_now = {m.machine_deployment for m in table if m.safe_scale_in is not None}
        for mapping in self._followed:
            if mapping.safe_scale_in is not None and mapping.machine_deployment not in safe_now:
                self._leaving[mapping.machine_deployment] = mapping
        for ref, mapping in list(self._leaving.items()):
            if ref in safe_now:  # opted in again: safe scale-in looks after it as before
                del self._leaving[ref]
                continue
            try:
                report = self.safe.release_pool(mapping, fence=self.fence)
            except ScaleError as exc:
                self._failed(mapping, exc)
                continue
            if report.done:
                del self._leaving[ref]
                self.metrics.pools_released.inc()
                log.info(
                    "pool left safe scale-in",
                    extra={"machinedeployment": mapping.machine_deployment_ref, "done": report.message},
                )
                self._tell(mapping, REASON_SAFE_SCALE_IN_OFF, f"Safe scale-in turned off: {report.message}")
            else:
                self._tell(
                    mapping,
                    REASON_SAFE_SCALE_IN_OFF_WAITING,
                    f"Safe scale-in turned off; waiting for Slurm before letting go of the rest: {report.message}. "
                    "Each is released as soon as Slurm reports its node idle (docs/operations.md, 'Turning safe "
                    "scale-in off').",
                    warning=True,
                )
        self.metrics.pools_leaving.set(len(self._leaving))

    def _release_removed(self, table: MappingTable) -> None:
        """Mappings gone since the last pass: take the adoption mark off their mirrors (best effort)."""
        kept = {m.mirror for m in table}
        for mapping in self._followed:
            if mapping.mirror in kept:
                continue
            self._applied.pop(mapping.machine_deployment, None)
            try:
                self.fence()
                self.scaler.unmark(mapping.mirror, ADOPTED_ANNOTATION)
            except ScaleError as exc:
                log.warning(
                    "cannot take the adoption mark off an unmapped mirror",
                    extra={"mirror": mapping.mirror_ref, "error": exc.cause},
                )

    def _tell(self, mapping: Mapping, reason: str, message: str, warning: bool = False) -> None:
        """Log and record an Event once per (MachineDeployment, reason, message): a waiting state is said once."""
        key = (mapping.machine_deployment, reason)
        if self._told.get(key) == message:
            return
        self._told[key] = message
        log.warning(message, extra={"machinedeployment": mapping.machine_deployment_ref, "reason": reason})
        if reason != "missing":
            self.events.record(
                machine_deployment_event(mapping.machine_deployment, self.scaler.api_version, reason, message, warning)
            )

    def _failed(self, mapping: Mapping, exc: ScaleError) -> None:
        self._errors += 1
        self.metrics.reconcile_errors.inc()
        log.warning(
            "cannot reconcile MachineDeployment with its mirror",
            extra={
                "mirror": mapping.mirror_ref,
                "machinedeployment": mapping.machine_deployment_ref,
                "error": exc.cause,
            },
        )

    # --- the loop ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """A ServiceRunner background task: a pass at start, on every wake-up and every resync period."""
        woken = self.wakeup.attach()
        while not stop.is_set() and not self.source.loaded:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
        while not stop.is_set():
            woken.clear()
            try:
                await asyncio.to_thread(self._discover_and_reconcile)
            except Exception:
                log.exception("reconcile pass failed")
            if self._errors:
                pause = min(self._retry_in, self.resync_seconds)
                self._retry_in = min(self._retry_in * 2, RETRY_SECONDS[1])
            else:
                pause, self._retry_in = self.resync_seconds, RETRY_SECONDS[0]
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(woken.wait())]
            try:
                await asyncio.wait(waiters, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    def _discover_and_reconcile(self) -> None:
        try:
            self.scaler.resource_path()  # the MachineDeployment watches need the served CAPI version
        except ScaleError as exc:
            log.warning("cannot discover the MachineDeployment API version", extra={"error": exc.cause})
            self.metrics.reconcile_errors.inc()
        self.reconcile_once()
