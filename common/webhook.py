"""One admission endpoint: bytes in, handler, bytes out, and the bookkeeping around it.

This is the only place that reads request bodies, counts outcomes, times requests and recovers
from exceptions, so neither service repeats any of it. A handler is an async callable from the
decoded ``request`` dict to an :class:`AdmissionResponse`.

Every request gets an AdmissionReview answer, never a bare 5xx: a body that is not a usable
review is answered with an errored review (400, 413 or 415) and counted as malformed; a handler
that raises or passes ``deadline_seconds`` is answered 500 or 503 and counted.

A body larger than :data:`LARGE_BODY_BYTES` (kube-apiserver's reviews for SliMe are a few
kilobytes) is reviewed one at a time: it is decoded in a worker thread, so the loop keeps serving
the admissions around it, and one that cannot start within :data:`LARGE_QUEUE_SECONDS` is
answered 503 at once (the API server retries). A burst of large hostile bodies then costs one
large review's work at any moment, and every answer stays prompt.

The large bodies (over :data:`LARGE_BODY_BYTES`) of all requests being read and handled together
may hold at most ``body_budget`` bytes: one whose declared size (or, sent in chunks, whose next
chunk) would pass it is answered 503 before more of it is read. Many parallel bodies just under
the size cap therefore cost a bounded amount of memory, however many connections carry them,
while the few kilobytes of a normal review never wait for the budget (the connection caps already
bound how many of those there can be).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp

from common.admission import (
    AdmissionError,
    AdmissionResponse,
    RequestSummary,
    bounded,
    check_content_type,
    decode_review,
    encode_review,
    errored,
)
from common.metrics import WebhookMetrics

AdmissionHandler = Callable[[dict[str, Any]], Awaitable[AdmissionResponse]]

log = logging.getLogger("slime.admission")

LARGE_BODY_BYTES = 64 * 1024
MESSAGE_LIMIT = 2048  # a decision's message in a log line: the longest SliMe writes is a few hundred characters
LARGE_QUEUE_SECONDS = 0.1


class _OverBudget(Exception):
    """Reading this body would pass the budget of body bytes in flight."""


class BodyBudget:
    """Bytes of request bodies held by the admissions in progress (on the event loop: no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    @contextlib.contextmanager
    def claim(self) -> Iterator[Callable[[int], None]]:
        """A ``take(size)`` for one request; what it took is given back when the request is answered."""
        taken = 0

        def take(size: int) -> None:
            nonlocal taken
            if self.held + size > self.limit:
                raise _OverBudget
            self.held += size
            taken += size

        try:
            yield take
        finally:
            self.held -= taken


class AdmissionEndpoint:
    """A Starlette endpoint serving one webhook path."""

    def __init__(
        self,
        webhook: str,
        handler: AdmissionHandler,
        metrics: WebhookMetrics,
        max_body_bytes: int,
        deadline_seconds: float = 5.0,
        body_budget: int = 16 * 1024 * 1024,
    ) -> None:
        self.webhook = webhook
        self.budget = BodyBudget(max(body_budget, max_body_bytes))
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.deadline_seconds = deadline_seconds
        self._metrics = metrics
        self._one_large = asyncio.Semaphore(1)
        self._too_large = f"request entity is too large; limit is {max_body_bytes} bytes"
        self._latency = metrics.latency.labels(webhook)
        self._in_flight = metrics.in_flight.labels(webhook)
        self._outcomes = {o: metrics.requests.labels(webhook, o) for o in ("allowed", "patched", "denied", "errored")}

    async def serve(self, http_request: Request) -> Response:
        started = time.perf_counter()
        self._in_flight.inc()
        try:
            try:
                uid, response, summary = await self._review(http_request)
            except ClientDisconnect:
                # The client went away (or was let go) before its request was whole: nobody to answer.
                self._metrics.malformed.labels(self.webhook, "499").inc()
                return Response(status_code=400)
            except Exception as exc:
                log.exception("admission failed", extra={"webhook": self.webhook, "error_type": type(exc).__name__})
                uid, summary = "", None
                response = errored(500, f"internal error ({type(exc).__name__}) in {self.webhook} webhook")
            body = encode_review(uid, response)
            self._outcomes[response.outcome].inc()
            self._log(summary, uid, response, time.perf_counter() - started)
            return Response(body, media_type="application/json")
        finally:
            self._in_flight.dec()
            self._latency.observe(time.perf_counter() - started)

    async def _review(self, http_request: Request) -> tuple[str, AdmissionResponse, RequestSummary | None]:
        with self.budget.claim() as take:
            return await self._reviewed(http_request, take)

    async def _reviewed(
        self, http_request: Request, take: Callable[[int], None]
    ) -> tuple[str, AdmissionResponse, RequestSummary | None]:
        try:
            check_content_type(http_request.headers.get("content-type"))
            raw = await self._read_body(http_request, take)
        except AdmissionError as exc:
            self._metrics.malformed.labels(self.webhook, str(exc.code)).inc()
            return exc.uid, errored(exc.code, exc.message), None
        except _OverBudget:
            self._metrics.busy.labels(self.webhook, "body-budget").inc()
            return "", errored(503, f"the {self.webhook} webhook is reading too many request bodies; retry"), None
        if len(raw) <= LARGE_BODY_BYTES:
            return await self._decided(raw, large=False)
        try:
            await asyncio.wait_for(self._one_large.acquire(), LARGE_QUEUE_SECONDS)
        except TimeoutError:
            self._metrics.busy.labels(self.webhook, "large-review").inc()
            return "", errored(503, f"the {self.webhook} webhook is reviewing another large request; retry"), None
        try:
            return await self._decided(raw, large=True)
        finally:
            self._one_large.release()

    async def _decided(self, raw: bytes, large: bool) -> tuple[str, AdmissionResponse, RequestSummary | None]:
        try:
            request = await asyncio.to_thread(decode_review, raw) if large else decode_review(raw)
        except AdmissionError as exc:
            self._metrics.malformed.labels(self.webhook, str(exc.code)).inc()
            return exc.uid, errored(exc.code, exc.message), None
        summary = RequestSummary.of(request)
        try:
            return summary.uid, await asyncio.wait_for(self.handler(request), self.deadline_seconds), summary
        except TimeoutError:
            self._metrics.deadline_exceeded.labels(self.webhook).inc()
            uid = bounded(summary.uid)
            message = f"the {self.webhook} webhook did not decide within {self.deadline_seconds:g}s (uid {uid}); retry"
            return summary.uid, errored(503, message), summary
        except Exception as exc:
            log.exception(
                "handler failed",
                extra={"webhook": self.webhook, "uid": bounded(summary.uid), "error_type": type(exc).__name__},
            )
            uid = bounded(summary.uid)
            message = f"internal error ({type(exc).__name__}) in {self.webhook} webhook; see its log for uid {uid}"
            return summary.uid, errored(500, message), summary

    async def _read_body(self, http_request: Request, take: Callable[[int], None]) -> bytes:
        """Read at most ``max_body_bytes``; stop as soon as the cap or the budget is passed."""
        declared = http_request.headers.get("content-length", "")
        taken = 0  # of the budget, for this body
        if declared.isdigit():
            if int(declared) > self.max_body_bytes:
                raise AdmissionError(413, self._too_large)
            if int(declared) > LARGE_BODY_BYTES:
                take(int(declared))  # uvicorn holds the body to the size it declared
                taken = int(declared)
        chunks: list[bytes] = []
        size = 0
        async for chunk in http_request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise AdmissionError(413, self._too_large)
            if size > LARGE_BODY_BYTES and size > taken:
                take(size - taken)
                taken = size
            chunks.append(chunk)
        return b"".join(chunks)

    def _log(self, summary: RequestSummary | None, uid: str, response: AdmissionResponse, seconds: float) -> None:
        fields: dict[str, Any] = {
            "webhook": self.webhook,
            "uid": bounded(uid),
            "decision": response.outcome,
            "duration_ms": round(seconds * 1000, 3),
        }
        if summary is not None:
            fields.update(
                kind=summary.kind,
                namespace=summary.namespace,
                name=summary.name,
                operation=summary.operation,
                dry_run=summary.dry_run,
                requester=summary.requester,
            )
        if response.message:
            fields["reason"] = bounded(response.message, MESSAGE_LIMIT)
        # Requests we do not act on would drown the audit trail, so they log at debug.
        quiet = response.outcome == "allowed" and not response.message
        log.log(logging.DEBUG if quiet else logging.INFO, "admission", extra={"fields": fields})


def admission_app(title: str, path: str, endpoint: AdmissionEndpoint) -> ASGIApp:
    """A FastAPI app serving one admission path and nothing else (no docs pages on the TLS port)."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_route(path, endpoint.serve, methods=["POST"])
    return app
