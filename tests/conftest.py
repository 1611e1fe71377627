"""Fixtures shared by every suite: a dev PKI and API emulators reached through kubeconfigs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubemu import Emulator, RecordedRequest
from tests.support.pki import Pki, make_pki

# Every API call made to a *management-cluster* emulator during this run. The RBAC audit
# (tests/test_zz_rbac_audit.py) checks each one the services made against the rendered chart.
RECORDED_CALLS: list[RecordedRequest] = []


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def emulator_factory(tmp_path: Path) -> Iterator[Callable[..., Emulator]]:
    """Start emulators (a management and a workload cluster, say); all stop after the test."""
    started: list[tuple[Emulator, bool]] = []

    def start(workload: bool = False, **options: object) -> Emulator:
        """``workload=True``: a CAPI workload cluster, whose RBAC comes from its kubeconfig, not our chart."""
        emulator = Emulator(**options).start()  # type: ignore[arg-type]
        started.append((emulator, workload))
        return emulator

    yield start
    for emulator, workload in started:
        emulator.stop()
        if not workload:
            RECORDED_CALLS.extend(emulator.requests)


@pytest.fixture
def emulator(emulator_factory: Callable[..., Emulator]) -> Emulator:
    return emulator_factory()


@pytest.fixture
def kubeconfig(emulator: Emulator, tmp_path: Path) -> str:
    """A kubeconfig file for ``emulator``: services load it exactly as they load a real one."""
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")
