"""Cluster API and Metal3 played over kubemu, with real hosts: each Machine's host is a real slurmd.

:class:`RealCapi` is the project's one Cluster API stand-in (:class:`testbed.components.capi_sim.MachineSetStandIn`,
CAPI v1.14's deletion rules) with real hosts, and plays what CAPM3 and the BareMetalHosts would do:

- a Machine is created without addresses (``status.infrastructureReady: false``, phase
  Provisioning) and gets a host: ``bm-<n>`` for Machine ``md-<n>``, or, with ``host_names``
  (hosts named after their BareMetalHosts, whose names come back), the first of them no live
  Machine has; CAPM3 creates its Metal3Data and ``metaData`` Secret (through the API: the
  injection webhook admits it); the host is provisioned: the Machine gets ``status.addresses``
  (Hostname = the host's name, InternalIP = its namespace's address) and
  ``infrastructureReady: true`` (v1beta1), then the host boots from the Secret as stored and its
  slurmd joins slurmctld;
- surplus Machines are deleted and held by lifecycle hooks as CAPI v1.14 does (a pre-drain hook
  only with a nodeRef, a pre-terminate hook always); once nothing holds one, its host is powered
  off (every process in its namespace killed) and the finalizer removed.

Before a host is powered off, :meth:`RealCapi.step` checks it the way an operator would care:
any job process still running on it (slurmstepd, a job's script or an epilog) or any job Slurm
still lists as RUNNING or COMPLETING there is a **violation**: SliMe released a busy node.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from testbed.components.capi_sim import MD, MachineSetStandIn
from testbed.components.cloudinit import Node
from testbed.framework.processes import command_line
from testbed.framework.wait import wait_for
from testbed.scenarios.slurm_site import SlurmSite


@dataclass
class RealCapi(MachineSetStandIn):
    site: SlurmSite | None = None
    host_names: tuple[str, ...] = ()  # the pool's BareMetalHosts' names; empty: a new name per Machine
    hosts: dict[str, Node] = field(default_factory=dict)  # Machine name -> its booted host

    @property
    def sited(self) -> SlurmSite:
        assert self.site is not None, "RealCapi needs its site"
        return self.site

    def hostname(self, machine: str) -> str:
        return self.assigned[machine]

    def _host_for(self, machine: str) -> str:
        if self.host_names:
            taken = {self.assigned.get(m["metadata"]["name"]) for m in self.live() if m["metadata"]["name"] != machine}
            free = [h for h in self.host_names if h not in taken]
            assert free, f"no free host among {self.host_names} for {machine}"
            self.assigned[machine] = free[0]
        else:
            self.assigned[machine] = f"bm-{int(machine.rsplit('-', 1)[1]):03d}"
        return self.assigned[machine]

    def add_machine(self, provision: bool = True) -> str:
        name = self.create_machine(
            {"phase": "Provisioning", "bootstrapReady": True, "infrastructureReady": False},
            {"bootstrap": {"dataSecretName": f"{MD}-{self.counter + 1:03d}-bootstrap"}},
        )
        self._host_for(name)
        if provision:
            self.provision(name)
        return name

    def provision(self, name: str, image_fault: Callable[[dict[str, Any]], None] | None = None) -> Node:
        """CAPM3 makes the host's metaData Secret (admitted by the injection webhook), the host is provisioned and
        boots, and joins. ``image_fault`` edits the metadata the host boots with (a broken image, a wrong key): the
        host boots and is not waited for."""
        site = self.sited
        index = int(name.rsplit("-", 1)[1])
        secret = site.create_metadata_secret(index, self.hostname(name), machine=name if self.host_names else None)
        address = next(a for a in site.network.hosts() if a not in {n.address for n in site.network.nodes.values()})
        self.provisioned(name, self.hostname(name), address, {"phase": "Provisioned"})
        if image_fault is not None:
            meta = site.meta_data(secret)
            image_fault(meta)
            text = yaml.safe_dump(meta).encode()
            secret = {**secret, "data": {**secret["data"], "metaData": base64.b64encode(text).decode()}}
        node = site.boot(secret, address=address)
        self.hosts[name] = node
        if image_fault is None:
            node.wait_joined(site.slurm)
        return node

    def busy_in_slurm(self, hostname: str) -> list[str]:
        """Jobs slurmctld lists as RUNNING or COMPLETING on ``hostname``."""
        found = []
        for job_id, job in self.sited.slurm.jobs().items():
            states = set(job.get("job_state") or [])
            if states & {"RUNNING", "COMPLETING"} and hostname in self.sited.slurm.hostnames(job.get("nodes") or ""):
                found.append(f"job {job_id} {'+'.join(sorted(states))}")
        return found

    def remove_host(self, machine: dict[str, Any]) -> None:
        """Power the host off; any job process or RUNNING/COMPLETING job still there is a violation."""
        name = machine["metadata"]["name"]
        node = self.hosts.pop(name, None)
        if node is None:
            return
        processes = node.job_processes()
        jobs = self.busy_in_slurm(node.hostname)
        if processes or jobs:
            commands = [command_line(p) for p in processes]
            self.violations.append(f"released Machine {name} while its host {node.hostname} ran {jobs or commands}")
        node.power_off(self.sited.network)

    def held(self, name: str) -> bool:
        return self.hooked(name)

    def wait_all_released(self, reconcile: Any, timeout: float = 30.0) -> None:
        """Reconcile and step until no Machine is deleting (bounded)."""

        def released() -> bool:
            if not any(m["metadata"].get("deletionTimestamp") for m in self.machines()):
                return True
            reconcile()
            self.step()
            return False

        wait_for(released, timeout, "every deleting Machine released", interval=0, diagnostics=self._machine_names)

    def _machine_names(self) -> str:
        return f"Machines still there: {[m['metadata']['name'] for m in self.machines()]}"
