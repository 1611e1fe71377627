"""Fixtures of the safe scale-in suite: kubemu + a fake slurmrestd + a tiny CAPI MachineSet simulator."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubemu import Emulator
from scaling_webhook.scalein import DELETE_MACHINE, PRE_DRAIN_HOOK
from tests.scaling.conftest import (  # noqa: F401 - fixtures re-exported
    CAPI,
    NAMESPACE,
    Scaling,
    config_map,
    machine_deployment,
    md_events,
    md_replicas,
    mirror,
    scale_request,
    scaling_factory,
    wait_for,
)
from tests.scalein.fake_slurmrestd import FakeSlurmrestd

MD_NS, MD = "metal3", "md"
MIRROR = "mirror-deployment"
JWT_NS, JWT_SECRET, JWT_KEY = "slurm", "slurm-auth-jwths256", "jwt_hs256.key"
FINALIZER = "machine.cluster.x-k8s.io"


def safe_config_map(url: str, **extra: Any) -> dict[str, Any]:
    options = {"slurmrestd": url, "jwtSecret": f"{JWT_NS}/{JWT_SECRET}", **extra}
    inner = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in options.items())
    return config_map({"mappings": f"- mirror: {NAMESPACE}/{MIRROR}\n  machineDeployment: {MD_NS}/{MD}\n  safeScaleIn: {{{inner}}}\n"})


@dataclass
class CapiSim:
    """What the MachineSet controller and the hosts would do, one ``step()`` at a time."""

    emulator: Emulator
    slurm: FakeSlurmrestd
    counter: int = 0
    removed: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def machines(self) -> list[dict[str, Any]]:
        return sorted(
            (m for m in self.emulator.list(f"{CAPI}/v1beta1", "Machine", MD_NS)
             if (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/deployment-name") == MD),
            key=lambda m: m["metadata"]["name"],
        )

    def machine(self, name: str) -> dict[str, Any] | None:
        return self.emulator.get(f"{CAPI}/v1beta1", "Machine", MD_NS, name)

    def add_machine(self, join: bool = True) -> str:
        self.counter += 1
        name = f"{MD}-{self.counter:03d}"
        node, address = f"node-{self.counter:03d}", f"10.0.0.{self.counter}"
        self.emulator.create({
            "apiVersion": f"{CAPI}/v1beta1", "kind": "Machine",
            "metadata": {"name": name, "namespace": MD_NS, "finalizers": [FINALIZER],
                         "labels": {"cluster.x-k8s.io/deployment-name": MD, "cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"clusterName": "c1"},
            "status": {"addresses": [{"type": "Hostname", "address": node}, {"type": "InternalIP", "address": address}]},
        })
        if join:
            self.slurm.add_node(node, address)
        return name

    @staticmethod
    def node_of(machine: dict[str, Any]) -> str:
        return next(a["address"] for a in machine["status"]["addresses"] if a["type"] == "Hostname")

    def step(self) -> None:
        replicas = md_replicas(self.emulator, MD_NS, MD) or 0
        machines = self.machines()
        live = [m for m in machines if not m["metadata"].get("deletionTimestamp")]
        if len(live) > replicas:
            # CAPI: Machines with the delete-machine annotation go first (then, here, by name).
            order = sorted(live, key=lambda m: (DELETE_MACHINE not in (m["metadata"].get("annotations") or {}), m["metadata"]["name"]))
            for victim in order[: len(live) - replicas]:
                self.emulator.delete(f"{CAPI}/v1beta1", "Machine", MD_NS, victim["metadata"]["name"])
        for _ in range(replicas - len(live)):
            self.add_machine()
        for machine in self.machines():
            meta = machine["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            if any(k.startswith("pre-drain.delete.hook.machine.cluster.x-k8s.io") for k in meta.get("annotations") or {}):
                continue  # held by a hook
            node = self.node_of(machine)
            with self.slurm.lock:
                found = self.slurm.nodes.get(node)
                if found is not None and found.busy:
                    self.violations.append(f"deprovisioned {meta['name']} while node {node} ran jobs")
                self.slurm.nodes.pop(node, None)
            meta["finalizers"] = []
            self.emulator.update(machine)
            self.removed.append(meta["name"])


@dataclass
class Env:
    emulator: Emulator
    slurm: FakeSlurmrestd
    capi: CapiSim
    start: Callable[..., Scaling]

    def scaling(self, **extra: Any) -> Scaling:
        self.emulator.create(safe_config_map(self.slurm.url, **extra))
        return self.start(self.emulator)

    def scale(self, scaling: Scaling, replicas: int) -> dict[str, Any]:
        """KEDA scales the mirror: the webhook admits it, then the API server persists it."""
        old = self.emulator.get("apps/v1", "Deployment", NAMESPACE, MIRROR)["spec"]["replicas"]
        response = scaling.review(scale_request(NAMESPACE, MIRROR, replicas, old_replicas=old))
        if response["allowed"]:
            self.emulator.patch("apps/v1", "Deployment", NAMESPACE, MIRROR, {"spec": {"replicas": replicas}})
        return response

    def annotated(self) -> list[str]:
        return [m["metadata"]["name"] for m in self.capi.machines()
                if (m["metadata"].get("annotations") or {}).get(DELETE_MACHINE)]

    def hooked(self, name: str) -> bool:
        machine = self.capi.machine(name)
        return machine is not None and PRE_DRAIN_HOOK in (machine["metadata"].get("annotations") or {})


@pytest.fixture
def jwt_key() -> bytes:
    return secrets.token_bytes(32)


@pytest.fixture
def slurm(jwt_key: bytes) -> Iterator[FakeSlurmrestd]:
    fake = FakeSlurmrestd(jwt_key)
    yield fake
    fake.stop()


@pytest.fixture
def env(emulator: Emulator, slurm: FakeSlurmrestd, jwt_key: bytes, scaling_factory: Callable[..., Scaling]) -> Callable[[int], Env]:
    """``env(n)``: a mirror and a MachineDeployment at n replicas, n Machines joined to Slurm."""

    def make(replicas: int) -> Env:
        emulator.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": JWT_SECRET, "namespace": JWT_NS},
                         "type": "Opaque", "data": {JWT_KEY: base64.b64encode(jwt_key).decode()}})
        emulator.create(mirror(MIRROR, replicas=replicas))
        emulator.create(machine_deployment(MD, MD_NS, replicas=replicas))
        capi = CapiSim(emulator, slurm)
        for _ in range(replicas):
            capi.add_machine()
        return Env(emulator, slurm, capi, scaling_factory)

    return make
