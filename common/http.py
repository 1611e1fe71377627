"""HTTP/1.1 for the admission port, with the limits uvicorn does not set.

uvicorn (httptools) waits for a request's headers and body as long as the client takes, and
takes every connection it is offered. On an admission port that is reachable from the network
that lets a few trickling clients hold the service. :func:`guarded_protocol` returns uvicorn's
httptools protocol with three limits:

- a **read deadline**: from a connection's start, and from the first byte of each further
  request, the whole request (headers and body) must arrive within ``read_timeout`` seconds, or
  the connection is closed. kube-apiserver sends a review in one go, so it never comes close;
- a **header cap**: at most :data:`MAX_HEADER_BYTES` of headers per request (431 otherwise);
- a **connection cap**: a connection beyond ``max_connections`` open ones is closed at once.

The TLS handshake gets the same bound (``ssl_handshake_timeout``, given to ``loop.create_server``
by :mod:`common.serving`; asyncio's default is 60 s).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from common.metrics import WebhookMetrics

MAX_HEADER_BYTES = 64 * 1024


def guarded_protocol(read_timeout: float, max_connections: int, metrics: WebhookMetrics) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a read deadline, a header cap and a connection cap."""
    slow = metrics.dropped_connections.labels("slow")
    over_cap = metrics.dropped_connections.labels("connection-cap")
    headers_too_large = metrics.dropped_connections.labels("headers-too-large")
    accepted = metrics.connections

    class GuardedProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _header_bytes = 0
        _in_headers = True

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            accepted.inc()
            if len(self.connections) > max_connections:
                over_cap.inc()
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
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
            self._in_headers = True
            self._header_bytes = 0
            if self._deadline is None:  # a further request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(read_timeout, self._too_slow)

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
