"""TLS serving with certificate hot-reload, plus the plain-HTTP health and metrics port.

Certificate rotation follows controller-runtime's certwatcher: watch the files *and* poll every
few seconds, because kubelet publishes a renewed Secret by swapping a ``..data`` symlink, which
file watchers do not always report. A new pair (and client CA, when one is configured) is loaded
into a fresh context, so a half-written or mismatched pair is rejected and the old one keeps
serving. Only then does the fresh context go live: every new handshake switches to it from the
server's SNI callback (called for every ClientHello, with or without a server name). Reloads
happen on the event loop thread, so no handshake sees a mix. Connections already open keep
their session, so nothing is dropped.

With a client CA (``--client-ca-file``) the admission port requires a client certificate that
chains to it: kube-apiserver's, configured through its ``--admission-control-config-file``
(docs/install.md, "Authenticated admission"). The health and metrics port never asks for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from common.http import guarded_protocol
from common.metrics import WebhookMetrics
from common.settings import ServiceSettings
from common.version import build_info

log = logging.getLogger("slime.serving")


class CertificateFileError(Exception):
    """A serving file cannot be used: ``field`` is the setting naming it, the message says why (one line)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _read(field: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise CertificateFileError(field, f"cannot read {path}: {exc.strerror or exc}") from None


def check_certificate_files(cert_file: str, key_file: str, client_ca_file: str | None = None) -> None:
    """Raise :class:`CertificateFileError` when the files cannot be served: checked once at start.

    A missing, unreadable or wrong file at start is a configuration error (the chart mounts the
    TLS Secret before the container starts, so the files are there or the pod is misconfigured):
    the process stops with one line instead of running unready. Later changes go through
    :meth:`ServingCertificate.reload_if_changed`, which keeps the last good pair.
    """
    try:
        x509.load_pem_x509_certificates(_read("cert_file", cert_file))
    except ValueError:
        raise CertificateFileError("cert_file", f"{cert_file} holds no PEM certificate") from None
    try:
        load_pem_private_key(_read("key_file", key_file), password=None)
    except (ValueError, TypeError):
        raise CertificateFileError("key_file", f"{key_file} holds no unencrypted PEM private key") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise CertificateFileError(
            "key_file", f"{key_file} is not the key of the certificate in {cert_file} ({exc.reason or exc})"
        ) from None
    if client_ca_file is not None:
        try:
            x509.load_pem_x509_certificates(_read("client_ca_file", client_ca_file))
        except ValueError:
            raise CertificateFileError("client_ca_file", f"{client_ca_file} holds no PEM certificate") from None


def _file_stamp(path: str) -> tuple[str, int, int, int]:
    """Identity of what a path points to now: symlink target, inode, mtime and size."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_ino, st.st_mtime_ns, st.st_size


class ServingCertificate:
    """The server-side SSLContext given to the server, the live one behind it, and their files."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        metrics: WebhookMetrics,
        poll_seconds: float = 10.0,
        client_ca_file: str | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.poll_seconds = poll_seconds
        self._metrics = metrics
        self.context = self._new_context()  # the server's context; each handshake moves to ``_live``
        self._live = self.context
        self.context.sni_callback = self._to_live
        self.fingerprint = ""  # sha256 of the leaf certificate being served
        self.last_error = ""
        self._stamp: tuple[Any, ...] | None = None

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # HTTP/1.1 only: no HTTP/2, as kubebuilder defaults since the Rapid-Reset CVEs.
        context.set_alpn_protocols(["http/1.1"])
        if self.client_ca_file:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _to_live(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None, current: ssl.SSLContext
    ) -> None:
        live = self._live
        if live is not current:
            connection.context = live

    @property
    def loaded(self) -> bool:
        return bool(self.fingerprint)

    def _files(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())

    def reload_if_changed(self) -> bool:
        """Load the files if they changed since the last successful load. True if reloaded."""
        try:
            stamp = tuple(_file_stamp(path) for path in self._files())
        except OSError as exc:
            self._fail(f"cannot stat certificate files: {exc.strerror} ({exc.filename})")
            return False
        if stamp == self._stamp:
            return False
        try:
            with open(self.cert_file, "rb") as fh:
                pem = fh.read()
            leaf = x509.load_pem_x509_certificate(pem)
            fresh = self._new_context()
            fresh.load_cert_chain(self.cert_file, self.key_file)  # a bad pair fails here, before going live
            if self.client_ca_file:
                fresh.load_verify_locations(cafile=self.client_ca_file)
            if self._live is self.context:  # the first load: the server's own context serves it
                self.context.load_cert_chain(self.cert_file, self.key_file)
                if self.client_ca_file:
                    self.context.load_verify_locations(cafile=self.client_ca_file)
        except (OSError, ValueError, ssl.SSLError) as exc:
            what = ", ".join(self._files())
            self._fail(f"cannot load certificate files {what}: {exc}")
            return False
        self._live = fresh
        self._stamp = stamp
        self.fingerprint = hashlib.sha256(leaf.public_bytes(Encoding.DER)).hexdigest()
        self.last_error = ""
        self._metrics.cert_reloads.labels("success").inc()
        self._metrics.cert_not_after.set(leaf.not_valid_after_utc.timestamp())
        log.info(
            "serving certificate loaded",
            extra={"fingerprint": self.fingerprint[:16], "not_after": str(leaf.not_valid_after_utc)},
        )
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


@dataclass
class Listeners:
    """The two listening sockets of a service: the TLS admission port and the health/metrics port."""

    admission: socket.socket
    health: socket.socket

    @staticmethod
    def bind(host: str, port: int) -> socket.socket:
        """A listening TCP socket on ``host:port`` (port 0: any free port); OSError when it cannot be had."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
        # TCP, and without it small responses wait for delayed ACKs (about 40 ms a request).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, port))
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        self.admission.close()
        self.health.close()


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server on listening sockets it is given, leaving signals to :class:`ServiceRunner`.

    Its startup is uvicorn's for given sockets, with one difference: ``loop.create_server`` gets a
    TLS handshake timeout (asyncio's default is 60 s), so a client that opens a TLS connection and
    stalls is let go as quickly as one that trickles its request.
    """

    def __init__(self, config: uvicorn.Config, handshake_timeout: float | None = None) -> None:
        super().__init__(config)
        self.handshake_timeout = handshake_timeout

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        assert sockets, "ServiceRunner always binds the sockets itself"
        config = self.config
        state = self.lifespan.state

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=state, _loop=_loop
            )

        loop = asyncio.get_running_loop()
        handshake = self.handshake_timeout if config.ssl else None
        self.servers = [
            await loop.create_server(
                create_protocol, sock=sock, ssl=config.ssl, backlog=config.backlog, ssl_handshake_timeout=handshake
            )
            for sock in sockets
        ]
        self.started = True


