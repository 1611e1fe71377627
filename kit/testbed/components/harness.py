"""A minimal webhook built only from ``common/``, to test the shared transport and serving,
and what those tests measure with."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding

from common.admission import AdmissionResponse
from common.certificates import ServingCertificate
from common.health import Readiness
from common.metrics import WebhookMetrics
from common.serving import ServiceRunner
from common.webhook import AdmissionEndpoint, AdmissionHandler, admission_app
from testbed.components.serve import RunningService, serve_in_thread
from testbed.framework.pki import Pki


def serve_handler(
    handler: AdmissionHandler,
    pki: Pki,
    max_body_bytes: int = 64 * 1024,
    poll_seconds: float = 10.0,
    client_ca_file: str | None = None,
    read_timeout_seconds: float = 10.0,
    max_connections: int = 512,
    deadline_seconds: float = 5.0,
    max_connections_per_peer: int = 64,
    body_budget: int = 16 * 1024 * 1024,
) -> RunningService:
    metrics = WebhookMetrics()
    endpoint = AdmissionEndpoint("test", handler, metrics, max_body_bytes, deadline_seconds, body_budget)
    runner = ServiceRunner(
        webhook_app=admission_app("test", "/review", endpoint),
        certificate=ServingCertificate(str(pki.cert_file), str(pki.key_file), metrics, poll_seconds, client_ca_file),
        metrics=metrics,
        readiness=Readiness(),
        read_timeout_seconds=read_timeout_seconds,
        max_connections=max_connections,
        max_connections_per_peer=max_connections_per_peer,
    )
    return serve_in_thread(runner, pki.ca_file)


async def echo_allow(request: dict[str, Any]) -> AdmissionResponse:
    from common.admission import allow

    return allow()


def served_fingerprint(service: RunningService) -> str:
    context = ssl.create_default_context(cafile=str(service.ca_file))
    with (
        socket.create_connection(("127.0.0.1", service.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None, "the server sent no certificate"
        return hashlib.sha256(der).hexdigest()


def fingerprint_of(cert) -> str:  # type: ignore[no-untyped-def]
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


class Load:
    """Steady admission traffic on fresh and kept-alive connections; counts every failure."""

    def __init__(self, service: RunningService) -> None:
        self.service = service
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.service.client() as client:  # a new connection, so a new handshake
                    for _ in range(5):
                        answer = client.post(
                            f"{self.service.url}/review",
                            json={
                                "apiVersion": "admission.k8s.io/v1",
                                "kind": "AdmissionReview",
                                "request": {"uid": "load"},
                            },
                        )
                        if answer.status_code != 200 or answer.json()["response"]["allowed"] is not True:
                            self.failures.append(f"{answer.status_code} {answer.text[:200]}")
                        self.ok += 1
            except Exception as exc:  # noqa: BLE001 - any failure is what we count
                self.failures.append(repr(exc))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def kubelet_volume(directory: Path, pki: Pki, generation: int) -> None:
    """Publish the current pair the way kubelet updates a Secret volume: swap the ..data symlink."""
    stamp = directory / f"..{generation:04d}"
    stamp.mkdir()
    for name in ("tls.crt", "tls.key"):
        (stamp / name).write_bytes((pki.directory / name).read_bytes())
    tmp = directory / "..data_tmp"
    os.symlink(stamp.name, tmp)
    os.replace(tmp, directory / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (directory / name).is_symlink():
            os.symlink(f"..data/{name}", directory / name)
