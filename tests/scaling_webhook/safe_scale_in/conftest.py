"""Fixtures of the safe scale-in suite: kubemu + a fake slurmrestd + a tiny CAPI MachineSet simulator."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest

from kubemu import Emulator
from testbed.components.capi_sim import JWT_KEY, JWT_NS, JWT_SECRET, MD, MD_NS, MIRROR, CapiSim, Env
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.services import Scaling
from testbed.framework.objects import machine_deployment, mirror


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
