"""Serving a service: the TLS admission port and the plain-HTTP health port, and the process around them.

:class:`ServiceRunner` runs the admission app on the main event loop and the health app on a
thread of its own, starts the certificate source and the service's background tasks, and shuts
all of it down gracefully (not ready first, then a delay so endpoints drain). The health and
metrics port never asks for a client certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.routing import Route

from common.certificates import ServingCertificate
from common.health import Readiness, health_app
from common.http import ConnectionLimits, guarded_protocol
from common.metrics import WebhookMetrics
from common.settings import ServiceSettings

log = logging.getLogger("slime.serving")

# The health and metrics port: the kubelet's probes, a Prometheus scrape and KEDA's demand polls need a
# handful of connections; idle ones close after a few seconds (uvicorn's default keep-alive).
HEALTH_MAX_CONNECTIONS = 64
HEALTH_MAX_PER_PEER = 16
HEALTH_KEEP_ALIVE_SECONDS = 5


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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_asked = asyncio.Event()

    async def main_loop(self) -> None:
        """uvicorn's loop of 0.1 s ticks, except that :meth:`exit` ends the wait for the next tick at once."""
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000  # on_tick refreshes the Date header every tenth tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), 0.1)

    def exit(self) -> None:
        """Thread-safe: begin uvicorn's graceful shutdown now, not at the next tick."""
        self.should_exit = True
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop has already closed
                self._loop.call_soon_threadsafe(self._exit_asked.set)

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
    max_connections_per_peer: int = 64
    background: list[Callable[[asyncio.Event], Any]] = field(default_factory=list)
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    health_routes: list[Route] = field(default_factory=list)  # extra read-only routes on the plain-HTTP port
    started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[uvicorn.Server] = []
        self.readiness.add("certificate", self.certificate.healthy)

    def _config(self, app: Any, port: int, http: Any, keep_alive: int = 30) -> uvicorn.Config:
        """``keep_alive``: how long an idle connection stays open (kube-apiserver reuses its connections: keep them)."""
        config = uvicorn.Config(
            app,
            host=self.host,
            port=port,
            http=http,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=keep_alive,
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
        admission_limits = ConnectionLimits(
            self.read_timeout_seconds, self.max_connections, self.max_connections_per_peer
        )
        tls_config = self._config(
            self.webhook_app, self.port, http=guarded_protocol(admission_limits, self.metrics, "admission")
        )
        tls_config.ssl = self.certificate.context
        admission_server = _EmbeddedServer(tls_config, handshake_timeout=self.read_timeout_seconds)
        # The health port serves probes and scrapes: the same guards, with a smaller cap, so that a
        # client streaming headers or holding connections open costs it a bounded amount.
        health_limits = ConnectionLimits(self.read_timeout_seconds, HEALTH_MAX_CONNECTIONS, HEALTH_MAX_PER_PEER)
        health_server = _EmbeddedServer(
            self._config(
                health_app(self.metrics, self.readiness, self.health_routes),
                self.metrics_port,
                http=guarded_protocol(health_limits, self.metrics, "health"),
                keep_alive=HEALTH_KEEP_ALIVE_SECONDS,
            ),
            handshake_timeout=None,
        )
        self._servers = [admission_server, health_server]
        health_thread = _HealthThread(health_server, listeners.health)
        health_thread.start()
        admission_task = asyncio.create_task(admission_server.serve(sockets=[listeners.admission]))
        helpers = [asyncio.create_task(self.certificate.start(self._stop))]
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
        admission_server.exit()
        health_server.exit()  # on the health thread's own loop
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
        max_connections_per_peer=settings.max_connections_per_peer,
        background=list(background),
        on_stop=list(on_stop),
        health_routes=list(health_routes),
    )
