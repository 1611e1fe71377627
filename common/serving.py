"""TLS serving with certificate hot-reload, plus the plain-HTTP health and metrics port.

Certificate rotation follows controller-runtime's certwatcher: watch the files *and* poll every
few seconds, because kubelet publishes a renewed Secret by swapping a ``..data`` symlink, which
file watchers do not always report. A new pair is first loaded into a scratch context, so a
half-written or mismatched pair is rejected and the old certificate keeps serving. Only then is
it loaded into the live context. That happens on the event loop thread, so no handshake sees a
mix. Connections already open keep their session, so nothing is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from common.metrics import WebhookMetrics
from common.settings import ServiceSettings

log = logging.getLogger("slime.serving")


def _file_stamp(path: str) -> tuple[str, int, int, int]:
    """Identity of what a path points to now: symlink target, inode, mtime and size."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_ino, st.st_mtime_ns, st.st_size


class ServingCertificate:
    """The live server-side SSLContext and the files it is loaded from."""

    def __init__(self, cert_file: str, key_file: str, metrics: WebhookMetrics, poll_seconds: float = 10.0) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.poll_seconds = poll_seconds
        self._metrics = metrics
        self.context = self._new_context()
        self.fingerprint = ""  # sha256 of the leaf certificate being served
        self.last_error = ""
        self._stamp: tuple[Any, ...] | None = None

    @staticmethod
    def _new_context() -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # HTTP/1.1 only: no HTTP/2, as kubebuilder defaults since the Rapid-Reset CVEs.
        context.set_alpn_protocols(["http/1.1"])
        return context

    @property
    def loaded(self) -> bool:
        return bool(self.fingerprint)

    def reload_if_changed(self) -> bool:
        """Load the pair if the files changed since the last successful load. True if reloaded."""
        try:
            stamp = (_file_stamp(self.cert_file), _file_stamp(self.key_file))
        except OSError as exc:
            self._fail(f"cannot stat certificate files: {exc.strerror} ({exc.filename})")
            return False
        if stamp == self._stamp:
            return False
        try:
            with open(self.cert_file, "rb") as fh:
                pem = fh.read()
            leaf = x509.load_pem_x509_certificate(pem)
            self._new_context().load_cert_chain(self.cert_file, self.key_file)  # validate the pair first
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ValueError, ssl.SSLError) as exc:
            self._fail(f"cannot load certificate pair {self.cert_file}, {self.key_file}: {exc}")
            return False
        self._stamp = stamp
        self.fingerprint = hashlib.sha256(leaf.public_bytes(Encoding.DER)).hexdigest()
        self.last_error = ""
        self._metrics.cert_reloads.labels("success").inc()
        self._metrics.cert_not_after.set(leaf.not_valid_after_utc.timestamp())
        log.info("serving certificate loaded", extra={"fingerprint": self.fingerprint[:16], "not_after": str(leaf.not_valid_after_utc)})
        return True

    def _fail(self, message: str) -> None:
        if message != self.last_error:
            log.error("serving certificate not (re)loaded", extra={"error": message})
        self.last_error = message
        self._metrics.cert_reloads.labels("failure").inc()

    async def watch(self, stop: asyncio.Event) -> None:
        """Reload on file events, and on every poll tick as a backstop."""
        from watchfiles import awatch

        async def on_events() -> None:
            dirs = sorted({os.path.dirname(os.path.abspath(p)) for p in (self.cert_file, self.key_file)})
            try:
                async for _ in awatch(*dirs, stop_event=stop, debounce=200, recursive=False):
                    self.reload_if_changed()
            except (OSError, RuntimeError) as exc:  # e.g. no inotify: the poll still covers us
                log.warning("certificate file watch unavailable; polling only", extra={"error": str(exc)})

        watcher = asyncio.create_task(on_events())
        try:
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_seconds)
                self.reload_if_changed()
        finally:
            watcher.cancel()


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


