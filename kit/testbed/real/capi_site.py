"""One bare-metal Slurm site under real Cluster API and Metal3, for the whole-loop tier's CAPI tests.

Real, each in its own process: etcd, kube-apiserver and kube-controller-manager v1.36.4; the chart
installed with ``helm``, its two webhooks as the chart's pods; the CAPI core controller manager
v1.14.2 (:mod:`testbed.real.capi`), CAPM3 v1.13.2 and the baremetal-operator v0.13.2 in test mode
(:mod:`testbed.real.metal3`), each in a network namespace of its own and CAPM3 and BMO as their
ServiceAccounts; slurmctld and slurmrestd 26.05 (as Slinky v1.3 configures them) on the host side
of a test bridge. Each provisioned host boots from its config drive with real cloud-init in a
network namespace and runs a real ``slurmd`` (:mod:`testbed.real.machines`, :mod:`testbed.real.host`).
The hosts run no kubelet: no Node, no nodeRef (the plain cloud-init bootstrap style; docs/scaling.md).

The mapping opts in to safe scale-in (slurmrestd = the real one, the JWT key from Slinky's Secret)
and capacity-aware scale-up, as an operator would turn both on for a Metal3 pool.
"""

from __future__ import annotations

import atexit
import base64
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from testbed.audit import EVIDENCE
from testbed.ports import free_port
from testbed.real import capi, metal3
from testbed.real import story as k8s
from testbed.real.cloudinit import USER_DATA
from testbed.real.controlplane import ControlPlane, ControlPlaneError
from testbed.real.host import PACKAGES, slurmctld_refusals
from testbed.real.isolated import IsolatedManager
from testbed.real.machines import (
    Api,
    ApiError,
    ClusterSpec,
    HostBooter,
    provisioning_state,
    register_host,
    seed_cluster,
)
from testbed.real.netns import Network
from testbed.real.objects import RealApi
from testbed.real.release import Release, tier_values
from testbed.real.slurm import Slurm, SlurmConfig, SlurmRoot, prepare_root
from testbed.world import (
    SLIME_NAMESPACE,
    SlurmCluster,
    ensure_namespace,
    seed_nodeport,
    seed_slinky,
)

Progress = Callable[[str], None]
MIRROR = "mirror-a"
# The write_files variant of the documented user-data (docs/install.md); the whole loop boots the runcmd one.
FILES_USER_DATA = USER_DATA.with_name("slurm-worker-files.yaml")
SPEC = ClusterSpec()
CAPI_V = "cluster.x-k8s.io/v1beta2"
JWT_SECRET = "slurm-auth-jwths256"


@dataclass(frozen=True)
class Prepared:
    """``COMPONENTS['capi']``: the CAPI manager and its CRDs, CAPM3 and BMO, the hosts' root (Slurm and cloud-init)."""

    capi: capi.Prepared
    metal3: metal3.Metal3Build
    root: SlurmRoot


def prepare(progress: Progress) -> Prepared:
    """Build the CAPI manager, CAPM3 and BMO, gather the CRDs, make the hosts' root."""
    workdir = Path(tempfile.mkdtemp(prefix="slime-capi-crds-"))  # the control plane stand-in's CRD, for this session
    atexit.register(shutil.rmtree, workdir, True)
    return Prepared(
        capi.prepare(workdir, progress), metal3.build(progress), prepare_root(progress, extra_packages=PACKAGES)
    )


