"""Run the injection webhook for real against emulated clusters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.kube import local_client
from injection_webhook.bindings import Bindings, parse_bindings
from injection_webhook.confserver import JoinOptions
from injection_webhook.resolver import InjectionResolver
from injection_webhook.settings import DEFAULT_CONTROLLER_SELECTOR
from kubemu import Emulator
from testbed.framework.objects import SLURM_BINDINGS
from testbed.framework.wait import wait_for

MakeResolver = Callable[..., InjectionResolver]


@pytest.fixture
def make_resolver(emulator: Emulator, tmp_path: Path) -> Iterator[MakeResolver]:
    """Started resolvers on the emulator; ``bindings`` (default: the test world's) and JoinOptions fields."""
    started: list[InjectionResolver] = []

    def make(bindings: str = SLURM_BINDINGS, **options: Any) -> InjectionResolver:
        resolver = InjectionResolver(
            local_client(emulator.write_kubeconfig(tmp_path / "kubeconfig")),
            DEFAULT_CONTROLLER_SELECTOR,
            sync_timeout=10.0,
            options=JoinOptions(**options),
            bindings=Bindings(parse_bindings(bindings)),
        )
        started.append(resolver)
        resolver.start()
        wait_for(lambda: resolver.metal3_version, what="Metal3 API discovery")
        return resolver

    yield make
    for resolver in started:
        resolver.stop()


@pytest.fixture
def resolver(make_resolver: MakeResolver) -> InjectionResolver:
    return make_resolver()
