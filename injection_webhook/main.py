"""``injection-webhook``: serve the mutating webhook that adds Slurm join data to Metal3 metadata."""

from __future__ import annotations

from collections.abc import Sequence

from common.cli import run_service
from common.events import EventRecorder
from common.kube import client_from_kubeconfig, local_client
from common.metrics import WebhookMetrics
from common.names import INJECTION_COMPONENT
from common.serving import Readiness, ServiceRunner, runner_for
from injection_webhook.app import create_app
from injection_webhook.metrics import InjectionMetrics
from injection_webhook.resolver import InjectionResolver
from injection_webhook.settings import InjectionSettings


def build(settings: InjectionSettings) -> ServiceRunner:
    """Wire the service; nothing runs until ``serve``/``run`` (tests call this too)."""
    metrics = InjectionMetrics(WebhookMetrics())
    client = local_client(settings.kubeconfig, INJECTION_COMPONENT)
    resolver = InjectionResolver(
        client,
        settings.controller_selector,
        settings.cache_sync_timeout_seconds,
        workload_client=lambda data, name: client_from_kubeconfig(data, name, INJECTION_COMPONENT),
        options=settings.join_options(),
    )
    resolver.start()
    readiness = Readiness()
    readiness.add("caches", resolver.not_ready_reason)
    events = EventRecorder(client, INJECTION_COMPONENT).start()
    # The deadline leaves a first admission its wait for cold caches, and answers before the
    # API server's own timeout (the chart's timeoutSeconds: 10) gives up on the webhook.
    app = create_app(
        resolver,
        metrics,
        settings.max_body_bytes,
        settings.requesters(),
        events,
        deadline_seconds=settings.cache_sync_timeout_seconds + 2.0,
    )
    return runner_for(settings, app, metrics.webhook, readiness, on_stop=[resolver.stop, events.stop])


def main(argv: Sequence[str] | None = None) -> None:
    run_service(
        InjectionSettings,
        "injection-webhook",
        build,
        argv,
        description="Serve the mutating admission webhook that adds Slurm join data to Metal3 metaData Secrets.",
    )


if __name__ == "__main__":
    main()
