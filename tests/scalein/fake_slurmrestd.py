"""A fake slurmrestd on 127.0.0.1: nodes, DRAIN/UNDRAIN, DELETE, HS256 JWT auth, v0.0.42-v0.0.44.

Test code drives a small job model (``start_job`` / ``finish_job``); a node's state is IDLE or
ALLOCATED from its jobs, plus DRAIN when drained. ``fail_status`` makes every call answer that
status; ``stop()`` takes the server down (connection refused).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt

VERSIONS = ("v0.0.42", "v0.0.43", "v0.0.44")
_PATH = re.compile(r"^/slurm/(v0\.0\.\d+)/(ping|nodes|node/([^/]+))/?$")


@dataclass
class Node:
    name: str
    address: str
    jobs: dict[int, float] = field(default_factory=dict)  # job id -> end time
    drain: bool = False
    reason: str = ""

    def states(self) -> list[str]:
        base = ["ALLOCATED"] if self.jobs else ["IDLE"]
        return base + (["DRAIN"] if self.drain else [])

    @property
    def busy(self) -> bool:
        return bool(self.jobs)


class FakeSlurmrestd:
    def __init__(self, key: bytes, versions: tuple[str, ...] = VERSIONS) -> None:
        self.key = key
        self.versions = versions
        self.nodes: dict[str, Node] = {}
        self.lock = threading.RLock()
        self.fail_status: int | None = None
        self.calls: list[tuple[str, str]] = []
        self.violations: list[str] = []  # busy nodes deleted
        self.deleted: list[str] = []
        self.drains: list[str] = []
        self.undrains: list[str] = []
        self.tokens_seen: list[dict[str, Any]] = []
        self._next_job = 1
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.calls.append((method, self.path))
                status, body = fake.handle(method, self.path, self.headers.get("X-SLURM-USER-TOKEN"), raw)
                self._answer(status, body)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- the model ----------------------------------------------------------------------------

    def add_node(self, name: str, address: str) -> None:
        with self.lock:
            self.nodes[name] = Node(name, address)

    def start_job(self, node: str, end: float) -> int:
        with self.lock:
            job = self._next_job
            self._next_job += 1
            self.nodes[node].jobs[job] = end
            return job

    def finish_jobs(self, node: str) -> None:
        with self.lock:
            self.nodes[node].jobs.clear()

    def state(self, node: str) -> list[str] | None:
        with self.lock:
            found = self.nodes.get(node)
            return found.states() if found else None

    # --- HTTP -------------------------------------------------------------------------------

    def handle(self, method: str, path: str, token: str | None, raw: bytes) -> tuple[int, dict[str, Any]]:
        if self.fail_status is not None:
            return self.fail_status, {"errors": [{"description": "injected failure", "error_number": 1}]}
        try:
            claims = jwt.decode(token or "", self.key, algorithms=["HS256"], options={"require": ["sun", "exp", "iat"]})
        except jwt.PyJWTError as exc:
            return 401, {"errors": [{"description": f"authentication failed: {type(exc).__name__}"}]}
        self.tokens_seen.append(claims)
        match = _PATH.match(path)
        if not match:
            return 404, {"errors": [{"description": "no such path"}]}
        version, what, name = match.groups()
        if version not in self.versions:
            return 404, {"errors": [{"description": f"{version} not served"}]}
        with self.lock:
            if what == "ping" and method == "GET":
                return 200, {"pings": [{"hostname": "slurmctld", "pinged": "UP"}], "errors": []}
            if what == "nodes" and method == "GET":
                return 200, {"nodes": [
                    {"name": n.name, "hostname": n.name, "address": n.address, "state": n.states(), "reason": n.reason}
                    for n in self.nodes.values()
                ], "errors": []}
            node = self.nodes.get(name or "")
            if node is None:
                return 404, {"errors": [{"description": f"node {name} not found"}]}
            if method == "POST":
                body = json.loads(raw or b"{}")
                states = body.get("state") or []
                if "DRAIN" in states:
                    node.drain, node.reason = True, body.get("reason", "")
                    self.drains.append(node.name)
                elif "UNDRAIN" in states or "RESUME" in states:
                    node.drain, node.reason = False, ""
                    self.undrains.append(node.name)
                else:
                    return 400, {"errors": [{"description": f"unsupported state {states}"}]}
                return 200, {"errors": []}
            if method == "DELETE":
                if node.busy:
                    self.violations.append(f"DELETE of busy node {node.name}")
                    return 500, {"errors": [{"description": "node has running jobs"}]}
                del self.nodes[node.name]
                self.deleted.append(node.name)
                return 200, {"errors": []}
        return 405, {"errors": [{"description": "method not allowed"}]}
