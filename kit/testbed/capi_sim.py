"""The safe scale-in world: a tiny CAPI MachineSet simulator over kubemu, and the fake slurmrestd it pairs with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.names import DELETE_MACHINE_ANNOTATION, PRE_DRAIN_HOOK
from kubemu import Emulator
from testbed.fake_slurmrestd import FakeSlurmrestd
from testbed.services import Scaling
from testbed.world import CAPI, SLIME_NAMESPACE, config_map, md_replicas, scale_mirror

MD_NS, MD = "metal3", "md"
MIRROR = "mirror-deployment"
JWT_NS, JWT_SECRET, JWT_KEY = "slurm", "slurm-auth-jwths256", "jwt_hs256.key"
FINALIZER = "machine.cluster.x-k8s.io"


def safe_config_map(url: str, **extra: Any) -> dict[str, Any]:
    options = {"slurmrestd": url, "jwtSecret": f"{JWT_NS}/{JWT_SECRET}", **extra}
    inner = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in options.items())
    return config_map(
        {
            "mappings": f"- mirror: {SLIME_NAMESPACE}/{MIRROR}\n  machineDeployment: {MD_NS}/{MD}\n  safeScaleIn: {{{inner}}}\n"
        }
    )


@dataclass
class CapiSim:
    """What the MachineSet controller and the hosts would do, one ``step()`` at a time."""

    emulator: Emulator
    slurm: FakeSlurmrestd
    # The hosts' names, when they come back (BareMetalHost-named hosts): a new Machine's host is the
    # first one no Machine has. Without them, Machine md-<n>'s host is node-<n> (never reused).
    hosts: tuple[str, ...] = ()
    counter: int = 0
    removed: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    assigned: dict[str, str] = field(default_factory=dict)  # Machine -> its host's (Slurm node's) name

    def machines(self) -> list[dict[str, Any]]:
        return sorted(
            (
                m
                for m in self.emulator.list(f"{CAPI}/v1beta1", "Machine", MD_NS)
                if (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/deployment-name") == MD
            ),
            key=lambda m: m["metadata"]["name"],
        )

    def machine(self, name: str) -> dict[str, Any] | None:
        return self.emulator.get(f"{CAPI}/v1beta1", "Machine", MD_NS, name)

    def add_machine(self, join: bool = True, provisioned: bool = True) -> str:
        """A new Machine; ``provisioned``: its host is provisioned (CAPM3 reports infrastructure ready),
        ``join``: its slurmd has joined Slurm."""
        self.counter += 1
        name = f"{MD}-{self.counter:03d}"
        node, address = self._host_for(name), f"10.0.0.{self.counter}"
        status: dict[str, Any] = {"infrastructureReady": provisioned}
        if provisioned:
            status["addresses"] = [{"type": "Hostname", "address": node}, {"type": "InternalIP", "address": address}]
        self.emulator.create(
            {
                "apiVersion": f"{CAPI}/v1beta1",
                "kind": "Machine",
                "metadata": {
                    "name": name,
                    "namespace": MD_NS,
                    "finalizers": [FINALIZER],
                    "labels": {"cluster.x-k8s.io/deployment-name": MD, "cluster.x-k8s.io/cluster-name": "c1"},
                },
                "spec": {"clusterName": "c1"},
                "status": status,
            }
        )
        if join:
            self.slurm.add_node(node, address)
        return name

    def _host_for(self, machine: str) -> str:
        if self.hosts:
            taken = {self.assigned.get(m["metadata"]["name"]) for m in self.machines()}
            self.assigned[machine] = next(h for h in self.hosts if h not in taken)
        else:
            self.assigned[machine] = f"node-{int(machine.rsplit('-', 1)[1]):03d}"
        return self.assigned[machine]

    def provision(self, name: str, join: bool = True) -> None:
        """The host of Machine ``name`` finishes provisioning (and its slurmd joins)."""
        number = int(name.rsplit("-", 1)[1])
        node, address = self.assigned[name], f"10.0.0.{number}"
        self.emulator.patch(
            f"{CAPI}/v1beta1",
            "Machine",
            MD_NS,
            name,
            {
                "status": {
                    "infrastructureReady": True,
                    "addresses": [{"type": "Hostname", "address": node}, {"type": "InternalIP", "address": address}],
                }
            },
        )
        if join:
            self.slurm.add_node(node, address)

    def node_of(self, machine: dict[str, Any]) -> str:
        return self.assigned[machine["metadata"]["name"]]

    def step(self) -> None:
        replicas = md_replicas(self.emulator, MD_NS, MD) or 0
        machines = self.machines()
        live = [m for m in machines if not m["metadata"].get("deletionTimestamp")]
        if len(live) > replicas:
            # CAPI: Machines with the delete-machine annotation go first (then, here, by name).
            order = sorted(
                live,
                key=lambda m: (
                    DELETE_MACHINE_ANNOTATION not in (m["metadata"].get("annotations") or {}),
                    m["metadata"]["name"],
                ),
            )
            for victim in order[: len(live) - replicas]:
                self.emulator.delete(f"{CAPI}/v1beta1", "Machine", MD_NS, victim["metadata"]["name"])
        for _ in range(replicas - len(live)):
            self.add_machine()
        for machine in self.machines():
            meta = machine["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            if any(
                k.startswith("pre-drain.delete.hook.machine.cluster.x-k8s.io") for k in meta.get("annotations") or {}
            ):
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

    def scale(self, scaling: Scaling, replicas: int) -> None:
        """KEDA scales the mirror through the API (the webhook admits it, the API server stores it),
        then the reconciler acts on it (it also would on the watch event; a pass here makes it now)."""
        scale_mirror(self.emulator, SLIME_NAMESPACE, MIRROR, replicas)
        scaling.sees_mirror(SLIME_NAMESPACE, MIRROR, replicas)
        scaling.service.reconcile_once()

    def annotated(self) -> list[str]:
        return [
            m["metadata"]["name"]
            for m in self.capi.machines()
            if (m["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION)
        ]

    def hooked(self, name: str) -> bool:
        machine = self.capi.machine(name)
        return machine is not None and PRE_DRAIN_HOOK in (machine["metadata"].get("annotations") or {})


def demand_config(url: str, partition: str = "batch", max_replicas: int = 10) -> dict[str, Any]:
    return config_map(
        {
            "mappings": f"- mirror: {SLIME_NAMESPACE}/{MIRROR}\n  machineDeployment: {MD_NS}/{MD}\n"
            f"  maxReplicas: {max_replicas}\n"
            f"  nodeDemand: {{partition: {partition}, slurmrestd: '{url}', jwtSecret: {JWT_NS}/{JWT_SECRET}}}\n"
        }
    )
