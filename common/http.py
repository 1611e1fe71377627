"""HTTP/1.1 for both ports, with the limits uvicorn does not set.

uvicorn (httptools) waits for a request's headers and body as long as the client takes, and
takes every connection it is offered. On a port that is reachable from the network that lets a
neighbour hold the service: trickle requests, or open connections and keep them idle with a small
request now and then. :func:`guarded_protocol` returns uvicorn's httptools protocol with:

- a **read deadline**: from a connection's start, and from the first byte of each further
  request, the whole request (headers and body) must arrive within ``read_timeout`` seconds, or
  the connection is closed. kube-apiserver sends a review in one go, so it never comes close;
- a **header cap**: at most :data:`MAX_HEADER_BYTES` of headers per request (431 otherwise);
- a **connection cap** that keeps the port open for a newcomer: at ``max_connections`` open
  connections, the one idle for longest (kept alive after its last response) is closed to make
  room; with none idle, the one that has been sending its request for longest, if that is over
  :data:`STALLED_SECONDS` (kube-apiserver sends a review in one go); only then is the newcomer
  closed. A neighbour's idle or trickling connections therefore cannot shut the API server out,
  and a closed idle connection costs its client nothing but a reconnect;
- a **per-peer cap**: one peer address holds at most ``max_per_peer`` connections; past that its
  own idle connections go first, then its newcomers. One neighbour cannot take a larger share.

The TLS handshake gets the same deadline (``ssl_handshake_timeout``, given to
``loop.create_server`` by :mod:`common.serving`; asyncio's default is 60 s).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from common.metrics import WebhookMetrics

MAX_HEADER_BYTES = 64 * 1024
STALLED_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    read_timeout: float
    max_connections: int
    max_per_peer: int


class _Connections:
    """The open connections of one port, in the order they opened, and by peer address."""

    def __init__(self) -> None:
        self.open: dict[Any, None] = {}  # insertion-ordered: oldest first
        self.by_peer: dict[str, dict[Any, None]] = {}

    def add(self, connection: Any) -> None:
        self.open[connection] = None
        self.by_peer.setdefault(connection.peer, {})[connection] = None

    def remove(self, connection: Any) -> None:
        if self.open.pop(connection, False) is None:
            peers = self.by_peer[connection.peer]
            peers.pop(connection, None)
            if not peers:
                del self.by_peer[connection.peer]

    @staticmethod
    def victim(connections: dict[Any, None], besides: Any) -> Any | None:
        """The connection to close for a newcomer: the longest idle, else the longest stalled in its request."""
        others = [c for c in connections if c is not besides]
        idle = [c for c in others if c.idle_since is not None]
        if idle:
            return min(idle, key=lambda c: c.idle_since)
        stalled_before = time.monotonic() - STALLED_SECONDS
        stalled = [c for c in others if c.receiving_since is not None and c.receiving_since < stalled_before]
        return min(stalled, key=lambda c: c.receiving_since) if stalled else None


def guarded_protocol(limits: ConnectionLimits, metrics: WebhookMetrics, port: str) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a read deadline, a header cap and the connection caps (``port``
    names the port in ``slime_webhook_dropped_connections_total``)."""
    slow = metrics.dropped_connections.labels(port, "slow")
    over_cap = metrics.dropped_connections.labels(port, "connection-cap")
    over_peer_cap = metrics.dropped_connections.labels(port, "peer-cap")
    evicted = metrics.dropped_connections.labels(port, "evicted")
    headers_too_large = metrics.dropped_connections.labels(port, "headers-too-large")
    accepted = metrics.connections.labels(port)
    connections = _Connections()

    class GuardedProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _header_bytes = 0
        _in_headers = True
        peer = ""
        idle_since: float | None = None  # kept alive since its last response: no request in progress
        receiving_since: float | None = None  # sending a request (or its first) since then

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            accepted.inc()
            self.peer = self.client[0] if self.client else ""
            self.receiving_since = time.monotonic()
            connections.add(self)
            if not self._room():
                connections.remove(self)
                transport.close()
                return
            self._arm()

        def _room(self) -> bool:
            """Make room for this connection under both caps (closing idle ones); False when there is none."""
            own = connections.by_peer[self.peer]
            if len(own) > limits.max_per_peer and not self._evict(own):
                over_peer_cap.inc()
                return False
            if len(connections.open) > limits.max_connections and not self._evict(connections.open):
                over_cap.inc()
                return False
            return True

        def _evict(self, among: dict[Any, None]) -> bool:
            victim = connections.victim(among, besides=self)
            if victim is None:
                return False
            evicted.inc()
            connections.remove(victim)
            victim.transport.close()
            return True

        def connection_lost(self, exc: Exception | None) -> None:
            connections.remove(self)
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._in_headers or self.transport.is_closing():
                return
            # Still inside the headers after this read: every byte so far was header.
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                headers_too_large.inc()
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\r\n")
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.idle_since = None
            self.receiving_since = time.monotonic()
            self._in_headers = True
            self._header_bytes = 0
            if self._deadline is None:  # a further request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self.receiving_since = None
            self._disarm()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self.idle_since = time.monotonic()
            super().on_response_complete()

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(limits.read_timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                slow.inc()
                self.transport.close()

    return GuardedProtocol
