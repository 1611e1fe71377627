"""App factory of the scaling webhook: ``POST /validate`` over the shared admission transport."""

from __future__ import annotations

from starlette.types import ASGIApp

from common.metrics import WebhookMetrics
from common.webhook import AdmissionEndpoint, AdmissionHandler, admission_app

WEBHOOK_NAME = "scaling"
PATH = "/validate"


def create_app(
    handler: AdmissionHandler, metrics: WebhookMetrics, max_body_bytes: int, deadline_seconds: float = 5.0
) -> ASGIApp:
    endpoint = AdmissionEndpoint(WEBHOOK_NAME, handler, metrics, max_body_bytes, deadline_seconds)
    return admission_app("SliMe scaling webhook", PATH, endpoint)
