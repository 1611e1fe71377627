"""Run a webhook service for real (TLS on 127.0.0.1, ports chosen by the OS) and call it as kube-apiserver does."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.serving import ServiceRunner

# The names of the services this process started, so a test session can audit what ran.
_STARTED: set[str] = set()


def started_services() -> set[str]:
    return set(_STARTED)


@dataclass
class RunningService:
    """A :class:`ServiceRunner` serving in its own thread and event loop."""

    name: str
    runner: ServiceRunner
    thread: threading.Thread
    ca_file: Path | None = None
    errors: list[BaseException] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.runner.bound_ports[0]

    @property
    def metrics_port(self) -> int:
        return self.runner.bound_ports[1]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def ready(self) -> bool:
        """``/readyz`` answers 200."""
        try:
            return httpx.get(f"{self.metrics_url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self) -> httpx.Client:
        """An HTTPS client that trusts only the CA bundle, like a webhook configuration's caBundle."""
        if self.ca_file is None:
            raise ValueError(f"{self.name}: no CA bundle was given to call it with")
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return httpx.Client(verify=context, timeout=10.0)

    def post(self, path: str, body: bytes, content_type: str | None = "application/json") -> httpx.Response:
        headers = {"Content-Type": content_type} if content_type is not None else {}
        with self.client() as client:
            return client.post(f"{self.url}{path}?timeout=10s", content=body, headers=headers)

    def review(self, path: str, request: dict[str, Any]) -> dict[str, Any]:
        """Send one AdmissionReview v1 and return its ``response``, checking the envelope."""
        request = {"uid": str(uuid.uuid4()), **request}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()
        answer = self.post(path, body)
        assert answer.status_code == 200, answer.text
        review = answer.json()
        assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
        assert review["response"]["uid"] == request["uid"]
        response: dict[str, Any] = review["response"]
        return response

    def stop(self) -> None:
        stop_all([self])


def stop_all(services: list[RunningService]) -> None:
    """Stop ``services`` side by side: each shutdown is mostly waiting (uvicorn's grace for open connections)."""
    for service in services:
        service.runner.request_stop()
    for service in services:
        service.thread.join(timeout=15)


def serve_in_thread(
    runner: ServiceRunner, ca_file: Path | None = None, name: str = "service", port: int = 0
) -> RunningService:
    """Serve ``runner`` on 127.0.0.1 in a thread (admission on ``port``, 0: any free port; metrics on
    any free port); return once both ports listen."""
    runner.host, runner.port, runner.metrics_port = "127.0.0.1", port, 0
    service = RunningService(name, runner, threading.Thread(), ca_file)

    def serve() -> None:
        try:
            asyncio.run(runner.serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            service.errors.append(exc)

    service.thread = threading.Thread(target=serve, name=name, daemon=True)
    service.thread.start()
    _STARTED.add(name)
    if not runner.started.wait(15):
        raise RuntimeError(f"{name} did not start: {service.errors or 'no error reported'}")
    return service
