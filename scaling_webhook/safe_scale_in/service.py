"""Slurm-aware scale-in of opted-in MachineDeployments (docs/scaling.md, "Safe scale-in").

One entry point, :meth:`SafeScaleIn.apply`, is shared by the admission path and the reconciler:

* scale-down N -> M: choose up to N-M safe victims (:mod:`.victims`), DRAIN each
  in Slurm, check it is still not busy, mark its Machine ``cluster.x-k8s.io/delete-machine``,
  and only then lower the replicas, by the number of victims marked. Fewer safe victims than
  asked: a ``ScaleInDeferred`` Warning and a metric; the reconciler finishes later.
  slurmrestd unusable: no scale-in at all (a ``SlurmUnavailable`` Warning).
* scale-up: first reclaim Machines we marked that are not deleting yet (UNDRAIN, remove the
  mark), then set the replicas. Works without Slurm (nothing is reclaimed then).

:meth:`SafeScaleIn.maintain` (reconciler) keeps the pre-drain hook on every Machine of the
MachineDeployment and releases deleting Machines once Slurm reports their node drained (the
node is then deleted in Slurm) or after ``drainTimeoutSeconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from common.kube import KubeClient, KubeError
from scaling_webhook.errors import ScaleError, denial_code
from scaling_webhook.events import EventRecorder, ScaleEvent
from scaling_webhook.machinedeployments import CAPI_GROUP, CAPI_VERSIONS, MERGE_PATCH, MachineDeploymentScaler
from scaling_webhook.mappings import Mapping
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.safe_scale_in.config import SafeScaleInConfig
from scaling_webhook.safe_scale_in.slurmrestd import SlurmClient, SlurmNode, SlurmUnavailable
from scaling_webhook.safe_scale_in.victims import (
    DELETE_MACHINE,
    DELETE_MACHINE_VALUE,
    PRE_DRAIN_HOOK,
    PRE_DRAIN_HOOK_OWNER,
    choose_victims,
    is_deleting,
    is_pending_victim,
    machine_annotations,
    machine_name,
    node_for,
)

log = logging.getLogger("slime.scaling.safe_scale_in")

DRAIN_REASON = "slime: scale-in"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
REASON_VICTIMS = "ScaleInVictims"
REASON_DEFERRED = "ScaleInDeferred"
REASON_SLURM = "SlurmUnavailable"
REASON_RECLAIMED = "Reclaimed"
REASON_NODE_DELETED = "SlurmNodeDeleted"
REASON_DRAIN_TIMEOUT = "DrainTimeout"


@dataclass
class Outcome:
    """What :meth:`SafeScaleIn.apply` did."""

    target: int
    previous: int | None = None
    replicas: int | None = None  # what the MachineDeployment was set to (None: left unchanged)
    victims: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    deferred: int = 0
    slurm_error: str = ""

    @property
    def message(self) -> str:
        parts = []
        if self.replicas is not None:
            parts.append(f"set replicas to {self.replicas}")
        if self.victims:
            parts.append(f"drained and marked {', '.join(self.victims)}")
        if self.reclaimed:
            parts.append(f"reclaimed {', '.join(self.reclaimed)}")
        if self.deferred:
            parts.append(f"{self.deferred} replica(s) deferred until Slurm nodes are idle")
        if self.slurm_error:
            parts.append(f"no scale-in: {self.slurm_error}")
        return "; ".join(parts) or "nothing to do"


class SafeScaleIn:
    """Safe scale-in for every opted-in mapping. Thread-safe (one operation per MD at a time)."""

    def __init__(self, client: KubeClient, scaler: MachineDeploymentScaler, events: EventRecorder, metrics: ScalingMetrics) -> None:
        self.client = client
        self.scaler = scaler
        self.events = events
        self.metrics = metrics
        self._slurm: dict[SafeScaleInConfig, SlurmClient] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    # --- plumbing ------------------------------------------------------------------------------

    def slurm(self, config: SafeScaleInConfig) -> SlurmClient:
        with self._guard:
            client = self._slurm.get(config)
            if client is None:
                client = self._slurm[config] = SlurmClient(self.client, config)
            return client

    def _lock(self, mapping: Mapping) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(mapping.machine_deployment, threading.Lock())

    def close(self) -> None:
        with self._guard:
            for client in self._slurm.values():
                client.close()
            self._slurm.clear()

    def _event(self, mapping: Mapping, reason: str, message: str, warning: bool = False) -> None:
        self.events.record(
            ScaleEvent.on(mapping.machine_deployment, self.scaler.api_version, reason, message, warning)
        )

    def _slurm_failed(self, mapping: Mapping, exc: SlurmUnavailable, doing: str) -> None:
        self.metrics.slurm_errors.inc()
        log.warning("slurmrestd unusable", extra={"machinedeployment": mapping.machine_deployment_ref, "doing": doing, "error": exc.cause})
        self._event(mapping, REASON_SLURM, f"{doing}: {exc.cause}", warning=True)

    def machines(self, mapping: Mapping) -> list[dict[str, Any]]:
        namespace, name = mapping.machine_deployment
        try:
            path = self.client.resource(CAPI_GROUP, "machines", CAPI_VERSIONS)
            listing = self.client.request(
                "GET", path.collection(namespace), query=[("labelSelector", f"{DEPLOYMENT_LABEL}={name}")], timeout=5.0
            )
        except KubeError as exc:
            raise ScaleError(f"cannot list the Machines of MachineDeployment {namespace}/{name}: {exc}", denial_code(exc.status)) from None
        return [m for m in listing.get("items") or [] if isinstance(m, dict)]

    def _annotate(self, mapping: Mapping, machine: str, values: dict[str, str | None]) -> None:
        namespace = mapping.machine_deployment[0]
        try:
            path = self.client.resource(CAPI_GROUP, "machines", CAPI_VERSIONS)
            self.client.request(
                "PATCH", path.item(namespace, machine), body={"metadata": {"annotations": values}}, content_type=MERGE_PATCH, timeout=5.0
            )
        except KubeError as exc:
            raise ScaleError(f"cannot annotate Machine {namespace}/{machine}: {exc}", denial_code(exc.status)) from None

    # --- apply: the one scale function ------------------------------------------------------

    def apply(self, mapping: Mapping, target: int) -> Outcome:
        """Bring the MachineDeployment towards ``target`` replicas safely; raise ScaleError on API errors."""
        config = mapping.safe_scale_in
        assert config is not None, "apply() is for mappings with safeScaleIn"
        with self._lock(mapping):
            current = self.scaler.get_replicas(*mapping.machine_deployment)
            outcome = Outcome(target=target, previous=current)
            if current is None or target >= current:
                self._scale_up(mapping, config, current, target, outcome)
            else:
                self._scale_down(mapping, config, current, target, outcome)
            return outcome

    def _scale_up(self, mapping: Mapping, config: SafeScaleInConfig, current: int | None, target: int, outcome: Outcome) -> None:
        increase = target - (current or 0)
        if increase > 0:
            pending = sorted((m for m in self.machines(mapping) if is_pending_victim(m)), key=machine_name)
            if pending:
                self._reclaim(mapping, config, pending[:increase], outcome)
        if current != target:
            self.scaler.set_replicas(*mapping.machine_deployment, target)
            outcome.replicas = target

    def _reclaim(self, mapping: Mapping, config: SafeScaleInConfig, machines: list[dict[str, Any]], outcome: Outcome) -> None:
        slurm = self.slurm(config)
        try:
            nodes = slurm.nodes()
        except SlurmUnavailable as exc:
            # Cannot undrain: leave the marked Machines to go; the scale-up provisions new ones.
            self._slurm_failed(mapping, exc, "cannot reclaim Machines marked for deletion")
            return
        for machine in machines:
            name = machine_name(machine)
            node = node_for(machine, nodes)
            try:
                if node is not None and "DRAIN" in node.states:
                    slurm.undrain(node.name)
            except SlurmUnavailable as exc:
                self._slurm_failed(mapping, exc, f"cannot undrain the node of Machine {name}")
                return
            self._annotate(mapping, name, {DELETE_MACHINE: None})
            outcome.reclaimed.append(name)
            self.metrics.reclaimed.inc()
        if outcome.reclaimed:
            self._event(mapping, REASON_RECLAIMED, f"Reclaimed {len(outcome.reclaimed)} Machine(s) marked for deletion "
                        f"instead of provisioning new ones: {', '.join(outcome.reclaimed)}")

    def _scale_down(self, mapping: Mapping, config: SafeScaleInConfig, current: int, target: int, outcome: Outcome) -> None:
        want = current - target
        machines = self.machines(mapping)
        live = [m for m in machines if not is_deleting(m) and not is_pending_victim(m)]
        pending = [m for m in machines if is_pending_victim(m)]
        nondeleting = len(live) + len(pending)
        # Replicas with no Machine yet (a scale-up still creating them) go for free.
        free = min(want, max(0, current - nondeleting))
        # Marked Machines the current replicas do not account for yet (a scale-down that stopped
        # between marking and lowering): they are already drained, use them first.
        reuse = min(want - free, max(0, len(pending) - max(0, nondeleting - current)))
        free += reuse
        need = want - free
        victims: list[str] = []
        why = ""
        if need > 0:
            slurm = self.slurm(config)
            try:
                nodes = slurm.nodes()
            except SlurmUnavailable as exc:
                outcome.slurm_error = exc.cause
                self._slurm_failed(mapping, exc, f"scale-in from {current} to {target} not done (never guessing which node is idle)")
                return
            chosen, ineligible = choose_victims(live, nodes, need)
            try:
                drained = self._drain(slurm, chosen)
                if chosen:
                    # A job may have started between the read and the drain: look again.
                    after = slurm.nodes()
                    drained = self._recheck(slurm, chosen, drained, after)
            except SlurmUnavailable as exc:
                outcome.slurm_error = exc.cause
                self._slurm_failed(mapping, exc, f"scale-in from {current} to {target} stopped")
                drained = []
            for candidate in drained:
                self._annotate(mapping, candidate.machine, {DELETE_MACHINE: DELETE_MACHINE_VALUE, PRE_DRAIN_HOOK: PRE_DRAIN_HOOK_OWNER})
                victims.append(candidate.machine)
                self.metrics.scale_in_victims.inc()
            busy = [f"{c.machine} ({c.why})" for c in ineligible if c.why != "already deleting"]
            why = f"busy in Slurm: {', '.join(busy)}" if busy else "no other Machine is safe to remove"
        replicas = current - free - len(victims)
        outcome.victims = victims
        outcome.deferred = want - free - len(victims)
        if replicas != current:
            self.scaler.set_replicas(*mapping.machine_deployment, replicas)
            outcome.replicas = replicas
        if victims:
            self._event(mapping, REASON_VICTIMS, f"Drained in Slurm and marked for deletion: {', '.join(victims)}")
        if outcome.deferred and not outcome.slurm_error:
            self.metrics.scale_in_deferred.inc(outcome.deferred)
            self._event(
                mapping, REASON_DEFERRED,
                f"Scale-in to {target} asked; lowered to {replicas} only: {outcome.deferred} replica(s) deferred, {why}. "
                "The reconciler finishes as nodes become idle.",
                warning=True,
            )

    @staticmethod
    def _drain(slurm: SlurmClient, chosen: list[Any]) -> list[Any]:
        done = []
        for candidate in chosen:
            if candidate.node is not None and "DRAIN" not in candidate.node.states:
                slurm.drain(candidate.node.name, DRAIN_REASON)
            done.append(candidate)
        return done

    @staticmethod
    def _recheck(slurm: SlurmClient, chosen: list[Any], drained: list[Any], after: list[SlurmNode]) -> list[Any]:
        by_name = {n.name: n for n in after}
        kept = []
        for candidate in drained:
            node = candidate.node
            now = by_name.get(node.name) if node is not None else None
            if now is not None and now.busy:
                slurm.undrain(now.name)  # a job landed meanwhile: give the node back
                continue
            kept.append(candidate)
        return kept

    # --- maintain: hooks and deleting Machines (reconciler) ---------------------------------

    def maintain(self, mapping: Mapping) -> None:
        """Keep the pre-drain hook on every Machine; release deleting ones when Slurm lets go."""
        config = mapping.safe_scale_in
        assert config is not None
        with self._lock(mapping):
            machines = self.machines(mapping)
            for machine in machines:
                if not is_deleting(machine) and PRE_DRAIN_HOOK not in machine_annotations(machine):
                    self._annotate(mapping, machine_name(machine), {PRE_DRAIN_HOOK: PRE_DRAIN_HOOK_OWNER})
            held = [m for m in machines if is_deleting(m) and PRE_DRAIN_HOOK in machine_annotations(m)]
            if held:
                self._release(mapping, config, held)

    def _release(self, mapping: Mapping, config: SafeScaleInConfig, held: list[dict[str, Any]]) -> None:
        slurm = self.slurm(config)
        try:
            nodes: list[SlurmNode] | None = slurm.nodes()
        except SlurmUnavailable as exc:
            self._slurm_failed(mapping, exc, "cannot check the Slurm nodes of deleting Machines")
            nodes = None
        for machine in held:
            name = machine_name(machine)
            if nodes is not None:
                node = node_for(machine, nodes)
                try:
                    if node is None or node.drained:
                        if node is not None:
                            slurm.delete(node.name)
                        self._annotate(mapping, name, {PRE_DRAIN_HOOK: None})
                        self._event(mapping, REASON_NODE_DELETED, f"Machine {name}: Slurm node "
                                    f"{node.name + ' drained and deleted' if node else 'gone'}; deletion may proceed")
                        continue
                    if "DRAIN" not in node.states:
                        slurm.drain(node.name, DRAIN_REASON)  # deleted by someone else: drain it first
                except SlurmUnavailable as exc:
                    self._slurm_failed(mapping, exc, f"cannot release Machine {name}")
            elapsed = _age_seconds((machine.get("metadata") or {}).get("deletionTimestamp"))
            if elapsed is not None and elapsed > config.drain_timeout_seconds:
                self._annotate(mapping, name, {PRE_DRAIN_HOOK: None})
                self._event(mapping, REASON_DRAIN_TIMEOUT, f"Machine {name}: Slurm did not report its node drained within "
                            f"{config.drain_timeout_seconds:g}s; deletion proceeds anyway", warning=True)


def _age_seconds(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return time.time() - when.timestamp()