@dataclass
class ServiceRunner:
    """Runs the TLS webhook server on the main event loop and the health server on a thread of its own.

    The health and metrics port (``/healthz``, ``/readyz``, ``/metrics``, a service's own read-only
    routes) has its own thread and event loop, so no admission work, however slow, can hold up the
    probes. ``background`` coroutine factories (cache watchers, reconcilers) run on the main loop
    and are cancelled at shutdown; ``on_stop`` callbacks release threads and clients.
    """

    webhook_app: Any
    certificate: ServingCertificate
    metrics: WebhookMetrics
    readiness: Readiness
    host: str = "0.0.0.0"
    port: int = 8443
    metrics_port: int = 8080
    shutdown_delay_seconds: float = 0.0
    read_timeout_seconds: float = 10.0
    max_connections: int = 512
    background: list[Callable[[asyncio.Event], Any]] = field(default_factory=list)
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    health_routes: list[Route] = field(default_factory=list)  # extra read-only routes on the plain-HTTP port
    started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[uvicorn.Server] = []
        self.readiness.add(
            "certificate",
            lambda: None if self.certificate.loaded else (self.certificate.last_error or "not loaded"),
        )

    def _config(self, app: Any, port: int, http: Any = "auto") -> uvicorn.Config:
        config = uvicorn.Config(
            app,
            host=self.host,
            port=port,
            http=http,
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

    async def serve(self, listeners: Listeners | None = None) -> None:
        """Serve until stopped; without ``listeners``, bind ``host``/``port``/``metrics_port`` here."""
        self._loop = asyncio.get_running_loop()
        if listeners is None:
            admission = Listeners.bind(self.host, self.port)
            try:
                listeners = Listeners(admission, Listeners.bind(self.host, self.metrics_port))
            except OSError:
                admission.close()
                raise
        self.certificate.reload_if_changed()
        protocol = guarded_protocol(self.read_timeout_seconds, self.max_connections, self.metrics)
        tls_config = self._config(self.webhook_app, self.port, http=protocol)
        tls_config.ssl = self.certificate.context
        admission_server = _EmbeddedServer(tls_config, handshake_timeout=self.read_timeout_seconds)
        health_server = _EmbeddedServer(
            self._config(health_app(self.metrics, self.readiness, self.health_routes), self.metrics_port)
        )
        self._servers = [admission_server, health_server]
        health_thread = _HealthThread(health_server, listeners.health)
        health_thread.start()
        admission_task = asyncio.create_task(admission_server.serve(sockets=[listeners.admission]))
        helpers = [asyncio.create_task(self.certificate.watch(self._stop))]
        helpers += [asyncio.create_task(factory(self._stop)) for factory in self.background]
        while not (admission_server.started and health_server.started):
            if admission_task.done() or health_thread.ended.is_set():
                self._stop.set()  # a server that ended before it started: its error is raised below
                break
            await asyncio.sleep(0.01)
        else:
            self.started.set()
            tls_port, health_port = self.bound_ports
            log.info(
                "serving",
                extra={
                    "admission": f"https://{self.host}:{tls_port}",
                    "health": f"http://{self.host}:{health_port}",
                    "client_certificates": "required" if self.certificate.client_ca_file else "not required",
                },
            )
        await self._stop.wait()
        self.readiness.stopping = True
        if self.shutdown_delay_seconds:
            await asyncio.sleep(self.shutdown_delay_seconds)
        admission_server.should_exit = True
        health_server.should_exit = True  # a plain flag its loop polls
        results = [*(await asyncio.gather(admission_task, return_exceptions=True))]
        await asyncio.to_thread(health_thread.join, 15)
        results.append(health_thread.error)
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        for callback in self.on_stop:
            callback()
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
        if not self.started.is_set():
            raise SystemExit(f"could not start serving on ports {self.port} and {self.metrics_port}")

    def request_stop(self) -> None:
        """Thread-safe: begin a graceful shutdown."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # already stopped: its loop is closed
                self._loop.call_soon_threadsafe(self._stop.set)

    def run(self, listeners: Listeners | None = None) -> None:
        """Serve until SIGTERM or SIGINT (the console scripts' entry)."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
            await self.serve(listeners)

        asyncio.run(main())


class _HealthThread(threading.Thread):
    """The health server on an event loop of its own; ``error`` is what ended it badly, if anything."""

    def __init__(self, server: _EmbeddedServer, sock: socket.socket) -> None:
        super().__init__(name="health-server", daemon=True)
        self.server = server
        self.sock = sock
        self.error: BaseException | None = None
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # noqa: BLE001 - handed to the main loop, which raises it
            self.error = exc
        finally:
            self.ended.set()


def runner_for(
    settings: ServiceSettings,
    webhook_app: Any,
    metrics: WebhookMetrics,
    readiness: Readiness,
    *,
    background: Sequence[Callable[[asyncio.Event], Any]] = (),
    on_stop: Sequence[Callable[[], None]] = (),
    health_routes: Sequence[Route] = (),
) -> ServiceRunner:
    """A runner configured from the settings every service shares (ports, certificate, shutdown)."""
    return ServiceRunner(
        webhook_app=webhook_app,
        certificate=ServingCertificate(
            settings.cert_file, settings.key_file, metrics, settings.cert_poll_seconds, settings.client_ca_file
        ),
        metrics=metrics,
        readiness=readiness,
        host=settings.host,
        port=settings.port,
        metrics_port=settings.metrics_port,
        shutdown_delay_seconds=settings.shutdown_delay_seconds,
        read_timeout_seconds=settings.read_timeout_seconds,
        max_connections=settings.max_connections,
        background=list(background),
        on_stop=list(on_stop),
        health_routes=list(health_routes),
    )
