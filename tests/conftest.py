"""Fixtures shared by every suite: a dev PKI and API emulators reached through kubeconfigs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubemu import Emulator
from tests.support.pki import Pki, make_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def emulator_factory(tmp_path: Path) -> Iterator[Callable[..., Emulator]]:
    """Start emulators (a management and a workload cluster, say); all stop after the test."""
    started: list[Emulator] = []

    def start(**options: object) -> Emulator:
        emulator = Emulator(**options).start()  # type: ignore[arg-type]
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.stop()


@pytest.fixture
def emulator(emulator_factory: Callable[..., Emulator]) -> Emulator:
    return emulator_factory()


@pytest.fixture
def kubeconfig(emulator: Emulator, tmp_path: Path) -> str:
    """A kubeconfig file for ``emulator``: services load it exactly as they load a real one."""
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")
