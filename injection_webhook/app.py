"""App factory of the injection webhook: ``POST /mutate`` over the shared admission transport."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp

from common.admission import AdmissionResponse, allow
from common.metrics import WebhookMetrics
from common.webhook import AdmissionEndpoint, AdmissionHandler, admission_app
from injection_webhook.handler import select
from injection_webhook.large import LargeEdits
from injection_webhook.resolver import InjectionResolver, NeedsWait

WEBHOOK_NAME = "injection"
PATH = "/mutate"


def make_handler(resolver: InjectionResolver, edits: LargeEdits) -> AdmissionHandler:
    async def handle(request: dict[str, Any]) -> AdmissionResponse:
        secret = select(request)
        if secret is None:
            return allow()
        try:
            resolution = resolver.resolve(secret)  # warm caches: dict reads, no I/O
        except NeedsWait:
            resolution = await asyncio.to_thread(resolver.resolve, secret, True)
        return await edits.respond(secret, resolution)

    return handle


def create_app(resolver: InjectionResolver, edits: LargeEdits, metrics: WebhookMetrics, max_body_bytes: int) -> ASGIApp:
    endpoint = AdmissionEndpoint(WEBHOOK_NAME, make_handler(resolver, edits), metrics, max_body_bytes)
    return admission_app("SliMe injection webhook", PATH, endpoint)
