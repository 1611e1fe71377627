"""The plain-HTTP health and metrics app: ``/healthz``, ``/readyz`` (named checks) and ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from common.metrics import WebhookMetrics
from common.version import build_info


@dataclass
class Readiness:
    """Named readiness checks; ``/readyz`` is ready only when all pass and we are not stopping."""

    checks: dict[str, Callable[[], str | None]] = field(default_factory=dict)
    stopping: bool = False

    def add(self, name: str, check: Callable[[], str | None]) -> None:
        """``check`` returns None when ready, else why not."""
        self.checks[name] = check

    def failures(self) -> dict[str, str]:
        failed = {name: why for name, check in self.checks.items() if (why := check()) is not None}
        if self.stopping:
            failed["shutdown"] = "shutting down"
        return failed


def health_app(metrics: WebhookMetrics, readiness: Readiness, extra_routes: Sequence[Route] = ()) -> Starlette:
    """The plain-HTTP port: liveness, readiness, Prometheus metrics, the build (/version), and a service's own
    read-only routes."""

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        failed = readiness.failures()
        if failed:
            return JSONResponse({"ready": False, "failed": failed}, status_code=503)
        return JSONResponse({"ready": True})

    async def metrics_endpoint(_: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def version(_: Request) -> Response:
        return JSONResponse(build_info())  # read by slime-check through the API server's pod proxy

    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        Route("/version", version),
        *extra_routes,
    ]
    return Starlette(routes=routes)
