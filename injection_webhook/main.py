"""``injection-webhook``: serve the mutating webhook that adds Slurm join data to Metal3 metadata."""

from __future__ import annotations

from collections.abc import Sequence

from common.cli import run_service
from common.kube import client_from_kubeconfig, local_client
from common.metrics import WebhookMetrics
from common.serving import Readiness, ServiceRunner, runner_for
from injection_webhook.app import create_app
from injection_webhook.large import LargeEdits
from injection_webhook.resolver import InjectionResolver
from injection_webhook.settings import InjectionSettings

USER_AGENT = "slime-injection-webhook"


def build(settings: InjectionSettings) -> ServiceRunner:
    """Wire the service; nothing runs until ``serve``/``run`` (tests call this too)."""
    metrics = WebhookMetrics()
    resolver = InjectionResolver(
        local_client(settings.kubeconfig, USER_AGENT),
        settings.controller_selector,
        settings.cache_sync_timeout_seconds,
        workload_client=lambda data, name: client_from_kubeconfig(data, name, USER_AGENT),
        options=settings.join_options(),
    )
    resolver.start()
    readiness = Readiness()
    readiness.add("caches", resolver.not_ready_reason)
    edits = LargeEdits()
    return runner_for(
        settings,
        create_app(resolver, edits, metrics, settings.max_body_bytes),
        metrics,
        readiness,
        on_stop=[resolver.stop, edits.close],
    )


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
