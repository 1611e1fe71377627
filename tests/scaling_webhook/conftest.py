"""Fixtures of the scaling webhook suite: seeded emulators, a running service, a fake slurmrestd and its JWT key."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kubemu import Emulator
from testbed.fake_slurmrestd import DEFAULT_RELEASE, FakeSlurmrestd
from testbed.services import Scaling
from testbed.world import config_map, machine_deployment, make_jwt_key, mirror


@pytest.fixture
def seeded(emulator: Emulator) -> Emulator:
    """Two mirrors in ``slime-system``, each mapped to a MachineDeployment in its own namespace (list form)."""
    emulator.create(mirror("mirror-a", replicas=2))
    emulator.create(mirror("mirror-b", replicas=1))
    emulator.create(machine_deployment("md-a", "metal3", replicas=2))
    emulator.create(machine_deployment("md-b", "metal3-b", replicas=1))
    emulator.create(
        config_map(
            {
                "mappings": "- mirror: slime-system/mirror-a\n  machineDeployment: metal3/md-a\n  maxReplicas: 100\n"
                "- mirror: slime-system/mirror-b\n  machineDeployment: metal3-b/md-b\n  maxReplicas: 100\n"
            }
        )
    )
    return emulator


@pytest.fixture
def scaling(seeded: Emulator, scaling_factory: Callable[..., Scaling]) -> Scaling:
    return scaling_factory(seeded)


@pytest.fixture
def jwt_key() -> bytes:
    return make_jwt_key()


@pytest.fixture
def slurm(jwt_key: bytes, request: pytest.FixtureRequest) -> Iterator[FakeSlurmrestd]:
    """The fake slurmrestd, speaking the default release's dialect (or ``indirect`` parametrization's)."""
    fake = FakeSlurmrestd(jwt_key, release=getattr(request, "param", DEFAULT_RELEASE))
    yield fake
    fake.stop()
