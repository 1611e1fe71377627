"""Cluster API and Metal3 played over kubemu, with real hosts: each Machine's host is a real slurmd.

:class:`RealCapi` does, one ``step()`` at a time, what the MachineSet controller, CAPM3 and the
BareMetalHosts would do, like ``tests/scalein/sim.py``'s ``CapiSim`` but with real nodes:

- a Machine is created without addresses (``status.infrastructureReady: false``, phase
  Provisioning) and gets a host: ``bm-<n>`` for Machine ``md-<n>``, or, with ``host_names``
  (hosts named after their BareMetalHosts, whose names come back), the first of them no live
  Machine has; CAPM3 creates its Metal3Data and ``metaData`` Secret (through the API: the
  injection webhook admits it); the host is provisioned: the Machine gets ``status.addresses``
  (Hostname = the host's name, InternalIP = its namespace's address) and
  ``infrastructureReady: true`` (v1beta1), then the host boots from the Secret as stored and its
  slurmd joins slurmctld;
- surplus Machines are deleted (those marked ``cluster.x-k8s.io/delete-machine`` first); a
  deleting Machine is held while a pre-drain hook annotation is on it; once none is, its host
  is powered off (every process in its namespace killed) and the finalizer removed.

Before a host is powered off, :meth:`RealCapi.step` checks it the way an operator would care:
any job process still running on it (slurmstepd, a job's script or an epilog) or any job Slurm
still lists as RUNNING or COMPLETING there is a **violation**: SliMe released a busy node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from common.names import DELETE_MACHINE_ANNOTATION, PRE_DRAIN_HOOK
from testbed.capi_sim import FINALIZER, MD, MD_NS
from testbed.real.cloudinit import Node
from testbed.real.machines import command_line
from testbed.real.slurm_site import Site
from testbed.world import CAPI, md_replicas


@dataclass
class RealCapi:
    site: Site
    host_names: tuple[str, ...] = ()  # the pool's BareMetalHosts' names; empty: a new name per Machine
    counter: int = 0
    hosts: dict[str, Node] = field(default_factory=dict)  # Machine name -> its booted host
    assigned: dict[str, str] = field(default_factory=dict)  # Machine name -> its host's name (its Slurm node's)
    removed: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def machines(self) -> list[dict[str, Any]]:
        return sorted(
            (
                m
                for m in self.site.emulator.list(f"{CAPI}/v1beta1", "Machine", MD_NS)
                if (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/deployment-name") == MD
            ),
            key=lambda m: m["metadata"]["name"],
        )

    def machine(self, name: str) -> dict[str, Any] | None:
        return self.site.emulator.get(f"{CAPI}/v1beta1", "Machine", MD_NS, name)

    def live(self) -> list[dict[str, Any]]:
        return [m for m in self.machines() if not m["metadata"].get("deletionTimestamp")]

    def hostname(self, machine: str) -> str:
        return self.assigned[machine]

    def _host_for(self, machine: str) -> str:
        if self.host_names:
            taken = {self.assigned.get(m["metadata"]["name"]) for m in self.live()}
            free = [h for h in self.host_names if h not in taken]
            assert free, f"no free host among {self.host_names} for {machine}"
            self.assigned[machine] = free[0]
        else:
            self.assigned[machine] = f"bm-{int(machine.rsplit('-', 1)[1]):03d}"
        return self.assigned[machine]

    def add_machine(self, provision: bool = True) -> str:
        self.counter += 1
        name = f"{MD}-{self.counter:03d}"
        self._host_for(name)
        self.site.emulator.create(
            {
                "apiVersion": f"{CAPI}/v1beta1",
                "kind": "Machine",
                "metadata": {
                    "name": name,
                    "namespace": MD_NS,
                    "finalizers": [FINALIZER],
                    "labels": {"cluster.x-k8s.io/deployment-name": MD, "cluster.x-k8s.io/cluster-name": "c1"},
                },
                "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": f"{name}-bootstrap"}},
                "status": {"phase": "Provisioning", "bootstrapReady": True, "infrastructureReady": False},
            }
        )
        if provision:
            self.provision(name)
        return name

    def provision(self, name: str) -> Node:
        """CAPM3 makes the host's metaData Secret (admitted by the injection webhook), the host is provisioned and boots."""
        index = int(name.rsplit("-", 1)[1])
        secret = self.site.create_metadata_secret(index, self.hostname(name), machine=name if self.host_names else None)
        address = next(
            a for a in self.site.network.hosts() if a not in {n.address for n in self.site.network.nodes.values()}
        )
        self.site.emulator.patch(
            f"{CAPI}/v1beta1",
            "Machine",
            MD_NS,
            name,
            {
                "status": {
                    "phase": "Provisioned",
                    "infrastructureReady": True,
                    "addresses": [
                        {"type": "Hostname", "address": self.hostname(name)},
                        {"type": "InternalIP", "address": address},
                    ],
                }
            },
        )
        node = self.site.boot(secret, address=address)
        self.hosts[name] = node
        node.wait_joined(self.site.slurm)
        return node

    def busy_in_slurm(self, hostname: str) -> list[str]:
        """Jobs slurmctld lists as RUNNING or COMPLETING on ``hostname``."""
        found = []
        for job_id, job in self.site.slurm.jobs().items():
            states = set(job.get("job_state") or [])
            if states & {"RUNNING", "COMPLETING"} and hostname in self.site.slurm.hostnames(job.get("nodes") or ""):
                found.append(f"job {job_id} {'+'.join(sorted(states))}")
        return found

    def step(self) -> list[str]:
        """One round of the MachineSet controller and the hosts; the Machines released (their hosts powered off)."""
        replicas = md_replicas(self.site.emulator, MD_NS, MD) or 0
        live = self.live()
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
                self.site.emulator.delete(f"{CAPI}/v1beta1", "Machine", MD_NS, victim["metadata"]["name"])
        for _ in range(replicas - len(live)):
            self.add_machine()
        released = []
        for machine in self.machines():
            meta = machine["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            if any(
                k.startswith("pre-drain.delete.hook.machine.cluster.x-k8s.io") for k in meta.get("annotations") or {}
            ):
                continue  # held by a hook
            self._power_off(meta["name"])
            self.site.emulator.patch(
                f"{CAPI}/v1beta1", "Machine", MD_NS, meta["name"], {"metadata": {"finalizers": []}}
            )
            self.removed.append(meta["name"])
            released.append(meta["name"])
        return released

    def _power_off(self, name: str) -> None:
        node = self.hosts.pop(name, None)
        if node is None:
            return
        processes = node.job_processes()
        jobs = self.busy_in_slurm(node.hostname)
        if processes or jobs:
            commands = [command_line(p) for p in processes]
            self.violations.append(f"released Machine {name} while its host {node.hostname} ran {jobs or commands}")
        node.power_off(self.site.network)

    def held(self, name: str) -> bool:
        machine = self.machine(name)
        return machine is not None and PRE_DRAIN_HOOK in (machine["metadata"].get("annotations") or {})

    def annotated(self) -> list[str]:
        return [
            m["metadata"]["name"]
            for m in self.machines()
            if (m["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION)
        ]

    def wait_all_released(self, reconcile: Any, timeout: float = 30.0) -> None:
        """Reconcile and step until no Machine is deleting (bounded)."""
        deadline = time.monotonic() + timeout
        while any(m["metadata"].get("deletionTimestamp") for m in self.machines()):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Machines still deleting after {timeout:g} s: {[m['metadata']['name'] for m in self.machines()]}"
                )
            reconcile()
            self.step()
            time.sleep(0.2)
