"""Start the webhook services in this process against an API server, as tests, demo and bench do.

Each service is built exactly as its console script builds it (``build``/``build_service`` from
settings), then served over TLS on 127.0.0.1 in its own thread (:func:`testbed.serve.serve_in_thread`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from injection_webhook.main import build as build_injection
from injection_webhook.settings import InjectionSettings
from kubemu import Emulator, RecordedRequest
from scaling_webhook.main import ScalingService, build_service
from scaling_webhook.settings import ScalingSettings
from testbed.serve import RunningService, serve_in_thread
from testbed.wait import wait_for


class ServingFiles(Protocol):
    """Where a service finds its serving pair, and the CA bundle its callers trust."""

    @property
    def cert_file(self) -> Path: ...

    @property
    def key_file(self) -> Path: ...

    @property
    def ca_file(self) -> Path: ...


def start_injection(kubeconfig: str, tls: ServingFiles, ready: bool = True, **settings: Any) -> RunningService:
    """The injection webhook on 127.0.0.1; with ``ready``, returns once ``/readyz`` answers 200."""
    values: dict[str, Any] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file), "KUBECONFIG": kubeconfig}
    values.update(settings)
    service = serve_in_thread(build_injection(InjectionSettings(**values)), tls.ca_file, "injection-webhook")
    if ready:
        wait_for(service.ready, 15, "injection-webhook /readyz")
    return service


@dataclass
class Scaling:
    """A running scaling webhook, its wired parts, and (on kubemu) the emulator it talks to."""

    service: ScalingService
    running: RunningService
    emulator: Emulator | None = None

    def review(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.running.review("/validate", request)

    def metrics_text(self) -> str:
        return httpx.get(f"{self.running.metrics_url}/metrics", timeout=5).text

    def metric(self, name: str, labels: str = "") -> float | None:
        """The value of one sample of ``/metrics`` (None when absent)."""
        prefix = f"{name}{{{labels}}} " if labels else f"{name} "
        for line in self.metrics_text().splitlines():
            if line.startswith(prefix):
                return float(line.split()[-1])
        return None

    def calls(self, **filters: Any) -> list[RecordedRequest]:
        """The API calls the emulator recorded whose attributes equal ``filters``."""
        assert self.emulator is not None, "calls are recorded by kubemu only"
        return [r for r in self.emulator.requests if all(getattr(r, k) == v for k, v in filters.items())]

    def hot_path_calls(self) -> list[RecordedRequest]:
        """Every request except Event creation (sent off the admission path) and the ConfigMap watch."""
        assert self.emulator is not None, "calls are recorded by kubemu only"
        return [r for r in self.emulator.requests if r.resource not in ("events", "configmaps")]


def start_scaling(
    kubeconfig: str,
    tls: ServingFiles,
    *,
    emulator: Emulator | None = None,
    settle_seconds: float = 0.02,
    wait_reconciled: bool = True,
    ready_timeout: float = 15.0,
    **settings: Any,
) -> Scaling:
    """The scaling webhook on 127.0.0.1, ready, and (``wait_reconciled``) past its first reconcile pass."""
    values: dict[str, Any] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file), "KUBECONFIG": kubeconfig}
    values.update(settings)
    service = build_service(ScalingSettings(**values))
    service.reconciler.settle_seconds = settle_seconds
    running = serve_in_thread(service.runner, tls.ca_file, "scaling-webhook")
    wait_for(running.ready, ready_timeout, "scaling-webhook /readyz")
    if wait_reconciled:
        wait_for(lambda: service.reconciler.passes >= 1, ready_timeout, "the first reconcile pass")
    return Scaling(service, running, emulator)
