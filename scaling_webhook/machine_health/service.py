"""Slurm-aware machine health of pools that opted in (``slurmHealth``; docs/scaling.md, "Slurm-aware machine health").

The leader's reconciler calls :meth:`MachineHealth.check` once per pass for each such pool, with
the pool's Machines from the watch cache; Slurm's node list comes from the pass's one read
(:class:`~scaling_webhook.slurm.reads.SlurmReads`). Every write first asks ``fence`` (the Lease).

* **Report, always.** Each Machine is judged (:func:`.judge.judge`). One judged unhealthy gets the
  condition ``SlurmNodeHealthy=False`` (reason ``NeverRegistered`` or ``NodeLost``) in its status
  and a Warning Event; one that recovers gets ``True`` and a Normal Event. The condition is the
  memory: a new leader reads it, so nothing is said twice. ``slime_scaling_unhealthy_machines``
  counts them per pool and reason.
* **Remediate, when asked** (``remediate: true``). An unhealthy Machine is deleted (after
  ``slime/remediated: <reason>`` is written on it), and its MachineSet replaces it: the replicas
  never change, so the pool never shrinks. Never a Machine whose node runs a job, never while the
  MachineDeployment or Cluster is paused, and nothing at all when more Machines are unhealthy (or
  being remediated) than ``maxUnhealthy`` allows: MachineHealthCheck's short-circuit, so a
  site-wide outage (slurmctld cut off from every host) deletes nothing.
* Nothing is judged while slurmrestd cannot be read: an outage of Slurm itself reports and
  remediates nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from common.apis import CAPI_VERSIONS
from common.events import EventRecorder, machine_deployment_event, machine_event
from common.kube import KubeClient, KubeError
from common.names import (
    CAPI_GROUP,
    HEALTH_CONDITION,
    PRE_TERMINATE_HOOK,
    REASON_NODE_HEALTHY,
    REASON_NODE_UNHEALTHY,
    REASON_REMEDIATED,
    REASON_SHORT_CIRCUIT,
    REASON_SLURM,
    REMEDIATED_ANNOTATION,
)
from scaling_webhook.errors import ScaleError, denial_code
from scaling_webhook.leader import Fence, no_fence
from scaling_webhook.machine_health.config import SlurmHealthConfig
from scaling_webhook.machine_health.judge import NEVER_REGISTERED, REASONS, Judgment, judge
from scaling_webhook.machinedeployments import MERGE_PATCH
from scaling_webhook.mappings import Mapping, Ref
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.slurm.machines import is_deleting, machine_annotations, machine_name
from scaling_webhook.slurm.reads import SlurmReads
from scaling_webhook.slurm.slurmrestd import SlurmUnavailable

log = logging.getLogger("slime.scaling.machine_health")

HEALTHY_REASON = "NodeHealthy"  # the condition's reason once a Machine judged unhealthy works again


@dataclass
class HealthReport:
    """What one :meth:`MachineHealth.check` of a pool found and did."""

    unhealthy: dict[str, str] = field(default_factory=dict)  # Machine -> reason
    recovered: list[str] = field(default_factory=list)
    remediated: list[str] = field(default_factory=list)
    spared_busy: list[str] = field(default_factory=list)  # unhealthy, but its node runs a job
    short_circuited: bool = False
    paused: str = ""  # why remediation waited (a pause), "" when it did not
    slurm_error: str = ""
    # Every Machine judged never registered, those leaving the pool too: safe scale-in removes them first
    # and lets them go without waiting for a node that will not come.
    never_registered: frozenset[str] = frozenset()


def condition_of(machine: dict[str, Any]) -> dict[str, Any] | None:
    """SliMe's condition on a Machine, if it carries one."""
    for condition in (machine.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == HEALTH_CONDITION:
            return condition
    return None


def with_condition(
    machine: dict[str, Any], api_version: str, healthy: bool, reason: str, message: str, now: datetime
) -> list[dict[str, Any]]:
    """The Machine's conditions with SliMe's set as given; its lastTransitionTime kept when the status stays.

    Cluster API v1beta1 conditions carry a ``severity`` (Warning when False); v1beta2's are
    ``metav1.Condition`` (an ``observedGeneration``, no severity)."""
    status = "True" if healthy else "False"
    old = condition_of(machine)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
    condition: dict[str, Any] = {
        "type": HEALTH_CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if api_version.endswith("/v1beta1"):
        if not healthy:
            condition["severity"] = "Warning"
    else:
        generation = (machine.get("metadata") or {}).get("generation")
        if isinstance(generation, int):
            condition["observedGeneration"] = generation
    others = [
        c
        for c in (machine.get("status") or {}).get("conditions") or []
        if not (isinstance(c, dict) and c.get("type") == HEALTH_CONDITION)
    ]
    return [*others, condition]


class MachineHealth:
    """Machine health for every mapping with ``slurmHealth``. Called from the reconciler's passes (one at a time)."""

    def __init__(self, client: KubeClient, events: EventRecorder, metrics: ScalingMetrics, reads: SlurmReads) -> None:
        self.client = client
        self.events = events
        self.metrics = metrics
        self.reads = reads
        # (pool, Machine, judgment) -> when this leader first saw it so, for Machines with no clock of their own.
        self._first_seen: dict[tuple[Ref, str, str], float] = {}
        self._short_circuited: set[Ref] = set()  # pools whose short-circuit was told (told again once it lifts)
        self._gauged: set[Ref] = set()
        self._slurm_told: dict[Ref, str] = {}  # pool -> the Slurm error last told (each told once)
        self._lock = threading.Lock()

    # --- one pool --------------------------------------------------------------------------------------------

    def check(
        self,
        mapping: Mapping,
        machines: list[dict[str, Any]],
        paused: str = "",
        fence: Fence = no_fence,
    ) -> HealthReport:
        """Judge the pool's ``machines`` (the watch cache), report, and remediate as allowed; raise ScaleError
        on API errors. ``paused``: why the MachineDeployment may not be touched now ("" when it may)."""
        config = mapping.slurm_health
        assert config is not None, "check() is for mappings with slurmHealth"
        report = HealthReport(paused=paused)
        with self._lock:
            try:
                nodes = self.reads.nodes(config)
            except SlurmUnavailable as exc:
                report.slurm_error = exc.cause
                self.metrics.slurm_errors.inc()
                if self._slurm_told.get(mapping.machine_deployment) != exc.cause:
                    self._slurm_told[mapping.machine_deployment] = exc.cause
                    self._md_event(
                        mapping,
                        REASON_SLURM,
                        f"machine health judges nothing while Slurm cannot be read: {exc.cause}",
                        warning=True,
                    )
                return report
            self._slurm_told.pop(mapping.machine_deployment, None)
            now = time.time()
            touched: set[tuple[Ref, str, str]] = set()

            def first_seen(machine: str, reason: str, at: float) -> float:
                key = (mapping.machine_deployment, machine, reason)
                touched.add(key)
                return self._first_seen.setdefault(key, at)

            judged = [j for m in machines if (j := judge(m, nodes, config, now, first_seen)) is not None]
            report.never_registered = frozenset(j.machine for j in judged if j.reason == NEVER_REGISTERED)
            # Unhealthy until gone: a Machine being remediated or removed by a scale-in still counts.
            report.unhealthy = {j.machine: j.reason for j in judged if j.unhealthy}
            judgments = [j for j in judged if not j.leaving]
            for key in [k for k in self._first_seen if k[0] == mapping.machine_deployment and k not in touched]:
                del self._first_seen[key]
            by_name = {machine_name(m): m for m in machines}
            for judgment in judgments:
                self._report(mapping, by_name[judgment.machine], judgment, report, fence)
            self._gauge(mapping, report)
            if config.remediate:
                self._remediate(mapping, config, machines, judgments, report, fence)
        return report

    def _report(
        self, mapping: Mapping, machine: dict[str, Any], judgment: Judgment, report: HealthReport, fence: Fence
    ) -> None:
        old = condition_of(machine)
        name = judgment.machine
        if judgment.unhealthy:
            if old is not None and old.get("status") == "False" and old.get("reason") == judgment.reason:
                return  # told already (by this leader or an earlier one)
            if self._set_condition(mapping, machine, False, judgment.reason, judgment.message, fence):
                log.warning(
                    "Machine is not a working Slurm node",
                    extra={"machine": f"{mapping.machine_deployment[0]}/{name}", "reason": judgment.reason},
                )
                self._machine_event(
                    mapping, machine, REASON_NODE_UNHEALTHY, f"{judgment.reason}: {judgment.message}", warning=True
                )
        elif old is not None and old.get("status") == "False":
            node = judgment.node.name if judgment.node is not None else "its node"
            message = f"Slurm node {node} registered and responds"
            if self._set_condition(mapping, machine, True, HEALTHY_REASON, message, fence):
                report.recovered.append(name)
                self._machine_event(mapping, machine, REASON_NODE_HEALTHY, message)

    def _gauge(self, mapping: Mapping, report: HealthReport) -> None:
        ref = mapping.machine_deployment_ref
        for reason in REASONS:
            count = sum(1 for why in report.unhealthy.values() if why == reason)
            self.metrics.unhealthy_machines.labels(ref, reason).set(count)
        self._gauged.add(mapping.machine_deployment)

    def _remediate(
        self,
        mapping: Mapping,
        config: SlurmHealthConfig,
        machines: list[dict[str, Any]],
        judgments: list[Judgment],
        report: HealthReport,
        fence: Fence,
    ) -> None:
        unhealthy = [j for j in judgments if j.unhealthy]
        in_flight = {machine_name(m) for m in machines if REMEDIATED_ANNOTATION in machine_annotations(m)}
        counted = in_flight | {j.machine for j in unhealthy}
        limit = config.max_unhealthy.limit(len(machines))
        ref = mapping.machine_deployment
        if len(counted) > limit:
            report.short_circuited = True
            self.metrics.remediation_short_circuits.inc()
            if ref not in self._short_circuited:
                self._short_circuited.add(ref)
                self._md_event(
                    mapping,
                    REASON_SHORT_CIRCUIT,
                    f"{len(counted)} of {len(machines)} Machines are unhealthy or being remediated, more than "
                    f"maxUnhealthy {config.max_unhealthy} allows ({limit}): none is remediated until fewer are "
                    f"(unhealthy: {', '.join(sorted(j.machine for j in unhealthy)) or 'none'})",
                    warning=True,
                )
            return
        self._short_circuited.discard(ref)
        if report.paused:
            return
        by_name = {machine_name(m): m for m in machines}
        for judgment in unhealthy:
            machine = by_name[judgment.machine]
            if judgment.busy:
                report.spared_busy.append(judgment.machine)
                continue
            if is_deleting(machine):
                continue
            if mapping.safe_scale_in is not None and PRE_TERMINATE_HOOK not in machine_annotations(machine):
                continue  # safe scale-in puts its hook on first (this pass), so the deletion waits for Slurm
            if self._delete(mapping, machine, judgment, fence):
                report.remediated.append(judgment.machine)

    def _delete(self, mapping: Mapping, machine: dict[str, Any], judgment: Judgment, fence: Fence) -> bool:
        """Mark and delete one Machine; False when it was gone or changed since it was judged (nothing done)."""
        namespace, name = mapping.machine_deployment[0], judgment.machine
        path = self._machines()
        # The mark is conditional on the Machine as judged: a pass whose cache has not yet seen an earlier pass's
        # mark and deletion gets a 409 and leaves the Machine to the next pass, so one fault is remediated once.
        metadata: dict[str, Any] = {"annotations": {REMEDIATED_ANNOTATION: judgment.reason}}
        version = (machine.get("metadata") or {}).get("resourceVersion")
        if version:
            metadata["resourceVersion"] = version
        try:
            fence()
            self.client.request(
                "PATCH", path.item(namespace, name), body={"metadata": metadata}, content_type=MERGE_PATCH, timeout=5.0
            )
            fence()
            uid = (machine.get("metadata") or {}).get("uid")
            self.client.request(
                "DELETE",
                path.item(namespace, name),
                body={"preconditions": {"uid": uid}} if uid else None,
                timeout=5.0,
            )
        except KubeError as exc:
            if exc.status in (404, 409):  # gone, or changed since it was judged: the next pass judges it again
                return False
            raise ScaleError(f"cannot remediate Machine {namespace}/{name}: {exc}", denial_code(exc.status)) from None
        self.metrics.remediations.labels(judgment.reason).inc()
        message = (
            f"{judgment.reason}: {judgment.message}; Machine deleted, its MachineSet makes a new one "
            "(the replicas are unchanged)"
        )
        log.warning("Machine remediated", extra={"machine": f"{namespace}/{name}", "reason": judgment.reason})
        self._machine_event(mapping, machine, REASON_REMEDIATED, message, warning=True)
        self._md_event(mapping, REASON_REMEDIATED, f"Machine {name}: {message}", warning=True)
        return True

    # --- pools that left ---------------------------------------------------------------------------------------

    def retain(self, pools: set[Ref]) -> None:
        """Forget pools no longer under machine health (their gauges go, their clocks too)."""
        with self._lock:
            for ref in self._gauged - pools:
                for reason in REASONS:
                    try:
                        self.metrics.unhealthy_machines.remove(f"{ref[0]}/{ref[1]}", reason)
                    except KeyError:
                        pass
            self._gauged &= pools
            self._short_circuited &= pools
            self._slurm_told = {ref: told for ref, told in self._slurm_told.items() if ref in pools}
            for key in [k for k in self._first_seen if k[0] not in pools]:
                del self._first_seen[key]

    # --- plumbing ----------------------------------------------------------------------------------------------

    def _machines(self) -> Any:
        try:
            return self.client.resource(CAPI_GROUP, "machines", CAPI_VERSIONS)
        except KubeError as exc:
            raise ScaleError(f"cannot find the Machine API: {exc}", denial_code(exc.status)) from None

    def _set_condition(
        self, mapping: Mapping, machine: dict[str, Any], healthy: bool, reason: str, message: str, fence: Fence
    ) -> bool:
        """Write SliMe's condition, conditional on the cached resourceVersion (the list is written whole);
        False when the Machine changed or went meanwhile (the next pass judges it again)."""
        path = self._machines()
        namespace, name = mapping.machine_deployment[0], machine_name(machine)
        api_version = f"{CAPI_GROUP}/{path.version}"
        conditions = with_condition(machine, api_version, healthy, reason, message, datetime.now(UTC))
        body = {
            "metadata": {"resourceVersion": (machine.get("metadata") or {}).get("resourceVersion")},
            "status": {"conditions": conditions},
        }
        try:
            fence()
            self.client.request(
                "PATCH", path.item(namespace, name, "status"), body=body, content_type=MERGE_PATCH, timeout=5.0
            )
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise ScaleError(
                f"cannot set condition {HEALTH_CONDITION} on Machine {namespace}/{name}: {exc}",
                denial_code(exc.status),
            ) from None
        return True

    def _machine_event(
        self, mapping: Mapping, machine: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        metadata = machine.get("metadata") or {}
        self.events.record(
            machine_event(
                mapping.machine_deployment[0],
                machine_name(machine),
                str(metadata.get("uid") or ""),
                self._api_version(),
                reason,
                message,
                warning,
            )
        )

    def _md_event(self, mapping: Mapping, reason: str, message: str, warning: bool = False) -> None:
        self.events.record(
            machine_deployment_event(mapping.machine_deployment, self._api_version(), reason, message, warning)
        )

    def _api_version(self) -> str:
        """``cluster.x-k8s.io/<the served version>`` of Machines and MachineDeployments ("" when unknown)."""
        try:
            return f"{CAPI_GROUP}/{self._machines().version}"
        except ScaleError:
            return ""
