"""One bare-metal Slurm site under real Cluster API and Metal3, for the whole-loop tier's CAPI tests.

Real, each in its own process: etcd, kube-apiserver and kube-controller-manager; the chart installed
with ``helm``, its two webhooks as the chart's pods; the CAPI core controller manager
(:mod:`testbed.components.capi`), CAPM3 and the baremetal-operator in test mode
(:mod:`testbed.components.metal3`), each in a network namespace of its own and CAPM3 and BMO as their
ServiceAccounts; slurmctld and slurmrestd 26.05 (as Slinky v1.3 configures them) on the host side
of a test bridge. Each provisioned host boots from its config drive with real cloud-init in a
network namespace and runs a real ``slurmd`` (:mod:`testbed.components.ironic`,
:mod:`testbed.components.host`). The hosts run no kubelet: no Node, no nodeRef (the plain
cloud-init bootstrap style; docs/scaling.md).

The mapping opts in to safe scale-in (slurmrestd = the real one, the JWT key from Slinky's Secret)
and capacity-aware scale-up, as an operator would turn both on for a Metal3 pool.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.components import capi, metal3
from testbed.components.cloudinit import USER_DATA
from testbed.components.debian_root import SlurmRoot, prepare_root
from testbed.components.host import PACKAGES
from testbed.components.release import tier_values
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.progress import Progress, quiet
from testbed.scenarios.metal3_cluster import ClusterSpec, seed_cluster
from testbed.scenarios.site import JWT_SECRET, Metal3Site, SiteBuilder, building
from testbed.scenarios.stack import image

MIRROR = "mirror-a"
SPEC = ClusterSpec()  # metal3/bm-cluster, pool md-a, hosts named by their Machines
# The write_files variant of the documented user-data (docs/install.md); the whole loop boots the runcmd one.
FILES_USER_DATA = USER_DATA.with_name("slurm-worker-files.yaml")


@dataclass(frozen=True)
class CapiParts:
    """What the CAPI tests need built: the CAPI manager and its CRDs, CAPM3 and BMO, the hosts' root (Slurm and
    cloud-init)."""

    capi: capi.CapiBuild
    metal3: metal3.Metal3Build
    root: SlurmRoot


def prepare(progress: Progress) -> CapiParts:
    """Build the CAPI manager, CAPM3 and BMO, gather the CRDs, make the hosts' root."""
    return CapiParts(capi.build(progress), metal3.build(progress), prepare_root(progress, extra_packages=PACKAGES))


@dataclass
class CapiSite(Metal3Site):
    """A Metal3 pool under real CAPI, its hosts booting real cloud-init and slurmd."""

    def scale_mirror(self, replicas: int) -> None:
        """KEDA's move, by hand: ``kubectl scale`` the mirror through kube-apiserver (admitted by the scaling
        webhook)."""
        self.cp.kubectl("-n", SLIME_NAMESPACE, "scale", "deployment", MIRROR, f"--replicas={replicas}")

    def provisioned(self) -> list[dict[str, Any]]:
        """Machines whose infrastructure CAPM3 reports provisioned (phase Provisioned: no Node, so no nodeRef), not
        deleting."""
        return [
            m
            for m in self.machines()
            if (m.get("status") or {}).get("phase") in ("Provisioned", "Running")
            and ((m.get("status") or {}).get("initialization") or {}).get("infrastructureProvisioned")
            and not m["metadata"].get("deletionTimestamp")
        ]

    def provisioned_exactly(self, count: int) -> list[dict[str, Any]] | None:
        provisioned = self.provisioned()
        return provisioned if len(provisioned) == count else None

    def events(self, reason: str, kind: str = "MachineDeployment", name: str = "") -> list[dict[str, Any]]:
        name = name or self.spec.pool
        return [
            e
            for e in self.api.list("v1", "Event", self.spec.namespace)
            if e.get("reason") == reason
            and e["involvedObject"].get("kind") == kind
            and e["involvedObject"].get("name") == name
        ]

    def metadata(self, machine: str) -> dict[str, str]:
        """The stored ``<m3m>-metadata`` Secret's flat map (the Metal3Machine has the Machine's name)."""
        secret = self.api.get("v1", "Secret", self.spec.namespace, f"{machine}-metadata")
        assert secret is not None, f"no metaData Secret for {machine}"
        loaded: dict[str, str] = yaml.safe_load(base64.b64decode(secret["data"]["metaData"]))
        return loaded

    def job_on(self, node: str, release: str) -> int:
        """A real job on ``node`` that runs until the test creates ``release`` in the shared directory; its id, once
        RUNNING."""
        job = self.slurm.sbatch("-w", node, "--wrap", f"while [ ! -e /srv/slime/{release} ]; do sleep 0.2; done")
        self.wait_for(lambda: self.slurm.jobs()[job]["job_state"] == ["RUNNING"], 60, f"job {job} to run on {node}")
        return job

    def idle_nodes(self, names: list[str]) -> dict[str, set[str]] | None:
        """Every node slurmctld knows (with its states) once all of ``names`` are IDLE in it; else None."""
        states = self.slurm.node_states()
        return states if all("IDLE" in states.get(name, set()) for name in names) else None

    def end_job(self, release: str) -> None:
        (self.slurm.shared / release).touch()


