"""Run a webhook service for real (TLS on 127.0.0.1) and call it as kube-apiserver does."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from common.serving import ServiceRunner


@dataclass
class RunningService:
    runner: ServiceRunner
    thread: threading.Thread
    ca_file: Path

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

    def client(self) -> httpx.Client:
        """An HTTPS client that trusts only the CA bundle, like a webhook configuration's caBundle."""
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
        return review["response"]

    def stop(self) -> None:
        self.runner.request_stop()
        self.thread.join(timeout=15)


def start_service(runner: ServiceRunner, ca_file: Path) -> RunningService:
    """Serve ``runner`` (ports 0 = any free port) in a thread; return once both ports listen."""
    runner.port = 0
    runner.metrics_port = 0
    runner.host = "127.0.0.1"
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(runner.serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            errors.append(exc)

    thread = threading.Thread(target=serve, name="service-under-test", daemon=True)
    thread.start()
    if not runner.started.wait(15):
        raise RuntimeError(f"service did not start: {errors}")
    return RunningService(runner, thread, ca_file)
