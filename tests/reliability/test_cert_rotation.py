"""The serving certificate rotated 10 times under steady admission load: nothing fails, each new
cert is served within 15 s.

The injection webhook serves from a kubelet-style Secret volume (``..data`` symlink swap, the
helpers of ``tests/common/test_serving.py``) with the production poll period (10 s). The load is
real mutations: one thread opens a fresh connection every 5 requests (so handshakes see each
new certificate), another keeps one connection open across every rotation.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubemu import Emulator
from testbed.components.harness import Load, fingerprint_of, kubelet_volume, served_fingerprint
from testbed.components.serve import RunningService
from testbed.framework.objects import metadata_secret
from testbed.framework.pki import Pki, make_pki
from testbed.framework.reviews import secret_request
from testbed.scenarios.reliability import Services, seed_injection_cluster

ROTATIONS = 10
PICKUP_LIMIT_SECONDS = 15.0


class AdmissionLoad(Load):
    """``Load`` with real injection admissions, plus a second thread on one kept-alive connection."""

    def __init__(self, service: RunningService, request: dict[str, Any]) -> None:
        super().__init__(service)
        self.body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        ).encode()
        self.kept_alive_ok = 0
        self._threads = [self._thread, threading.Thread(target=self._kept_alive, daemon=True)]

    def _check(self, client: httpx.Client) -> None:
        answer = client.post(
            f"{self.service.url}/mutate", content=self.body, headers={"Content-Type": "application/json"}
        )
        if answer.status_code != 200 or answer.json()["response"].get("patchType") != "JSONPatch":
            self.failures.append(f"{answer.status_code} {answer.text[:200]}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.service.client() as client:  # a new connection, so a new handshake
                    for _ in range(5):
                        self._check(client)
                        self.ok += 1
            except Exception as exc:  # noqa: BLE001 - any failure is what we count
                self.failures.append(repr(exc))

    def _kept_alive(self) -> None:
        try:
            with self.service.client() as client:
                while not self._stop.is_set():
                    self._check(client)
                    self.kept_alive_ok += 1
                    time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001
            self.failures.append(f"kept-alive connection: {exc!r}")

    def __enter__(self) -> AdmissionLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


@pytest.mark.slow
def test_ten_rotations_under_load_drop_nothing(emulator: Emulator, tmp_path: Path, figures: dict[str, Any]) -> None:
    _, data = seed_injection_cluster(emulator)
    issuer = make_pki(tmp_path / "issuer")
    volume = tmp_path / "volume"
    volume.mkdir()
    kubelet_volume(volume, issuer, 0)
    services = Services(Pki(volume, issuer.ca), tmp_path)
    try:
        service = services.injection(emulator)  # cert_poll_seconds: the default, 10 s
        pickups: list[float] = []
        with AdmissionLoad(service, {"uid": "rotation-load", **secret_request(metadata_secret(data))}) as load:
            for generation in range(1, ROTATIONS + 1):
                new = issuer.issue()
                kubelet_volume(volume, issuer, generation)
                started = time.monotonic()
                while served_fingerprint(service) != fingerprint_of(new):
                    assert time.monotonic() - started < PICKUP_LIMIT_SECONDS, (
                        f"rotation {generation} not served within 15 s"
                    )
                    time.sleep(0.05)
                pickups.append(time.monotonic() - started)
                time.sleep(0.2)
        metrics = httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
    finally:
        services.close()
    figures["cert_rotation"] = {
        "rotations": ROTATIONS,
        "requests_ok": load.ok + load.kept_alive_ok,
        "kept_alive_requests_ok": load.kept_alive_ok,
        "failed": len(load.failures),
        "pickup_s": [round(p, 2) for p in pickups],
        "max_pickup_s": round(max(pickups), 2),
    }
    assert load.failures == [], load.failures[:5]
    assert load.ok > 50 and load.kept_alive_ok > 50
    assert f'slime_certificate_reloads_total{{result="success"}} {ROTATIONS + 1}.0' in metrics
