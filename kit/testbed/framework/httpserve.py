"""A small HTTP server on 127.0.0.1 for the kit's stand-ins (a fake slurmrestd, a metrics endpoint, a webhook
that records what it is sent).

:class:`LoopbackServer` listens on a free loopback port in threads of its own and answers each
request with ``respond(request)``: a status and a body, sent as JSON (a dict or a list) or as
``text/plain`` (a string); a 204 has neither body nor Content-Type. ``after(request)`` runs once
the answer is sent (a test plays a race there). With ``tls`` (a server context) it serves https.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, Any]


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # with its query
    headers: Mapping[str, str]  # names in lower case
    body: bytes


class LoopbackServer:
    """Serves ``respond`` on ``http://127.0.0.1:<port>`` until :meth:`stop`."""

    def __init__(
        self,
        respond: Callable[[Request], Answer],
        after: Callable[[Request], None] | None = None,
        name: str = "http",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {name.lower(): value for name, value in self.headers.items()}
                request = Request(self.command, self.path, headers, body)
                status, answer = respond(request)
                text = isinstance(answer, str)
                data = answer.encode() if text else json.dumps(answer).encode()
                self.send_response(status)
                if status != 204:
                    self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if after is not None:
                    after(request)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        # serve_forever checks for shutdown once per poll interval: 0.5 s by default, which every stop() waited
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), name=name, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
