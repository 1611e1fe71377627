"""Wiring of the injection webhook: settings in, a runner out (nothing serves until it runs).

The parts: the resolver (caches of the management cluster and of workload clusters), the
admission handler (:class:`~injection_webhook.admission.InjectionAdmission`) behind ``POST
/mutate`` on the shared transport, the Event recorder, and the readiness check on the caches.
"""

from __future__ import annotations

from common.events import EventRecorder, RateLimitedEvents
from common.health import Readiness
from common.kube import client_from_kubeconfig, local_client
from common.metrics import WebhookMetrics
from common.names import INJECTION_COMPONENT
from common.serving import ServiceRunner, runner_for
from common.webhook import AdmissionEndpoint, admission_app
from injection_webhook.admission import InjectionAdmission
from injection_webhook.metrics import InjectionMetrics
from injection_webhook.resolver import InjectionResolver
from injection_webhook.settings import InjectionSettings

WEBHOOK_NAME = "injection"
PATH = "/mutate"
EVENT_INTERVAL_SECONDS = 60.0  # one withheld Event per Metal3Data a minute at most


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
        bindings=settings.bindings(),
    )
    resolver.start()
    readiness = Readiness()
    readiness.add("caches", resolver.not_ready_reason)
    recorder = EventRecorder(client, INJECTION_COMPONENT).start()
    admission = InjectionAdmission(
        resolver, metrics, settings.requesters(), RateLimitedEvents(recorder, EVENT_INTERVAL_SECONDS)
    )
    # The deadline leaves a first admission its wait for cold caches, and answers before the
    # API server's own timeout (the chart's timeoutSeconds: 10) gives up on the webhook.
    endpoint = AdmissionEndpoint(
        WEBHOOK_NAME,
        admission,
        metrics.webhook,
        settings.max_body_bytes,
        deadline_seconds=settings.cache_sync_timeout_seconds + 2.0,
        body_budget=settings.max_body_bytes_in_flight,
    )
    app = admission_app("SliMe injection webhook", PATH, endpoint)
    return runner_for(settings, app, metrics.webhook, readiness, on_stop=[resolver.stop, recorder.stop])
