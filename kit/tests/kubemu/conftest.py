"""Fixtures: one emulator per test module (starting is cheap, stopping takes ~0.2 s) and a
fresh namespace per test so tests sharing an emulator do not see each other's objects."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from kubernetes import client

from kubemu import Emulator

_counter = itertools.count()


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator() as emulator:
        yield emulator


@pytest.fixture
def api(emu: Emulator) -> Iterator[client.ApiClient]:
    api_client = emu.api_client()
    yield api_client
    emu.clear_faults()
    api_client.close()


@pytest.fixture
def ns(emu: Emulator) -> str:
    name = f"t{next(_counter)}"
    emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name