@dataclass
class Site:
    cp: ControlPlane
    api: RealApi  # testbed.world's ObjectApi over the real API server
    kube: Api
    stack: k8s.Stack
    slurm: Slurm
    slinky: SlurmCluster
    network: Network
    manager: IsolatedManager  # CAPI's
    metal3: metal3.Metal3
    booter: HostBooter
    workdir: Path
    hosts: dict[str, str] = field(default_factory=dict)  # BareMetalHost name -> its NIC's address

    # -- the Kubernetes side

    def scale_mirror(self, replicas: int) -> None:
        """KEDA's move, by hand: ``kubectl scale`` the mirror through kube-apiserver (admitted by the scaling
        webhook)."""
        self.cp.kubectl("-n", SLIME_NAMESPACE, "scale", "deployment", MIRROR, f"--replicas={replicas}")

    def md(self) -> dict[str, Any]:
        md = self.kube.get(CAPI_V, "machinedeployments", SPEC.namespace, SPEC.pool)
        assert md is not None
        return md

    def md_replicas(self) -> int:
        return int(self.md()["spec"].get("replicas") or 0)

    def machines(self) -> list[dict[str, Any]]:
        return sorted(self.kube.list(CAPI_V, "machines", SPEC.namespace), key=lambda m: str(m["metadata"]["name"]))

    def machine(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(CAPI_V, "machines", SPEC.namespace, name)

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

    def add_host(self, name: str) -> None:
        address = next(a for a in self.network.hosts() if a not in self.hosts.values())
        register_host(self.kube, SPEC.namespace, name, address, dict(SPEC.host_labels))
        self.hosts[name] = address

    def host(self, name: str) -> dict[str, Any]:
        host = self.kube.get("metal3.io/v1alpha1", "baremetalhosts", SPEC.namespace, name)
        assert host is not None, f"no BareMetalHost {name}"
        return host

    def host_states(self) -> dict[str, str]:
        """Each BareMetalHost's provisioning state, as BMO reports it."""
        return {
            h["metadata"]["name"]: provisioning_state(h)
            for h in self.kube.list("metal3.io/v1alpha1", "baremetalhosts", SPEC.namespace)
        }

    def events(self, reason: str, kind: str = "MachineDeployment", name: str = SPEC.pool) -> list[dict[str, Any]]:
        return [
            e
            for e in self.api.list("v1", "Event", SPEC.namespace)
            if e.get("reason") == reason
            and e["involvedObject"].get("kind") == kind
            and e["involvedObject"].get("name") == name
        ]

    def metadata(self, machine: str) -> dict[str, str]:
        """The stored ``<m3m>-metadata`` Secret's flat map (the Metal3Machine has the Machine's name)."""
        secret = self.api.get("v1", "Secret", SPEC.namespace, f"{machine}-metadata")
        assert secret is not None, f"no metaData Secret for {machine}"
        loaded: dict[str, str] = yaml.safe_load(base64.b64decode(secret["data"]["metaData"]))
        return loaded

    # -- waiting

    def wait_for(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        """Wait until ``condition()`` is truthy (and return it); a timeout shows every component's recent log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition()
            except (ControlPlaneError, ApiError, httpx.HTTPError):  # a restarting API server answers 429 for a moment
                value = None
            if value:
                return value
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        machines = [
            (m["metadata"]["name"], (m.get("status") or {}).get("phase"), bool(m["metadata"].get("deletionTimestamp")))
            for m in self.machines()
        ]
        parts = [
            f"MachineDeployment replicas {self.md_replicas()}, Machines {machines}",
            f"BareMetalHosts {self.host_states()}",
            f"Slurm nodes {json.dumps({n: sorted(s) for n, s in self.slurm.node_states().items()})}",
            f"hosts booted {[b.node.describe() for b in self.booter.booted.values()]}",
            f"slurmctld's refusals {slurmctld_refusals(self.slurm)}",
            f"host booter errors {self.booter.errors[-5:]}",
            "--- CAPI manager ---\n" + self.manager.tail(15),
            self.metal3.tail(15),
        ]
        for name, pod in self.stack.pods.items():
            parts.append(f"--- {name} ---\n" + "\n".join(pod.logs().splitlines()[-10:]))
        return "\n".join(parts)

    # -- Slurm

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

    def logs(self) -> dict[str, str]:
        """Every log of the site (none may hold a key: the caller scans them)."""
        found = {f"slurm {k}": v for k, v in self.slurm.logs().items()}
        found.update({f"host {k}": v for k, v in self.booter.node_logs().items()})
        found["capi-manager"] = self.manager.log.read_text(errors="replace") if self.manager.log.exists() else ""
        found.update(self.metal3.logs())
        for name, pod in self.stack.pods.items():
            found[f"pod {name}"] = pod.logs()
        return found


def _slinky(api: RealApi, network: Network) -> tuple[SlurmCluster, int]:
    """Slinky's objects (Controller, slurmctld pod with its hostIP on the bridge, the key Secrets) and a NodePort for
    slurmctld."""
    slinky = seed_slinky(api, host_ip=network.host_address)
    port = free_port(30000, 32767)  # slurmctld listens on the NodePort's port, as in the thesis setup
    seed_nodeport(api, slinky.namespace, slinky.controller, node_port=port)
    return slinky, port


@contextmanager
def site(workdir: Path, prepared: Prepared, hosts: int, progress: Progress | None = None) -> Iterator[Site]:
    """Everything up, in order, and down again in reverse (processes by PID, namespaces removed), even on failure."""
    say = progress or (lambda line: None)
    started = time.monotonic()
    with ExitStack() as stack:
        network = stack.enter_context(Network())
        cp = k8s.start_control_plane(workdir / "control-plane")
        stack.callback(cp.stop)
        cp.install_crds(list(prepared.capi.crds))
        metal = metal3.Metal3(cp, prepared.metal3, workdir / "metal3")
        metal.install()  # CAPM3's and BMO's CRDs, namespaces, ServiceAccounts and RBAC
        api, kube = RealApi(cp), Api(cp)
        stack.callback(kube.close)
        for namespace in (SPEC.namespace, SPEC.slurm_namespace):
            ensure_namespace(api, namespace)
        slinky, port = _slinky(api, network)
        slurm = Slurm(
            prepared.root,
            workdir / "slurm",
            SlurmConfig.slinky(prepared.root, network.host_address, port),
            slurm_key=slinky.key,
            jwt_key=slinky.jwt_key,
        )  # the keys of Slinky's Secrets
        slurm.start()
        stack.callback(slurm.close)
        seed_cluster(kube, cp, SPEC, replicas=0, user_data=FILES_USER_DATA)
        mapping = {
            "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
            "machineDeployment": {"name": SPEC.pool, "namespace": SPEC.namespace},
            "partition": slurm.config.partition,
            "config": {
                "capacityAware": True,
                "safeScaleIn": {"slurmrestd": slurm.restd_url, "jwtSecret": f"{slinky.namespace}/{JWT_SECRET}"},
            },
        }
        values = tier_values(k8s.PREPARED.image or "localhost/slime:process", [mapping])
        values["scaling"].update(
            {
                "safeScaleIn": {"enabled": True, "jwtSecrets": [{"name": JWT_SECRET, "namespace": slinky.namespace}]},
                "capacityAware": {"enabled": True},
            }
        )
        release = Release(cp, SLIME_NAMESPACE, values, workdir)
        release.install()
        cp.restart_apiserver(release.admission_configuration(workdir / "admission"))
        pods = k8s.Stack(cp, release, api, slinky, workdir)
        stack.callback(pods.stop_webhooks)
        for component in ("injection", "scaling"):
            pods.start_webhook(component)
        manager = capi.manager(prepared.capi.manager, cp, workdir / "capi")
        stack.callback(manager.stop)
        manager.start()
        stack.callback(metal.stop)
        metal.start()
        booter = HostBooter(
            cp,
            prepared.root,
            network,
            workdir / "machines",
            SPEC.namespace,
            bmo_token=metal.token(metal3.BMO_NAMESPACE, metal3.BMO_SERVICE_ACCOUNT),
            slurm=slurm,
        ).start()
        stack.callback(booter.stop)
        result = Site(cp, api, kube, pods, slurm, slinky, network, manager, metal, booter, workdir)
        for index in range(hosts):
            result.add_host(f"host-{index + 1}")
        result.wait_for(
            lambda: set(result.host_states().values()) == {"available"},
            180,
            f"BMO to take the {hosts} BareMetalHosts to available",
        )
        say(
            f"CAPI site up in {time.monotonic() - started:.0f} s "
            f"(CAPI manager ready in {manager.started_seconds:.1f} s, "
            f"BMO in {metal.bmo.started_seconds if metal.bmo else 0:.1f} s, "
            f"CAPM3 in {metal.capm3.started_seconds if metal.capm3 else 0:.1f} s)"
        )
        try:
            yield result
        finally:
            for name, text in result.logs().items():
                EVIDENCE.add_text(f"real_loop capi {name}", text)
