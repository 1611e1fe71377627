"""The project's one Cluster API stand-in: a MachineSet controller over kubemu, with CAPI v1.14's deletion rules.

:class:`MachineSetStandIn` does, one ``step()`` at a time, what the MachineSet and Machine
controllers of Cluster API v1.14 do that safe scale-in depends on (read from
``core/reconcilers/machine/machine_controller.go`` ``reconcileDelete`` and the MachineSet's delete
priority):

- surplus Machines are deleted, those marked ``cluster.x-k8s.io/delete-machine`` first, then those
  without a nodeRef (CAPI counts them unhealthy), then by name;
- a deleting Machine is held while a ``pre-terminate.delete.hook.machine.cluster.x-k8s.io/*``
  annotation is on it, **and** while a ``pre-drain.delete.hook.machine.cluster.x-k8s.io/*`` one is,
  but the latter *only when the Machine has a nodeRef*: CAPI skips pre-drain hooks
  (``isDeleteNodeAllowed`` returns ``errNilNodeRef``) for a Machine whose host runs no kubelet;
- once nothing holds it, its host goes (its node's jobs with it) and the finalizer is removed.

Hosts register a Node (the Machine gets ``status.nodeRef``) only with ``kubelet=True`` (a host with
a kubelet or a virtual kubelet); by default they run slurmd only, as plain cloud-init hosts do.
Two kinds of host: :class:`CapiSim` pairs Machines with the fake slurmrestd's nodes (the fast
suite); :class:`testbed.scenarios.slurm_capi.RealCapi` boots a real slurmd per Machine (the real-Slurm
tier). The whole-loop tier runs the real CAPI controllers instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from common.names import DELETE_MACHINE_ANNOTATION, PRE_TERMINATE_HOOK
from kubemu import AdmissionAttributes, Emulator
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.services import Scaling
from testbed.framework.objects import CAPI, SLIME_NAMESPACE, config_map
from testbed.framework.wait import wait_for
from testbed.framework.world import md_replicas, scale_mirror

MD_NS, MD = "metal3", "md"
MIRROR = "mirror-deployment"
JWT_NS, JWT_SECRET, JWT_KEY = "slurm", "slurm-auth-jwths256", "jwt_hs256.key"
FINALIZER = "machine.cluster.x-k8s.io"


def safe_config_map(url: str, **extra: Any) -> dict[str, Any]:
    options = {"slurmrestd": url, "jwtSecret": f"{JWT_NS}/{JWT_SECRET}", **extra}
    inner = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in options.items())
    return config_map(
        {
            "mappings": (
                f"- mirror: {SLIME_NAMESPACE}/{MIRROR}\n  machineDeployment: {MD_NS}/{MD}\n  maxReplicas: 100\n"
                f"  safeScaleIn: {{{inner}}}\n"
            )
        }
    )


def pool_config_map(
    url: str, safe_scale_in: dict[str, Any] | None = None, slurm_health: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The scaling ConfigMap of the stand-in's pool with the given Slurm blocks (each names the fake slurmrestd)."""
    endpoint = {"slurmrestd": url, "jwtSecret": f"{JWT_NS}/{JWT_SECRET}"}
    item: dict[str, Any] = {"mirror": f"{SLIME_NAMESPACE}/{MIRROR}", "machineDeployment": f"{MD_NS}/{MD}"}
    item["maxReplicas"] = 100
    for key, block in (("safeScaleIn", safe_scale_in), ("slurmHealth", slurm_health)):
        if block is not None:
            item[key] = {**endpoint, **block}
    return config_map({"mappings": yaml.safe_dump([item], sort_keys=False)})


PRE_DRAIN_PREFIX = "pre-drain.delete.hook.machine.cluster.x-k8s.io"
PRE_TERMINATE_PREFIX = "pre-terminate.delete.hook.machine.cluster.x-k8s.io"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"


def held_by_a_hook(machine: dict[str, Any]) -> bool:
    """Whether Cluster API v1.14 waits before deleting this Machine's infrastructure."""
    keys = (machine["metadata"].get("annotations") or {}).keys()
    if any(k.startswith(PRE_TERMINATE_PREFIX) for k in keys):
        return True
    has_node = bool((machine.get("status") or {}).get("nodeRef"))
    return has_node and any(k.startswith(PRE_DRAIN_PREFIX) for k in keys)


