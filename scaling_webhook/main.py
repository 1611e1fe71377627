"""``scaling-webhook``: serve the validating webhook that scales MachineDeployments from mirrors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.cli import run_service
from common.kube import KubeClient, local_client
from common.metrics import WebhookMetrics
from common.serving import Readiness, ServiceRunner, runner_for
from scaling_webhook.app import create_app
from scaling_webhook.events import EventRecorder
from scaling_webhook.flow import ScaleAdmission
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import MappingSource, MappingTable
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.reconciler import Drift, Reconciler
from scaling_webhook.safe_scale_in.service import SafeScaleIn
from scaling_webhook.settings import ScalingSettings

USER_AGENT = "slime-scaling-webhook"


@dataclass
class ScalingService:
    """The wired parts, for tests and tools; ``runner`` is what ``main`` runs."""

    runner: ServiceRunner
    client: KubeClient
    source: MappingSource
    scaler: MachineDeploymentScaler
    events: EventRecorder
    reconciler: Reconciler
    metrics: ScalingMetrics
    safe: SafeScaleIn | None = None

    def reconcile_once(self) -> list[Drift]:
        return self.reconciler.reconcile_once()


def build_service(settings: ScalingSettings) -> ScalingService:
    """Wire the service; informer and event threads start here, the server on ``serve``/``run``."""
    webhook_metrics = WebhookMetrics()
    metrics = ScalingMetrics(webhook_metrics)
    client = local_client(settings.kubeconfig, USER_AGENT)
    scaler = MachineDeploymentScaler(client, settings.patch_timeout_seconds)
    events = EventRecorder(client, metrics.event_result)
    source = MappingSource(client, settings.namespace, settings.config_map, metrics.config_status)
    safe = SafeScaleIn(client, scaler, events, metrics)  # used only by mappings with safeScaleIn
    reconciler = Reconciler(source, scaler, events, metrics, settings.resync_seconds, safe=safe)

    def on_change(table: MappingTable) -> None:
        metrics.mappings.set(len(table))
        reconciler.trigger()

    source.add_listener(on_change)
    readiness = Readiness()
    readiness.add("configmap", source.not_ready_reason)

    def stop() -> None:
        source.stop()
        events.stop()
        events.flush(2.0)
        safe.close()

    app = create_app(
        ScaleAdmission(lambda: source.table, scaler, events, metrics, settings.patch_timeout_seconds, safe),
        webhook_metrics,
        settings.max_body_bytes,
    )
    runner = runner_for(settings, app, webhook_metrics, readiness, background=[reconciler.run], on_stop=[stop])
    events.start()
    source.start()
    return ScalingService(runner, client, source, scaler, events, reconciler, metrics, safe)


def build(settings: ScalingSettings) -> ServiceRunner:
    """Wire the service; nothing serves until ``serve``/``run`` (tests call this too)."""
    return build_service(settings).runner


def main(argv: Sequence[str] | None = None) -> None:
    run_service(ScalingSettings, "scaling-webhook", build, argv,
                description="Serve the validating admission webhook that scales Cluster API MachineDeployments from mirror Deployments.")


if __name__ == "__main__":
    main()