def health_app(metrics: WebhookMetrics, readiness: Readiness) -> Starlette:
    """The plain-HTTP port: liveness, readiness and Prometheus metrics."""

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        failed = readiness.failures()
        if failed:
            return JSONResponse({"ready": False, "failed": failed}, status_code=503)
        return JSONResponse({"ready": True})

    async def metrics_endpoint(_: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics_endpoint)]
    return Starlette(routes=routes)


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals to :class:`ServiceRunner`, which runs two of them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class ServiceRunner:
    """Runs the TLS webhook server and the health server on one event loop.

    ``background`` coroutines factories (cache watchers, reconcilers) run alongside and are
    cancelled at shutdown; ``on_stop`` callbacks release threads and clients.
    """

    webhook_app: Any
    certificate: ServingCertificate
    metrics: WebhookMetrics
    readiness: Readiness
    host: str = "0.0.0.0"
    port: int = 8443
    metrics_port: int = 8080
    shutdown_delay_seconds: float = 0.0
    background: list[Callable[[asyncio.Event], Any]] = field(default_factory=list)
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[uvicorn.Server] = []
        self.readiness.add("certificate", lambda: None if self.certificate.loaded else (self.certificate.last_error or "not loaded"))

    def _config(self, app: Any, port: int) -> uvicorn.Config:
        config = uvicorn.Config(
            app,
            host=self.host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,  # kube-apiserver reuses connections; keep them
            timeout_graceful_shutdown=10,
        )
        config.load()
        return config

    @property
    def bound_ports(self) -> tuple[int, int]:
        """The ports actually bound (useful with port 0 in tests)."""
        tls, health = (s.servers[0].sockets[0].getsockname()[1] for s in self._servers)
        return int(tls), int(health)

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.certificate.reload_if_changed()
        tls_config = self._config(self.webhook_app, self.port)
        tls_config.ssl = self.certificate.context
        self._servers = [
            _EmbeddedServer(tls_config),
            _EmbeddedServer(self._config(health_app(self.metrics, self.readiness), self.metrics_port)),
        ]
        tasks = [asyncio.create_task(s.serve()) for s in self._servers]
        helpers = [asyncio.create_task(self.certificate.watch(self._stop))]
        helpers += [asyncio.create_task(factory(self._stop)) for factory in self.background]
        while not all(s.started for s in self._servers):
            if any(t.done() for t in tasks):  # a bind failure ends a server before it starts
                self._stop.set()
                break
            await asyncio.sleep(0.01)
        else:
            self.started.set()
        await self._stop.wait()
        self.readiness.stopping = True
        if self.shutdown_delay_seconds:
            await asyncio.sleep(self.shutdown_delay_seconds)
        for server in self._servers:
            server.should_exit = True
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        for callback in self.on_stop:
            callback()
        for result in results:
            if isinstance(result, Exception):
                raise result
        if not self.started.is_set():
            raise SystemExit(f"could not start serving on ports {self.port} and {self.metrics_port}")

    def request_stop(self) -> None:
        """Thread-safe: begin a graceful shutdown."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT (the console scripts' entry)."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
            await self.serve()

        asyncio.run(main())


def runner_for(
    settings: ServiceSettings,
    webhook_app: Any,
    metrics: WebhookMetrics,
    readiness: Readiness,
    *,
    background: list[Callable[[asyncio.Event], Any]] | None = None,
    on_stop: list[Callable[[], None]] | None = None,
) -> ServiceRunner:
    """A runner configured from the settings every service shares (ports, certificate, shutdown)."""
    return ServiceRunner(
        webhook_app=webhook_app,
        certificate=ServingCertificate(settings.cert_file, settings.key_file, metrics, settings.cert_poll_seconds),
        metrics=metrics,
        readiness=readiness,
        host=settings.host,
        port=settings.port,
        metrics_port=settings.metrics_port,
        shutdown_delay_seconds=settings.shutdown_delay_seconds,
        background=background or [],
        on_stop=on_stop or [],
    )