def deletion_order(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Which surplus Machines CAPI deletes first: marked, then without a nodeRef, then by name."""
    return sorted(
        live,
        key=lambda m: (
            DELETE_MACHINE_ANNOTATION not in (m["metadata"].get("annotations") or {}),
            bool((m.get("status") or {}).get("nodeRef")),
            m["metadata"]["name"],
        ),
    )


@dataclass
class MachineSetStandIn:
    """The MachineSet and Machine controllers' deletion rules; a subclass makes and removes the hosts."""

    emulator: Emulator
    kubelet: bool = False  # the hosts register a Node (the Machines get a nodeRef)
    pool: str = MD  # the MachineDeployment (in MD_NS) whose MachineSet this is; its Machines are <pool>-<n>
    counter: int = 0
    removed: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    assigned: dict[str, str] = field(default_factory=dict)  # Machine -> its host's (Slurm node's) name

    def machines(self) -> list[dict[str, Any]]:
        selector = f"{DEPLOYMENT_LABEL}={self.pool}"
        found = self.emulator.list(f"{CAPI}/v1beta1", "Machine", MD_NS, label_selector=selector)
        return sorted(found, key=lambda m: m["metadata"]["name"])

    def machine(self, name: str) -> dict[str, Any] | None:
        return self.emulator.get(f"{CAPI}/v1beta1", "Machine", MD_NS, name)

    def live(self) -> list[dict[str, Any]]:
        return [m for m in self.machines() if not m["metadata"].get("deletionTimestamp")]

    def hooked(self, name: str) -> bool:
        """SliMe's hook is on Machine ``name``."""
        machine = self.machine(name)
        return machine is not None and PRE_TERMINATE_HOOK in (machine["metadata"].get("annotations") or {})

    def annotated(self) -> list[str]:
        return [
            m["metadata"]["name"]
            for m in self.machines()
            if (m["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION)
        ]

    def create_machine(self, status: dict[str, Any], spec: dict[str, Any] | None = None) -> str:
        self.counter += 1
        name = f"{self.pool}-{self.counter:03d}"
        self.emulator.create(
            {
                "apiVersion": f"{CAPI}/v1beta1",
                "kind": "Machine",
                "metadata": {
                    "name": name,
                    "namespace": MD_NS,
                    "finalizers": [FINALIZER],
                    "labels": {DEPLOYMENT_LABEL: self.pool, "cluster.x-k8s.io/cluster-name": "c1"},
                },
                "spec": {"clusterName": "c1", **(spec or {})},
                "status": status,
            }
        )
        return name

    def provisioned(
        self, name: str, host: str, address: str, extra: dict[str, Any] | None = None, at: float | None = None
    ) -> None:
        """The Machine's infrastructure is ready at ``address`` (since ``at``, default now: Cluster API's
        InfrastructureReady condition says when); with a kubelet its Node registers (nodeRef)."""
        since = datetime.fromtimestamp(time.time() if at is None else at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status: dict[str, Any] = {
            "infrastructureReady": True,
            "addresses": [{"type": "Hostname", "address": host}, {"type": "InternalIP", "address": address}],
            "conditions": [{"type": "InfrastructureReady", "status": "True", "lastTransitionTime": since}],
            **(extra or {}),
        }
        if self.kubelet:
            status["nodeRef"] = {"apiVersion": "v1", "kind": "Node", "name": host}
        self.emulator.patch(f"{CAPI}/v1beta1", "Machine", MD_NS, name, {"status": status})

    def add_machine(self) -> str:
        raise NotImplementedError

    def remove_host(self, machine: dict[str, Any]) -> None:
        """The infrastructure is deleted: the host goes, whatever it runs (a subclass records violations)."""
        raise NotImplementedError

    def step(self) -> list[str]:
        """One round of the MachineSet and Machine controllers; the Machines whose hosts went."""
        replicas = md_replicas(self.emulator, MD_NS, self.pool) or 0
        live = self.live()
        for victim in deletion_order(live)[: max(0, len(live) - replicas)]:
            self.emulator.delete(f"{CAPI}/v1beta1", "Machine", MD_NS, victim["metadata"]["name"])
        for _ in range(replicas - len(live)):
            self.add_machine()
        released = []
        for machine in self.machines():
            meta = machine["metadata"]
            if not meta.get("deletionTimestamp") or held_by_a_hook(machine):
                continue
            self.remove_host(machine)
            self.emulator.patch(f"{CAPI}/v1beta1", "Machine", MD_NS, meta["name"], {"metadata": {"finalizers": []}})
            self.removed.append(meta["name"])
            released.append(meta["name"])
        return released


class PoolInvariant:
    """An admission hook that checks, at every write to the pool, the rule safe scale-in keeps: the
    MachineDeployment never asks for fewer Machines than exist, or are being created, minus the ones
    marked for deletion. At a write that breaks it, Cluster API (whenever it looks) would delete an
    unmarked Machine: each such write is recorded in ``broken``.

    Installed in front of the emulator's own hook (``install``), so the scaling webhooks still see
    the writes they admit."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.broken: list[str] = []
        self._next = emulator.app.admission

    def install(self) -> PoolInvariant:
        self.emulator.app.admission = self
        return self

    def __call__(self, attrs: AdmissionAttributes) -> Any:
        result = self._next(attrs) if self._next is not None else None
        if attrs.namespace != MD_NS or attrs.operation != "UPDATE" or attrs.object is None:
            return result
        machines = {m["metadata"]["name"]: m for m in self.emulator.list(f"{CAPI}/v1beta1", "Machine", MD_NS)}
        replicas_before = md_replicas(self.emulator, MD_NS, MD) or 0
        replicas = replicas_before
        if attrs.resource == "machinedeployments" and attrs.name == MD:
            replicas = int((attrs.object.get("spec") or {}).get("replicas") or 0)
        elif attrs.resource == "machines" and not attrs.subresource:
            machines[attrs.name] = attrs.object
        else:
            return result
        pool = [
            m
            for m in machines.values()
            if (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == MD
            and not m["metadata"].get("deletionTimestamp")
        ]
        marked = sum(1 for m in pool if (m["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION))
        present = max(len(pool), replicas_before)  # existing, or being created for the replicas asked before
        if replicas < present - marked:
            self.broken.append(
                f"{attrs.resource} {attrs.name}: replicas {replicas} < {present} present - {marked} marked"
            )
        return result


@dataclass
class CapiSim(MachineSetStandIn):
    """The stand-in with the fake slurmrestd's nodes as hosts."""

    slurm: FakeSlurmrestd | None = None
    # The hosts' names, when they come back (BareMetalHost-named hosts): a new Machine's host is the
    # first one no Machine has. Without them, Machine md-<n>'s host is node-<n> (<pool>-node-<n> for another pool).
    hosts: tuple[str, ...] = ()
    subnet: int = 0  # the hosts' addresses are 10.<subnet>.x.y: pools of one Slurm get a subnet each

    @property
    def fake(self) -> FakeSlurmrestd:
        assert self.slurm is not None, "CapiSim needs the fake slurmrestd"
        return self.slurm

    def add_machine(self, join: bool = True, provisioned: bool = True, at: float | None = None) -> str:
        """A new Machine; ``provisioned``: its host is provisioned (CAPM3 reports infrastructure ready, since
        ``at``), ``join``: its slurmd has joined Slurm."""
        name = self.create_machine({"infrastructureReady": False})
        self._host_for(name)
        if provisioned:
            self.provision(name, join, at)
        return name

    def _host_for(self, machine: str) -> str:
        if self.hosts:
            taken = {
                self.assigned.get(m["metadata"]["name"]) for m in self.machines() if m["metadata"]["name"] != machine
            }
            self.assigned[machine] = next(h for h in self.hosts if h not in taken)
        else:
            prefix = "node" if self.pool == MD else f"{self.pool}-node"  # unique across the pools of one Slurm
            self.assigned[machine] = f"{prefix}-{int(machine.rsplit('-', 1)[1]):03d}"
        return self.assigned[machine]

    def provision(self, name: str, join: bool = True, at: float | None = None) -> None:
        """The host of Machine ``name`` finishes provisioning (since ``at``, default now) and its slurmd joins."""
        number = int(name.rsplit("-", 1)[1])
        node, address = self.assigned[name], f"10.{self.subnet}.{number // 256}.{number % 256}"
        self.provisioned(name, node, address, at=at)
        if join:
            self.fake.add_node(node, address)

    def node_of(self, machine: dict[str, Any]) -> str:
        return self.assigned[machine["metadata"]["name"]]

    def remove_host(self, machine: dict[str, Any]) -> None:
        node = self.node_of(machine)
        with self.fake.lock:
            found = self.fake.nodes.get(node)
            if found is not None and found.busy:
                self.violations.append(f"deprovisioned {machine['metadata']['name']} while node {node} ran jobs")
            self.fake.nodes.pop(node, None)


@dataclass
class Env:
    emulator: Emulator
    slurm: FakeSlurmrestd
    capi: CapiSim
    start: Callable[..., Scaling]

    def scaling(self, **extra: Any) -> Scaling:
        self.emulator.create(safe_config_map(self.slurm.url, **extra))
        return self.started()

    def started(self) -> Scaling:
        """The scaling webhook on this pool, past a pass made as the Lease holder: its first pass may come before
        it holds the Lease and then adopts nothing, and a scale right after would meet the adoption."""
        scaling = self.start(self.emulator)
        wait_for(lambda: scaling.service.reconciler.leading, 10, "the scaling webhook to hold the Lease")
        scaling.reconcile()
        return scaling

    def scale(self, scaling: Scaling, replicas: int) -> None:
        """KEDA scales the mirror through the API (the webhook admits it, the API server stores it),
        then the reconciler acts on it (it also would on the watch event; a pass here makes it now)."""
        scale_mirror(self.emulator, SLIME_NAMESPACE, MIRROR, replicas)
        scaling.sees_mirror(SLIME_NAMESPACE, MIRROR, replicas)
        scaling.reconcile()

    def annotated(self) -> list[str]:
        return self.capi.annotated()

    def hooked(self, name: str) -> bool:
        return self.capi.hooked(name)


def demand_config(url: str, partition: str = "batch", max_replicas: int = 10) -> dict[str, Any]:
    return config_map(
        {
            "mappings": f"- mirror: {SLIME_NAMESPACE}/{MIRROR}\n  machineDeployment: {MD_NS}/{MD}\n"
            f"  maxReplicas: {max_replicas}\n"
            f"  nodeDemand: {{partition: {partition}, slurmrestd: '{url}', jwtSecret: {JWT_NS}/{JWT_SECRET}}}\n"
        }
    )
