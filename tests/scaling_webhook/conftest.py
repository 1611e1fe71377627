"""Fixtures of the scaling webhook suite: seeded emulators, a running service, a fake slurmrestd and its JWT key,
and ``env``: a pool of Machines on kubemu whose hosts are the fake slurmrestd's nodes (the CAPI stand-in)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator

import pytest

from kubemu import Emulator
from testbed.components.capi_sim import JWT_KEY, JWT_NS, MD, MD_NS, MIRROR, CapiSim, Env
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.services import Scaling
from testbed.components.slurmrestd_dialects import DEFAULT_RELEASE
from testbed.framework.objects import config_map, machine_deployment, mirror
from testbed.framework.world import make_jwt_key
from testbed.scenarios.site import JWT_SECRET


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


@pytest.fixture
def env(
    emulator: Emulator, slurm: FakeSlurmrestd, jwt_key: bytes, scaling_factory: Callable[..., Scaling]
) -> Callable[..., Env]:
    """``env(n, hosts=(), kubelet=False)``: a mirror and a MachineDeployment at n replicas, n Machines joined
    to Slurm (their hosts named from ``hosts`` when given, see :class:`CapiSim`); with ``kubelet`` the hosts
    register a Node (the Machines get a nodeRef), else they run slurmd only, as plain cloud-init hosts."""

    def make(replicas: int, hosts: tuple[str, ...] = (), kubelet: bool = False) -> Env:
        emulator.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": JWT_SECRET, "namespace": JWT_NS},
                "type": "Opaque",
                "data": {JWT_KEY: base64.b64encode(jwt_key).decode()},
            }
        )
        emulator.create(mirror(MIRROR, replicas=replicas))
        emulator.create(machine_deployment(MD, MD_NS, replicas=replicas))
        capi = CapiSim(emulator, kubelet=kubelet, slurm=slurm, hosts=hosts)
        for _ in range(replicas):
            capi.add_machine()
        return Env(emulator, slurm, capi, scaling_factory)

    return make
