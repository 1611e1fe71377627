"""A minimal webhook built only from ``common/``, to test the shared transport and serving."""

from __future__ import annotations

from typing import Any

from common.admission import AdmissionResponse
from common.metrics import WebhookMetrics
from common.serving import Readiness, ServiceRunner, ServingCertificate
from common.webhook import AdmissionEndpoint, AdmissionHandler, admission_app
from testbed.pki import Pki
from testbed.serve import RunningService, serve_in_thread


def serve_handler(handler: AdmissionHandler, pki: Pki, max_body_bytes: int = 64 * 1024, poll_seconds: float = 10.0,
                  client_ca_file: str | None = None) -> RunningService:
    metrics = WebhookMetrics()
    endpoint = AdmissionEndpoint("test", handler, metrics, max_body_bytes)
    runner = ServiceRunner(
        webhook_app=admission_app("test", "/review", endpoint),
        certificate=ServingCertificate(str(pki.cert_file), str(pki.key_file), metrics, poll_seconds, client_ca_file),
        metrics=metrics,
        readiness=Readiness(),
    )
    return serve_in_thread(runner, pki.ca_file)


async def echo_allow(request: dict[str, Any]) -> AdmissionResponse:
    from common.admission import allow

    return allow()
