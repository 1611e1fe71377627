"""``scaling-webhook``: serve the validating webhook that scales MachineDeployments from mirrors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.cli import run_service
from common.events import EventRecorder
from common.kube import KubeClient, local_client
from common.metrics import WebhookMetrics
from common.names import SCALING_COMPONENT
from common.serving import Readiness, ServiceRunner, runner_for
from scaling_webhook.app import create_app
from scaling_webhook.demand_poller import DemandPoller
from scaling_webhook.flow import ScaleAdmission
from scaling_webhook.leader import LeaderElector
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import MappingSource, MappingTable
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.reconciler import Change, Reconciler
from scaling_webhook.safe_scale_in.service import SafeScaleIn
from scaling_webhook.settings import ScalingSettings
from scaling_webhook.watches import MappedObjects


@dataclass
class ScalingService:
    """The wired parts, for tests and tools; ``runner`` is what ``main`` runs."""

    runner: ServiceRunner
    client: KubeClient
    source: MappingSource
    objects: MappedObjects
    scaler: MachineDeploymentScaler
    events: EventRecorder
    reconciler: Reconciler
    metrics: ScalingMetrics
    demand: DemandPoller
    leader: LeaderElector | None = None
    safe: SafeScaleIn | None = None

    def reconcile_once(self) -> list[Change]:
        return self.reconciler.reconcile_once()


def build_service(settings: ScalingSettings) -> ScalingService:
    """Wire the service; informer and event threads start here, the server on ``serve``/``run``."""
    webhook_metrics = WebhookMetrics()
    metrics = ScalingMetrics(webhook_metrics)
    client = local_client(settings.kubeconfig, SCALING_COMPONENT)
    scaler = MachineDeploymentScaler(client, settings.patch_timeout_seconds)
    events = EventRecorder(client, SCALING_COMPONENT, metrics.event_result)
    source = MappingSource(client, settings.namespace, settings.config_map, metrics.config_status)
    safe = SafeScaleIn(client, scaler, events, metrics)  # used only by mappings with safeScaleIn
    demand = DemandPoller(
        client, source, metrics, settings.demand_interval_seconds
    )  # polls only for mappings with nodeDemand
    leader: LeaderElector | None = None
    wake: list[Reconciler] = []

    def poke(*_: object) -> None:
        for reconciler in wake:
            reconciler.trigger()

    if settings.leader_election:

        def on_leadership(leading: bool) -> None:
            metrics.leader.set(1 if leading else 0)
            poke()

        leader = LeaderElector(
            client,
            settings.namespace,
            settings.lease_name,
            lease_seconds=settings.lease_duration_seconds,
            renew_deadline_seconds=settings.lease_renew_deadline_seconds,
            retry_seconds=settings.lease_retry_seconds,
            on_change=on_leadership,
        )
    else:
        metrics.leader.set(1)
    objects = MappedObjects(client, scaler, on_change=poke)
    reconciler = Reconciler(source, objects, scaler, events, metrics, settings.resync_seconds, leader=leader, safe=safe)
    wake.append(reconciler)

    def on_change(table: MappingTable) -> None:
        metrics.mappings.set(len(table))
        reconciler.trigger()

    source.add_listener(on_change)
    readiness = Readiness()
    readiness.add("configmap", source.not_ready_reason)

    def stop() -> None:
        source.stop()
        objects.stop()
        events.stop()
        events.flush(2.0)
        safe.close()
        demand.close()

    admission = ScaleAdmission(lambda: source.table, objects, scaler, metrics, settings.scale_requester_set())
    # The deadline covers one fresh read of the mirror (patch_timeout_seconds) and answers before the
    # API server's timeout (the chart's timeoutSeconds: 5).
    app = create_app(admission, webhook_metrics, settings.max_body_bytes, settings.patch_timeout_seconds + 1.0)
    background = [reconciler.run, demand.run] + ([leader.run] if leader is not None else [])
    runner = runner_for(
        settings, app, webhook_metrics, readiness, background=background, on_stop=[stop], health_routes=demand.routes()
    )
    events.start()
    source.start()
    return ScalingService(runner, client, source, objects, scaler, events, reconciler, metrics, demand, leader, safe)


def build(settings: ScalingSettings) -> ServiceRunner:
    """Wire the service; nothing serves until ``serve``/``run`` (tests call this too)."""
    return build_service(settings).runner


def main(argv: Sequence[str] | None = None) -> None:
    run_service(
        ScalingSettings,
        "scaling-webhook",
        build,
        argv,
        description=(
            "Serve the validating admission webhook that scales Cluster API MachineDeployments from mirror Deployments."
        ),
    )


if __name__ == "__main__":
    main()
