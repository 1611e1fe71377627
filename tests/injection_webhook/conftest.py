"""Run the injection webhook for real against emulated clusters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.kube import local_client
from injection_webhook.resolver import InjectionResolver
from injection_webhook.settings import DEFAULT_CONTROLLER_SELECTOR
from kubemu import Emulator
from testbed.components.serve import RunningService
from testbed.components.services import StartInjection
from testbed.components.services import start_injection as start_injection_service
from testbed.framework.pki import Pki
from testbed.framework.wait import wait_for


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


@pytest.fixture
def resolver(emulator: Emulator, tmp_path: Path) -> Iterator[InjectionResolver]:
    started = InjectionResolver(
        local_client(emulator.write_kubeconfig(tmp_path / "kubeconfig")), DEFAULT_CONTROLLER_SELECTOR, sync_timeout=10.0
    )
    started.start()
    wait_for(lambda: started.metal3_version, what="Metal3 API discovery")
    yield started
    started.stop()
