"""A pool of real hosts for safe scale-in: a MachineDeployment, its mirror, and the scaling webhook on real
slurmrestd."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.components.capi_sim import JWT_KEY, JWT_NS, JWT_SECRET, MD, MD_NS, MIRROR, safe_config_map
from testbed.components.services import Scaling
from testbed.components.slurm import Slurm
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment, mirror
from testbed.framework.wait import wait_for
from testbed.framework.world import md_events, md_replicas, scale_mirror
from testbed.scenarios.slurm_capi import RealCapi
from testbed.scenarios.slurm_site import SlurmSite


@dataclass
class Pool:
    """A MachineDeployment of real hosts, its mirror, and the scaling webhook with safeScaleIn on real slurmrestd."""

    site: SlurmSite
    capi: RealCapi
    scaling: Scaling

    @property
    def slurm(self) -> Slurm:
        return self.site.slurm

    def scale(self, replicas: int) -> None:
        """KEDA scales the mirror through the API (admitted by the webhook), then a reconcile pass acts on it."""
        scale_mirror(self.site.emulator, SLIME_NAMESPACE, MIRROR, replicas)
        self.scaling.sees_mirror(SLIME_NAMESPACE, MIRROR, replicas)
        self.scaling.service.reconcile_once()

    def reconcile(self) -> None:
        self.scaling.service.reconcile_once()

    def replicas(self) -> int | None:
        return md_replicas(self.site.emulator, MD_NS, MD)

    def states(self) -> dict[str, set[str]]:
        return self.slurm.node_states()

    def run(self, host: str, seconds: int, *args: str) -> int:
        """A real job on ``host``; returns once Slurm runs it."""
        job = self.slurm.sbatch("-w", host, *args, "--wrap", f"sleep {seconds}")
        wait_for(lambda: self.slurm.jobs()[job]["job_state"] == ["RUNNING"], 20, f"job {job} to run on {host}")
        return job

    def admin_drain(self, host: str, reason: str) -> None:
        self.slurm.scontrol("update", f"nodename={host}", "state=drain", f"reason={reason}")

    def events(self, reason: str) -> list[dict[str, Any]]:
        self.scaling.service.events.flush()
        return md_events(self.site.emulator, MD_NS, MD, reason)


def make_pool(
    site: SlurmSite, start: Callable[..., Scaling], replicas: int, hosts: tuple[str, ...] = (), **safe: Any
) -> Pool:
    """``replicas`` Machines whose hosts boot and join (named from ``hosts`` when given, see :class:`RealCapi`);
    ``safe``: safeScaleIn options."""
    emulator = site.emulator
    # Slinky's JWT Secret (seeded with the Controller) holds the key slurmctld verifies tokens with.
    jwt_secret = emulator.get("v1", "Secret", JWT_NS, JWT_SECRET)
    same = jwt_secret is not None and base64.b64decode(jwt_secret["data"][JWT_KEY]) == site.slurm.jwt_key
    assert same, "Slinky's JWT Secret does not hold the key slurmctld verifies with"  # (no key in the report)
    emulator.create(mirror(MIRROR, replicas=replicas, adopted_from=f"{MD_NS}/{MD}"))
    emulator.create(machine_deployment(MD, MD_NS, replicas=replicas))
    capi = RealCapi(site.emulator, site=site, host_names=hosts)
    for _ in range(replicas):
        capi.add_machine()
    emulator.create(safe_config_map(site.slurm.restd_url, **safe))
    return Pool(site, capi, start(emulator))


class SecretReader:
    """The one Kubernetes call SliMe's SlurmClient makes, answered from memory: GET the JWT key Secret."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        return {"data": {"jwt_hs256.key": base64.b64encode(self.key).decode()}}


def future_records(slurm: Slurm) -> dict[str, dict[str, object]]:
    """The FUTURE node records slurmctld keeps (``scontrol --future show nodes``; plain listings and GET nodes leave
    them out)."""
    data = json.loads(slurm.client(["scontrol", "--json", "--future", "show", "nodes"]).stdout)
    return {n["name"]: n for n in data.get("nodes") or [] if "FUTURE" in (n.get("state") or [])}