def values(site: Metal3Site) -> dict[str, Any]:
    """The chart for one Metal3 pool with safe scale-in on the real slurmrestd and capacity-aware scale-up."""
    slurm, slinky, spec = site.slurm, site.slinky, site.spec
    mapping = {
        "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
        "machineDeployment": {"name": spec.pool, "namespace": spec.namespace},
        "partition": slurm.config.partition,
        "config": {
            "capacityAware": True,
            "safeScaleIn": {"slurmrestd": slurm.restd_url, "jwtSecret": f"{slinky.namespace}/{JWT_SECRET}"},
        },
    }
    chart = tier_values(image(), [mapping])
    chart["scaling"].update(
        {
            "safeScaleIn": {"enabled": True, "jwtSecrets": [{"name": JWT_SECRET, "namespace": slinky.namespace}]},
            "capacityAware": {"enabled": True},
        }
    )
    return chart


def metal3_pool(
    build: SiteBuilder,
    parts: CapiParts,
    user_data: Path = FILES_USER_DATA,
    crds: tuple[Path, ...] = (),
    audit_scale_steps: bool = False,
    namespaces: tuple[str, ...] = (),
    **slurm: Any,
) -> None:
    """The steps every Metal3 site shares, up to the chart: a bridge, the control plane with CAPI's CRDs (and
    ``crds``), CAPM3's and BMO's install, Slinky with slurmctld on the bridge, real Slurm (``slurm``: its
    :class:`~testbed.components.slurm.SlurmConfig` fields, ``future``: FUTURE node records), the workload cluster an
    operator writes."""
    site = build.site
    assert isinstance(site, Metal3Site)
    build.network()
    build.control_plane([*parts.capi.crds, *crds], audit_scale_steps=audit_scale_steps)
    build.metal3_install(parts.metal3)
    build.namespaces(site.spec.namespace, site.spec.slurm_namespace, *namespaces)
    build.step("control plane up")
    build.slinky(on_bridge=True, capm3_identity=False)
    build.slurm_on_bridge(parts.root, **slurm)
    seed_cluster(site.api, site.cp, site.spec, replicas=0, user_data=user_data)


@contextmanager
def site(workdir: Path, parts: CapiParts, hosts: int, progress: Progress = quiet) -> Iterator[CapiSite]:
    """Everything up, in order, and down again in reverse (processes by PID, namespaces removed), even on failure."""
    with building(CapiSite(workdir, spec=SPEC), progress) as (result, build):
        metal3_pool(build, parts)
        build.chart(values(result))
        build.authenticated_admission()
        build.webhooks()
        build.controllers(parts.capi, parts.root)
        build.hosts([f"host-{index + 1}" for index in range(hosts)])
        manager, bmo, capm3 = result.manager, result.metal3.bmo, result.metal3.capm3
        build.step(
            f"CAPI site up (CAPI manager ready in {manager.started_seconds:.1f} s, "
            f"BMO in {bmo.started_seconds if bmo else 0:.1f} s, CAPM3 in {capm3.started_seconds if capm3 else 0:.1f} s)"
        )
        try:
            yield result
        finally:
            for name, text in result.logs().items():
                EVIDENCE.add_text(f"real_loop capi {name}", text)
