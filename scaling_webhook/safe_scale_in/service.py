"""Slurm-aware scale-in of opted-in MachineDeployments (docs/scaling.md, "Safe scale-in").

The leader's reconciler calls it; every write first asks ``fence`` (the Lease check), so a
replica that lost the Lease stops between two writes.

* :meth:`SafeScaleIn.apply`: bring the MachineDeployment towards a target.
  - Scale-down N -> M: choose up to N-M victims (:mod:`.victims`), DRAIN each in Slurm (a node
    already drained by an admin keeps its reason), read Slurm again (a job may have landed:
    give that node back), mark each Machine ``cluster.x-k8s.io/delete-machine`` with the
    pre-terminate hook and the node's name, and only then lower the replicas by the number marked.
    Fewer safe victims than asked: a ``ScaleInDeferred`` Warning; the reconciler retries.
    slurmrestd unusable: no scale-in at all (``SlurmUnavailable``).
  - Scale-up: first reclaim Machines we marked that are not deleting yet (remove the mark;
    UNDRAIN only drains SliMe made), then set the replicas. Works without Slurm. Decided from the
    reconciler's watch caches (:class:`Seen`): no read before the write, which is conditional on
    the cached resourceVersion; a 409 (the MachineDeployment changed meanwhile) redoes it from
    fresh reads, counting in ``slime_scaling_scale_up_fallbacks_total``.
* :meth:`SafeScaleIn.maintain` (every pass): keep the pre-terminate hook on every Machine
  (Cluster API waits for it with or without a nodeRef; the pre-drain hook an earlier SliMe set,
  which does not hold a Machine without one, is replaced); for each deleting Machine, read Slurm
  *for that Machine at that moment* and release the hook only when Slurm reports its node drained
  and idle (then the node is returned to FUTURE, so Slurm keeps its record for the pool, or
  deleted with ``releasedNodes: delete``), or gone after it had joined, or when
  :func:`.victims.never_joined` holds. Otherwise it waits: a node not drained yet is drained; a
  busy one is never let go, however long (``drainTimeoutSeconds`` only adds Warnings and a
  metric); nothing is released while slurmrestd is unusable. Nodes SliMe drained whose Machines
  are neither marked nor deleting are undrained when no scale-in needs them (a scale-in that
  stopped half way leaves none drained for good).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from common.apis import CAPI_VERSIONS
from common.events import EventRecorder, machine_deployment_event
from common.kube import KubeClient, KubeError
from common.names import (
    CAPI_GROUP,
    DELETE_MACHINE_ANNOTATION,
    DELETE_MACHINE_VALUE,
    DEPLOYMENT_NAME_LABEL,
    HOOK_OWNER,
    LEGACY_PRE_DRAIN_HOOK,
    PRE_TERMINATE_HOOK,
    REASON_DEFERRED,
    REASON_DRAIN_OVERDUE,
    REASON_NODE_DELETED,
    REASON_NODE_FUTURE,
    REASON_RECLAIMED,
    REASON_RELEASED,
    REASON_SLURM,
    REASON_UNDRAINED,
    REASON_VICTIMS,
    SLURM_NODE_ANNOTATION,
)
from scaling_webhook.errors import ScaleError, denial_code
from scaling_webhook.leader import Fence, no_fence
from scaling_webhook.machinedeployments import MERGE_PATCH, MachineDeploymentScaler
from scaling_webhook.mappings import Mapping
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.safe_scale_in.config import SafeScaleInConfig
from scaling_webhook.safe_scale_in.victims import Candidate, choose_victims, never_joined
from scaling_webhook.slurm.machines import (
    DRAIN_REASON,
    drained_by_us,
    is_deleting,
    is_pending_victim,
    machine_addresses,
    machine_annotations,
    machine_name,
    node_for,
)
from scaling_webhook.slurm.reads import SlurmReads
from scaling_webhook.slurm.slurmrestd import SlurmClient, SlurmNode, SlurmUnavailable

log = logging.getLogger("slime.scaling.safe_scale_in")


HOOKS = frozenset({PRE_TERMINATE_HOOK, LEGACY_PRE_DRAIN_HOOK})  # either holds a deleting Machine for SliMe
RELEASE: dict[str, str | None] = dict.fromkeys(HOOKS)  # the patch that lets a held Machine go
RELEASED, HELD, UNUSABLE = "released", "held", "slurm unusable"  # what became of one held Machine


@dataclass(frozen=True, slots=True)
class Seen:
    """A MachineDeployment and its pool's Machines as the reconciler's watch caches hold them."""

    replicas: int
    resource_version: str  # of that MachineDeployment: the precondition of a write decided from it
    machines: list[dict[str, Any]] | None  # None: the Machine cache has not listed yet


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


@dataclass
class PoolRelease:
    """What :meth:`SafeScaleIn.release_pool` did to a pool leaving safe scale-in, and what it had to leave."""

    unhooked: list[str] = field(default_factory=list)  # live Machines whose hook (and SliMe's marks) came off
    released: list[str] = field(default_factory=list)  # deleting Machines let go: Slurm read them idle or gone
    held: list[str] = field(default_factory=list)  # deleting Machines still held: "<machine> (<why>)"
    kept_marks: list[str] = field(default_factory=list)  # victims Cluster API is deleting: marked, drained, idle
    undrained: list[str] = field(default_factory=list)  # Slurm nodes SliMe had drained, taking jobs again
    slurm_error: str = ""

    @property
    def done(self) -> bool:
        return not self.held

    @property
    def message(self) -> str:
        parts = [
            f"{what}: {', '.join(names)}"
            for what, names in (
                ("hook taken off", self.unhooked),
                ("released", self.released),
                ("left to Cluster API's deletion, drained", self.kept_marks),
                ("Slurm nodes resumed", self.undrained),
                ("still held", self.held),
            )
            if names
        ]
        if self.slurm_error:
            parts.append(f"slurmrestd unusable: {self.slurm_error}")
        return "; ".join(parts) or "nothing of SliMe's was left on the pool"


class SafeScaleIn:
    """Safe scale-in for every opted-in mapping. Thread-safe (one operation per MD at a time)."""

    def __init__(
        self,
        client: KubeClient,
        scaler: MachineDeploymentScaler,
        events: EventRecorder,
        metrics: ScalingMetrics,
        reads: SlurmReads | None = None,
    ) -> None:
        self.client = client
        self.scaler = scaler
        self.events = events
        self.metrics = metrics
        # Slurm's clients and the pass's node lists, shared with machine health (the reconciler starts each pass).
        self.reads = reads if reads is not None else SlurmReads(client)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._overdue_warned: set[tuple[str, str]] = set()
        self._guard = threading.Lock()

    # --- plumbing ------------------------------------------------------------------------------

    def _lock(self, mapping: Mapping) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(mapping.machine_deployment, threading.Lock())

    def _event(self, mapping: Mapping, reason: str, message: str, warning: bool = False) -> None:
        self.events.record(
            machine_deployment_event(mapping.machine_deployment, self.scaler.api_version, reason, message, warning)
        )

    def _slurm_failed(self, mapping: Mapping, exc: SlurmUnavailable, doing: str) -> None:
        self.metrics.slurm_errors.inc()
        log.warning(
            "slurmrestd unusable",
            extra={"machinedeployment": mapping.machine_deployment_ref, "doing": doing, "error": exc.cause},
        )
        self._event(mapping, REASON_SLURM, f"{doing}: {exc.cause}", warning=True)

    def machines(self, mapping: Mapping) -> list[dict[str, Any]]:
        namespace, name = mapping.machine_deployment
        try:
            path = self.client.resource(CAPI_GROUP, "machines", CAPI_VERSIONS)
            listing = self.client.request(
                "GET",
                path.collection(namespace),
                query=[("labelSelector", f"{DEPLOYMENT_NAME_LABEL}={name}")],
                timeout=5.0,
            )
        except KubeError as exc:
            raise ScaleError(
                f"cannot list the Machines of MachineDeployment {namespace}/{name}: {exc}", denial_code(exc.status)
            ) from None
        return [m for m in listing.get("items") or [] if isinstance(m, dict)]

    def _annotate(
        self,
        mapping: Mapping,
        machine: str,
        values: dict[str, str | None],
        fence: Fence,
        resource_version: str | None = None,
    ) -> bool:
        """Merge ``values`` into the Machine's annotations. With ``resource_version``, only while the Machine is at
        it: False (nothing done) when it changed since, or is gone."""
        fence()
        namespace = mapping.machine_deployment[0]
        metadata: dict[str, Any] = {"annotations": values}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        try:
            path = self.client.resource(CAPI_GROUP, "machines", CAPI_VERSIONS)
            self.client.request(
                "PATCH",
                path.item(namespace, machine),
                body={"metadata": metadata},
                content_type=MERGE_PATCH,
                timeout=5.0,
            )
        except KubeError as exc:
            if resource_version and exc.status in (404, 409):
                return False
            raise ScaleError(f"cannot annotate Machine {namespace}/{machine}: {exc}", denial_code(exc.status)) from None
        return True

    def _let_machine_go(self, mapping: Mapping, machine: dict[str, Any], fence: Fence) -> bool:
        """Take the hooks off ``machine`` as it was read; False (nothing done) when it changed since, or is gone.

        Conditional on the Machine's resourceVersion: a pass whose cache has not yet seen an earlier pass's
        release gets a 409, so a Machine is let go (and told in an Event) once; the next pass decides again."""
        version = (machine.get("metadata") or {}).get("resourceVersion")
        return self._annotate(mapping, machine_name(machine), RELEASE, fence, resource_version=version)

    def _set_replicas(self, mapping: Mapping, replicas: int, fence: Fence, resource_version: str | None = None) -> bool:
        """Set the replicas; with ``resource_version`` only while the MachineDeployment is at it (False if not)."""
        fence()
        try:
            self.scaler.set_replicas(
                *mapping.machine_deployment,
                replicas,
                timeout=max(self.scaler.timeout, 5.0),
                resource_version=resource_version,
            )
        except ScaleError as exc:
            if resource_version is None or exc.code != 409:
                raise
            return False
        return True

    # --- apply: the one scale function ----------------------------------------------------------

    def apply(
        self,
        mapping: Mapping,
        target: int,
        fence: Fence = no_fence,
        seen: Seen | None = None,
        never_registered: frozenset[str] = frozenset(),
    ) -> Outcome:
        """Bring the MachineDeployment towards ``target`` replicas safely; raise ScaleError on API errors.

        ``never_registered``: the pool's Machines machine health judged never registered (slurmHealth);
        a scale-down removes them first.

        A scale-up from ``seen`` (the watch caches) reads nothing before its write: the time from a
        mirror's scale to the MachineDeployment's is one API call, plus any reclaim. Its write is
        conditional on ``seen.resource_version``; if the MachineDeployment changed since (409), the
        scale-up is redone from fresh reads, as without ``seen``. A scale-down always reads afresh.
        """
        config = mapping.safe_scale_in
        assert config is not None, "apply() is for mappings with safeScaleIn"
        with self._lock(mapping):
            outcome = Outcome(target=target)
            if seen is not None and target > seen.replicas:
                outcome.previous = seen.replicas
                if self._scale_up(mapping, config, target, outcome, fence, seen.machines, seen.resource_version):
                    return outcome
                self.metrics.scale_up_fallbacks.inc()
            current = self.scaler.get_replicas(*mapping.machine_deployment)
            outcome.previous = current
            if current is None or target > current:
                self._scale_up(mapping, config, target, outcome, fence)
            elif target < current:
                self._scale_down(mapping, config, current, target, outcome, fence, never_registered)
            return outcome

    def _scale_up(
        self,
        mapping: Mapping,
        config: SafeScaleInConfig,
        target: int,
        outcome: Outcome,
        fence: Fence,
        machines: list[dict[str, Any]] | None = None,
        resource_version: str | None = None,
    ) -> bool:
        """Raise the replicas, then reclaim Machines marked for deletion (conditional on ``resource_version`` when
        given; False if refused). The write comes first: taking a mark off before the replicas are raised would
        leave, for a moment, fewer replicas than unmarked Machines, and Cluster API would delete unmarked ones.

        ``machines``: the pool as cached (None: list it now)."""
        if not self._set_replicas(mapping, target, fence, resource_version):
            return False
        outcome.replicas = target
        pool = self.machines(mapping) if machines is None else machines
        pending = sorted((m for m in pool if is_pending_victim(m)), key=machine_name)
        live = sum(1 for m in pool if not is_deleting(m) and not is_pending_victim(m))
        # Once unmarked, a Machine counts against the replicas: reclaim no more than the replicas leave room for.
        room = len(pending) if target >= live + len(pending) else max(0, target - live)
        if room:
            self._reclaim(mapping, config, pending[:room], outcome, fence)
        return True

    def _reclaim(
        self,
        mapping: Mapping,
        config: SafeScaleInConfig,
        machines: list[dict[str, Any]],
        outcome: Outcome,
        fence: Fence,
    ) -> None:
        slurm = self.reads.slurm(config)
        try:
            nodes = self.reads.nodes(config)
        except SlurmUnavailable as exc:
            # Cannot undrain: leave the marked Machines to go; the scale-up provisions new ones.
            self._slurm_failed(mapping, exc, "cannot reclaim Machines marked for deletion")
            return
        reclaimed: list[str] = []
        for machine in machines:
            name = machine_name(machine)
            node = node_for(machine, nodes)
            try:
                if node is not None and drained_by_us(node):  # an admin's drain keeps its state and reason
                    fence()
                    slurm.undrain(node.name)
            except SlurmUnavailable as exc:
                self._slurm_failed(mapping, exc, f"cannot undrain the node of Machine {name}")
                break
            self._annotate(mapping, name, {DELETE_MACHINE_ANNOTATION: None}, fence)
            reclaimed.append(name)
            self.metrics.reclaimed.inc()
        outcome.reclaimed += reclaimed
        if reclaimed:
            self._event(
                mapping,
                REASON_RECLAIMED,
                f"Reclaimed {len(reclaimed)} Machine(s) marked for deletion "
                f"instead of provisioning new ones: {', '.join(reclaimed)}",
            )

    def _scale_down(
        self,
        mapping: Mapping,
        config: SafeScaleInConfig,
        current: int,
        target: int,
        outcome: Outcome,
        fence: Fence,
        never_registered: frozenset[str],
    ) -> None:
        """Mark victims, then lower the replicas by no more than the marks allow.

        The rule Cluster API must follow: it deletes exactly the marked Machines. It deletes marked
        ones first, so the replicas may go below the Machines that exist, or are being created, by at
        most the number marked. Replicas with no Machine yet are not given up for free: a Machine
        created between this read and the write would make the surplus, and Cluster API would pick
        an unmarked one; the next pass marks it once it exists."""
        machines = self.machines(mapping)
        live = [m for m in machines if not is_deleting(m) and not is_pending_victim(m)]
        pending = [m for m in machines if is_pending_victim(m)]
        present = max(current, len(live) + len(pending))  # Machines that exist or are being created
        need = max(0, present - target - len(pending))
        victims: list[str] = []
        why = ""
        if need > 0:
            slurm = self.reads.slurm(config)
            try:
                nodes = self.reads.nodes(config)
            except SlurmUnavailable as exc:
                outcome.slurm_error = exc.cause
                self._slurm_failed(
                    mapping, exc, f"scale-in from {current} to {target} not done (never guessing which node is idle)"
                )
                return
            chosen, ineligible = choose_victims(live, nodes, need, never_registered)
            drained: list[tuple[Candidate, bool]] = []
            try:
                drained = self._drain(slurm, chosen, fence)
                if any(ours for _, ours in drained):
                    # A job may have started between the read and the drain: look again, once for all of them.
                    drained = self._recheck(slurm, drained, self.reads.nodes(config, fresh=True), fence)
            except SlurmUnavailable as exc:
                outcome.slurm_error = exc.cause
                self._slurm_failed(mapping, exc, f"scale-in from {current} to {target} stopped")
                drained = []  # the drains made stay ours (reason): the next pass reuses or undoes them
            for candidate, _ in drained:
                values: dict[str, str | None] = {
                    DELETE_MACHINE_ANNOTATION: DELETE_MACHINE_VALUE,
                    PRE_TERMINATE_HOOK: HOOK_OWNER,
                }
                if candidate.node is not None:
                    values[SLURM_NODE_ANNOTATION] = candidate.node.name
                self._annotate(mapping, candidate.machine, values, fence)
                victims.append(candidate.machine)
                self.metrics.scale_in_victims.inc()
            busy = [f"{c.machine} ({c.why})" for c in ineligible if c.why != "already deleting"]
            why = f"busy in Slurm: {', '.join(busy)}" if busy else "no other Machine is safe to remove"
        replicas = min(current, max(target, present - len(pending) - len(victims)))
        outcome.victims = victims
        outcome.deferred = replicas - target
        if replicas != current:
            self._set_replicas(mapping, replicas, fence)
            outcome.replicas = replicas
        if victims:
            self._event(mapping, REASON_VICTIMS, f"Drained in Slurm and marked for deletion: {', '.join(victims)}")
        if outcome.deferred and not outcome.slurm_error:
            self.metrics.scale_in_deferred.inc(outcome.deferred)
            self._event(
                mapping,
                REASON_DEFERRED,
                f"Scale-in to {target} asked; lowered to {replicas} only: {outcome.deferred} replica(s) deferred, "
                f"{why or 'Machines still being created'}. The reconciler finishes as nodes become idle and Machines "
                "exist.",
                warning=True,
            )

    @staticmethod
    def _drain(slurm: SlurmClient, chosen: list[Candidate], fence: Fence) -> list[tuple[Candidate, bool]]:
        """DRAIN each chosen node not drained yet; (candidate, whether we drained it now)."""
        done = []
        for candidate in chosen:
            ours = candidate.node is not None and "DRAIN" not in candidate.node.states
            if ours:
                assert candidate.node is not None
                fence()
                slurm.drain(candidate.node.name, DRAIN_REASON)
            done.append((candidate, ours))
        return done

    @staticmethod
    def _recheck(
        slurm: SlurmClient, drained: list[tuple[Candidate, bool]], after: list[SlurmNode], fence: Fence
    ) -> list[tuple[Candidate, bool]]:
        by_name = {n.name: n for n in after}
        kept = []
        for candidate, ours in drained:
            node = candidate.node
            now = by_name.get(node.name) if node is not None else None
            if now is not None and now.busy:
                if ours:  # a job landed meanwhile: give the node back (only a drain we made)
                    fence()
                    slurm.undrain(now.name)
                continue
            kept.append((candidate, ours))
        return kept

    # --- maintain: hooks, deleting Machines, drains left behind (every pass) ---------------------

    def maintain(
        self,
        mapping: Mapping,
        scale_in_pending: bool,
        fence: Fence = no_fence,
        machines: list[dict[str, Any]] | None = None,
        replicas: int | None = None,
        never_registered: frozenset[str] = frozenset(),
    ) -> None:
        """Keep hooks on; release deleting Machines Slurm lets go; when no scale-in needs them, take back Machines
        marked for a deletion that will not come and undo orphan drains.

        ``never_registered``: Machines machine health judged never registered: held ones are let go without
        waiting for a node that will not come.

        ``machines``: the pool as the watch cache holds it (None: list it now); ``replicas``: the
        MachineDeployment's as cached. A mark is taken back only if fresh reads of both agree it is
        one no deletion will follow. Slurm is read once per pass (:class:`~scaling_webhook.slurm.reads.SlurmReads`)
        and, before a hook is released, once for that node."""
        config = mapping.safe_scale_in
        assert config is not None
        with self._lock(mapping):
            machines = self.machines(mapping) if machines is None else machines
            for machine in machines:
                annotations = machine_annotations(machine)
                if not is_deleting(machine) and (
                    PRE_TERMINATE_HOOK not in annotations or LEGACY_PRE_DRAIN_HOOK in annotations
                ):
                    # One patch adds the hook and drops the one SliMe < 0.2 set.
                    hooks = {PRE_TERMINATE_HOOK: HOOK_OWNER, LEGACY_PRE_DRAIN_HOOK: None}
                    self._annotate(mapping, machine_name(machine), hooks, fence)
            held = [m for m in machines if is_deleting(m) and HOOKS & set(machine_annotations(m))]
            if held:
                try:
                    nodes = self.reads.nodes(config)
                except SlurmUnavailable as exc:
                    self._slurm_failed(
                        mapping, exc, "not releasing any Machine (nothing is released while Slurm cannot be read)"
                    )
                    return
                for machine in held:
                    if self._release(mapping, config, machine, nodes, fence, never_registered) == UNUSABLE:
                        return  # slurmrestd unusable: nothing else is released, nothing else is done
            if not scale_in_pending:
                stale = self._stale_victims(machines, replicas)
                if stale:
                    # The caches are separate watches, each possibly behind: the Machines' may show a mark but
                    # not the Machine created after it, the MachineDeployment's replicas from before the scale-in
                    # that marked it. Either makes a victim Cluster API is about to delete look like one no
                    # deletion follows. Taking a mark off is decided on fresh reads, replicas first.
                    replicas = self.scaler.get_replicas(*mapping.machine_deployment)
                    machines = self.machines(mapping)
                    stale = self._stale_victims(machines, replicas)
                if stale:
                    self._reclaim(mapping, config, stale, Outcome(target=replicas or 0), fence)
                self._undo_orphan_drains(mapping, config, machines, fence)

    # --- leaving safe scale-in: take everything of SliMe's off the pool, never blindly -------------------------

    def release_pool(self, mapping: Mapping, fence: Fence = no_fence, replicas: int | None = None) -> PoolRelease:
        """A pool leaves safe scale-in (its mapping removed, its opt-in turned off, SliMe uninstalled): take the
        hooks and marks off and resume the Slurm nodes SliMe drained, so no deletion waits for SliMe again.

        A deleting Machine is let go only as a release would (Slurm, read now, says its node is idle or gone);
        one whose node is busy, or that cannot be checked, stays held and is named in ``held``. A Machine marked
        for a deletion Cluster API is about to make (the replicas already count it out) keeps its mark: without
        it, Cluster API would pick another Machine, maybe a busy one. ``replicas``: the MachineDeployment's
        (None: read it)."""
        config = mapping.safe_scale_in
        assert config is not None, "release_pool() is for mappings that had safeScaleIn"
        report = PoolRelease()
        with self._lock(mapping):
            machines = self.machines(mapping)
            if replicas is None:
                replicas = self.scaler.get_replicas(*mapping.machine_deployment)
            try:
                nodes: list[SlurmNode] | None = self.reads.nodes(config, fresh=True)
            except SlurmUnavailable as exc:
                nodes, report.slurm_error = None, exc.cause
            for machine in machines:
                if is_deleting(machine) and HOOKS & set(machine_annotations(machine)):
                    self._release_for_good(mapping, config, machine, nodes, fence, report)
            live = [m for m in machines if not is_deleting(m)]
            pending = sorted((m for m in live if is_pending_victim(m)), key=machine_name)
            surplus = max(0, len(live) - (replicas if replicas is not None else len(live)))
            keep = {machine_name(m) for m in pending[:surplus]}  # Cluster API deletes these next: keep them marked
            for machine in live:
                name = machine_name(machine)
                off: dict[str, str | None] = dict(RELEASE)
                if name in keep:
                    report.kept_marks.append(name)
                else:
                    off.update({DELETE_MACHINE_ANNOTATION: None, SLURM_NODE_ANNOTATION: None})
                    node = node_for(machine, nodes) if nodes is not None else None
                    if node is not None and drained_by_us(node):
                        try:
                            fence()
                            self.reads.slurm(config).undrain(node.name)
                            report.undrained.append(node.name)
                        except SlurmUnavailable as exc:
                            report.slurm_error = exc.cause
                if set(off) & set(machine_annotations(machine)):
                    self._annotate(mapping, name, off, fence)
                    if name not in keep:
                        report.unhooked.append(name)
        return report

    def _release_for_good(
        self,
        mapping: Mapping,
        config: SafeScaleInConfig,
        machine: dict[str, Any],
        nodes: list[SlurmNode] | None,
        fence: Fence,
        report: PoolRelease,
    ) -> None:
        name = machine_name(machine)
        if nodes is None:
            report.held.append(f"{name} (Slurm cannot be read, so its node cannot be checked)")
            return
        outcome = self._release(mapping, config, machine, nodes, fence)
        if outcome == RELEASED:
            report.released.append(name)
            return
        node = node_for(machine, nodes) or (machine_annotations(machine).get(SLURM_NODE_ANNOTATION) or "")
        state = f"Slurm node {node.name} is {'+'.join(sorted(node.states))}" if isinstance(node, SlurmNode) else ""
        report.held.append(f"{name} ({state or 'its node may still run jobs'})")

    @staticmethod
    def _stale_victims(machines: list[dict[str, Any]], replicas: int | None) -> list[dict[str, Any]]:
        """Machines marked for deletion that Cluster API will not delete: the replicas leave room for every one of
        them (a scale-in that marked victims for Machines still being created, which were then never made)."""
        pending = [m for m in machines if is_pending_victim(m)]
        live = sum(1 for m in machines if not is_deleting(m) and not is_pending_victim(m))
        if replicas is None or not pending or replicas < live + len(pending):
            return []
        return sorted(pending, key=machine_name)

    def _release(
        self,
        mapping: Mapping,
        config: SafeScaleInConfig,
        machine: dict[str, Any],
        nodes: list[SlurmNode],
        fence: Fence,
        never_registered: frozenset[str] = frozenset(),
    ) -> str:
        """Release one held Machine if Slurm, read now for its node, lets it go: RELEASED, HELD, or UNUSABLE when
        slurmrestd cannot be used (then nothing is released).

        ``nodes`` (the pass's list) says which Machines are worth a fresh read: a busy node waits for
        the next pass without one; a node that looks drained and idle, or gone, is read again by name,
        and only that read decides a release."""
        slurm = self.reads.slurm(config)
        name = machine_name(machine)
        try:
            node = node_for(machine, nodes)
            recorded = machine_annotations(machine).get(SLURM_NODE_ANNOTATION)
            if node is None and recorded:
                node = slurm.node(recorded)  # not listed: gone, or back since the list was read
            if node is None:
                if recorded:
                    evidence = f"its Slurm node {recorded} joined before and is gone from Slurm now"
                elif never_joined(machine):
                    evidence = "it never joined Slurm and its infrastructure was never provisioned, so it cannot"
                elif name in never_registered and not self._registered_now(slurm, machine):
                    evidence = (
                        "machine health judged it never registered with Slurm (registrationTimeout), and Slurm, "
                        "read again now, has no node of its names"
                    )
                else:
                    self._overdue(
                        mapping, config, machine, "no Slurm node yet, though its infrastructure is provisioned"
                    )
                    return HELD
                if not self._let_machine_go(mapping, machine, fence):
                    return HELD
                self._event(mapping, REASON_RELEASED, f"Machine {name}: {evidence}; deletion may proceed")
                return RELEASED
            if node.drained:
                fresh = slurm.node(node.name)  # the read the release is decided on
                if fresh is None:
                    if not self._let_machine_go(mapping, machine, fence):
                        return HELD
                    self._event(
                        mapping,
                        REASON_RELEASED,
                        f"Machine {name}: Slurm node {node.name} is gone; deletion may proceed",
                    )
                    return RELEASED
                if fresh.drained:
                    fence()
                    reason, what = self._let_go(config, slurm, node.name)
                    if not self._let_machine_go(mapping, machine, fence):
                        return HELD  # its node is let go in Slurm already: the next pass finds it gone
                    self._event(
                        mapping,
                        reason,
                        f"Machine {name}: Slurm node {node.name} drained and idle, {what}; deletion may proceed",
                    )
                    return RELEASED
                node = fresh
            if "DRAIN" not in node.states:  # deleted by someone else, or joined after it was chosen
                fence()
                slurm.drain(node.name, DRAIN_REASON)
                self._annotate(mapping, name, {SLURM_NODE_ANNOTATION: node.name}, fence)
            self._overdue(mapping, config, machine, f"Slurm node {node.name} is {'+'.join(sorted(node.states))}")
            return HELD
        except SlurmUnavailable as exc:
            self._slurm_failed(
                mapping, exc, f"not releasing Machine {name} (nothing is released while Slurm cannot be read)"
            )
            return UNUSABLE

    @staticmethod
    def _registered_now(slurm: SlurmClient, machine: dict[str, Any]) -> bool:
        """Whether Slurm, read now by each of the Machine's names and addresses, has a node for it."""
        return any(slurm.node(address) is not None for address in machine_addresses(machine))

    @staticmethod
    def _let_go(config: SafeScaleInConfig, slurm: SlurmClient, node: str) -> tuple[str, str]:
        """What a released node becomes in Slurm (``releasedNodes``): the Event's reason and what happened."""
        if config.released_nodes == "delete":
            if slurm.delete(node):
                return REASON_NODE_DELETED, "deleted from Slurm (releasedNodes: delete)"
            return REASON_RELEASED, "already gone from Slurm (removed by someone else): nothing left to delete"
        if slurm.future(node):
            return REASON_NODE_FUTURE, (
                "returned to FUTURE: Slurm keeps its record, so jobs as big as the pool still queue, "
                "and the host's next slurmd -Z of that name takes it again"
            )
        return REASON_RELEASED, "already gone from Slurm (removed by someone else): no record left to keep"

    def _overdue(self, mapping: Mapping, config: SafeScaleInConfig, machine: dict[str, Any], state: str) -> None:
        """Warn (once per Machine) when a held Machine waits past drainTimeoutSeconds. Never a release."""
        if config.drain_timeout_seconds is None:
            return
        elapsed = _age_seconds((machine.get("metadata") or {}).get("deletionTimestamp"))
        key = (mapping.machine_deployment[0], machine_name(machine))
        if elapsed is None or elapsed <= config.drain_timeout_seconds or key in self._overdue_warned:
            return
        self._overdue_warned.add(key)
        self.metrics.drain_overdue.inc()
        self._event(
            mapping,
            REASON_DRAIN_OVERDUE,
            f"Machine {key[1]} held for {elapsed:.0f}s, more than drainTimeoutSeconds "
            f"({config.drain_timeout_seconds:g}s): {state}. It stays held until Slurm lets it go; it is never released "
            "while its node may run jobs.",
            warning=True,
        )

    def _undo_orphan_drains(
        self, mapping: Mapping, config: SafeScaleInConfig, machines: list[dict[str, Any]], fence: Fence
    ) -> None:
        kept = [m for m in machines if not is_deleting(m) and not is_pending_victim(m)]
        if not kept:
            return
        slurm = self.reads.slurm(config)
        try:
            nodes = self.reads.nodes(config)
            for machine in kept:
                node = node_for(machine, nodes)
                if node is not None and drained_by_us(node):
                    fence()
                    slurm.undrain(node.name)
                    self.metrics.orphans_undrained.inc()
                    self._event(
                        mapping,
                        REASON_UNDRAINED,
                        f"Machine {machine_name(machine)}: Slurm node {node.name} was drained by "
                        "a scale-in that did not finish; no scale-in needs it now, so it takes jobs again",
                    )
        except SlurmUnavailable as exc:
            self._slurm_failed(mapping, exc, "cannot check for nodes left drained")


def _age_seconds(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return time.time() - when.timestamp()
