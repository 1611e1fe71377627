"""Run the injection webhook for real against emulated clusters."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from injection_webhook.main import build
from injection_webhook.settings import InjectionSettings
from kubemu import Emulator
from tests.support.pki import Pki
from tests.support.service import RunningService, start_service

StartInjection = Callable[..., RunningService]


def wait_ready(service: RunningService, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        answer = httpx.get(f"{service.metrics_url}/readyz")
        if answer.status_code == 200:
            return
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.05)


@pytest.fixture
def start_injection(pki: Pki, tmp_path: Path) -> Iterator[StartInjection]:
    running: list[RunningService] = []

    def start(emulator: Emulator, **overrides: object) -> RunningService:
        settings = InjectionSettings(
            cert_file=str(pki.cert_file),
            key_file=str(pki.key_file),
            KUBECONFIG=emulator.write_kubeconfig(tmp_path / f"kubeconfig-{emulator.port}"),
            **overrides,  # type: ignore[arg-type]
        )
        service = start_service(build(settings), pki.ca_file)
        running.append(service)
        wait_ready(service)
        return service

    yield start
    for service in running:
        service.stop()
