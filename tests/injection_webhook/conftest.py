"""Run the injection webhook for real against emulated clusters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubemu import Emulator
from testbed.pki import Pki
from testbed.serve import RunningService
from testbed.services import StartInjection
from testbed.services import start_injection as start_injection_service


@pytest.fixture
def start_injection(pki: Pki, tmp_path: Path) -> Iterator[StartInjection]:
    running: list[RunningService] = []

    def start(emulator: Emulator, **overrides: object) -> RunningService:
        kubeconfig = emulator.write_kubeconfig(tmp_path / f"kubeconfig-{emulator.port}")
        service = start_injection_service(kubeconfig, pki, **overrides)
        running.append(service)
        return service

    yield start
    for service in running:
        service.stop()
