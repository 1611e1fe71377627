"""Wiring of the scaling webhook: settings in, the wired parts out (nothing serves until the runner runs).

The parts: the mapping source (the ConfigMap), the watches of mapped objects, the Lease elector,
the reconciler (the one writer) with safe scale-in and node demand, the admission handler
(:class:`~scaling_webhook.admission.ScaleAdmission`) behind ``POST /validate`` on the shared
transport, and the Event recorder. A :class:`~scaling_webhook.reconciler.Wakeup`, made first, is
what the watches, the mapping source and the elector call when something changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.events import EventRecorder
from common.health import Readiness
from common.kube import KubeClient, local_client
from common.metrics import WebhookMetrics
from common.names import SCALING_COMPONENT
from common.serving import ServiceRunner, runner_for
from common.webhook import AdmissionEndpoint, admission_app
from scaling_webhook.admission import ScaleAdmission
from scaling_webhook.demand_poller import DemandPoller
from scaling_webhook.leader import LeaderElector
from scaling_webhook.machine_health.service import MachineHealth
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import MappingSource, MappingTable
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.reconciler import Change, Reconciler, Wakeup
from scaling_webhook.safe_scale_in.service import SafeScaleIn
from scaling_webhook.settings import ScalingSettings
from scaling_webhook.slurm.reads import SlurmReads
from scaling_webhook.watches import MappedObjects

WEBHOOK_NAME = "scaling"
PATH = "/validate"


@dataclass
class ScalingService:
    """The wired parts; ``runner`` is what ``main`` runs, the others are what tests and tools look at."""

    runner: ServiceRunner
    client: KubeClient
    source: MappingSource
    objects: MappedObjects
    scaler: MachineDeploymentScaler
    events: EventRecorder
    reconciler: Reconciler
    metrics: ScalingMetrics
    demand: DemandPoller
    reads: SlurmReads
    leader: LeaderElector | None = None
    safe: SafeScaleIn | None = None

    def reconcile_once(self) -> list[Change]:
        return self.reconciler.reconcile_once()

    def stop(self) -> None:
        """Release threads and clients (the runner calls this after serving)."""
        self.source.stop()
        self.objects.stop()
        self.events.stop()
        self.events.flush(2.0)
        self.reads.close()
        self.demand.close()


def _elector(settings: ScalingSettings, client: KubeClient, metrics: ScalingMetrics, wakeup: Wakeup) -> LeaderElector:
    def on_leadership(leading: bool) -> None:
        metrics.leader.set(1 if leading else 0)
        wakeup()

    return LeaderElector(
        client,
        settings.namespace,
        settings.lease_name,
        lease_seconds=settings.lease_duration_seconds,
        renew_deadline_seconds=settings.lease_renew_deadline_seconds,
        retry_seconds=settings.lease_retry_seconds,
        on_change=on_leadership,
    )


def build_service(settings: ScalingSettings) -> ScalingService:
    """Wire the service; informer and Event threads start here, the server on ``serve``/``run``."""
    webhook_metrics = WebhookMetrics()
    metrics = ScalingMetrics(webhook_metrics)
    client = local_client(settings.kubeconfig, SCALING_COMPONENT)
    wakeup = Wakeup()
    scaler = MachineDeploymentScaler(client, settings.patch_timeout_seconds)
    events = EventRecorder(client, SCALING_COMPONENT, metrics.event_result)
    source = MappingSource(client, settings.namespace, settings.config_map, metrics.config_status)
    reads = SlurmReads(client)  # slurmrestd for the Slurm opt-ins: one node list per endpoint per pass
    safe = SafeScaleIn(client, scaler, events, metrics, reads)  # used only by mappings with safeScaleIn
    health = MachineHealth(client, events, metrics, reads)  # used only by mappings with slurmHealth
    demand = DemandPoller(client, source, metrics, settings.demand_interval_seconds)  # mappings with nodeDemand
    leader = _elector(settings, client, metrics, wakeup) if settings.leader_election else None
    if leader is None:
        metrics.leader.set(1)
    objects = MappedObjects(client, scaler, on_change=wakeup)
    reconciler = Reconciler(
        source,
        objects,
        scaler,
        events,
        metrics,
        settings.resync_seconds,
        wakeup,
        reads,
        leader=leader,
        safe=safe,
        health=health,
    )

    def on_mappings(table: MappingTable) -> None:
        metrics.mappings.set(len(table))
        wakeup()

    source.add_listener(on_mappings)
    readiness = Readiness()
    readiness.add("configmap", source.not_ready_reason)
    admission = ScaleAdmission(lambda: source.table, objects, scaler, metrics, settings.scale_requester_set())
    # The deadline covers one fresh read of the mirror (patch_timeout_seconds) and answers before the
    # API server's timeout (the chart's timeoutSeconds: 5).
    endpoint = AdmissionEndpoint(
        WEBHOOK_NAME,
        admission,
        webhook_metrics,
        settings.max_body_bytes,
        settings.patch_timeout_seconds + 1.0,
        settings.max_body_bytes_in_flight,
    )
    app = admission_app("SliMe scaling webhook", PATH, endpoint)
    background = [reconciler.run, demand.run] + ([leader.run] if leader is not None else [])
    runner = runner_for(settings, app, webhook_metrics, readiness, background=background, health_routes=demand.routes())
    service = ScalingService(
        runner, client, source, objects, scaler, events, reconciler, metrics, demand, reads, leader, safe
    )
    runner.on_stop.append(service.stop)
    events.start()
    source.start()
    return service


def build(settings: ScalingSettings) -> ServiceRunner:
    """Wire the service; nothing serves until ``serve``/``run`` (tests call this too)."""
    return build_service(settings).runner
