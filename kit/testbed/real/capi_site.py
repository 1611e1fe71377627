"""One bare-metal Slurm site under real Cluster API, for the whole-loop tier's CAPI tests.

Real, each in its own process: etcd, kube-apiserver and kube-controller-manager v1.36.4; the chart
installed with ``helm``, its two webhooks as the chart's pods; the CAPI core controller manager
v1.14.2 (:mod:`testbed.real.capi`, in a network namespace of its own); slurmctld and slurmrestd
24.11 on the host side of a test bridge. Played: CAPM3, the baremetal-operator, cloud-init and the
kubelet (:mod:`testbed.real.machines`), each host a real slurmd in a network namespace.

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
from testbed.real import capi
from testbed.real import story as k8s
from testbed.real.controlplane import ControlPlane, ControlPlaneError
from testbed.real.machines import Api, ApiError, ClusterSpec, MachineSimulator, add_host, seed_cluster
from testbed.real.netns import Network
from testbed.real.objects import RealApi
from testbed.real.release import Release, tier_values
from testbed.real.slurm import Slurm, SlurmConfig, SlurmRoot, free_port, prepare_root
from testbed.world import (
    SLIME_NAMESPACE,
    SlurmCluster,
    ensure_namespace,
    seed_capm3_identity,
    seed_nodeport,
    seed_slinky,
)

Progress = Callable[[str], None]
MIRROR = "mirror-a"
SPEC = ClusterSpec()
CAPI_V = "cluster.x-k8s.io/v1beta2"
JWT_SECRET = "slurm-auth-jwths256"


@dataclass(frozen=True)
class Prepared:
    """``COMPONENTS['capi']``: the manager binary, the CRDs, the Slurm root."""

    capi: capi.Prepared
    root: SlurmRoot


def prepare(progress: Progress) -> Prepared:
    """Build the CAPI manager, gather its CRDs (CAPI, CAPM3, BMH, the control plane stand-in), make the Slurm root."""
    workdir = Path(tempfile.mkdtemp(prefix="slime-capi-crds-"))  # the labelled CAPM3 copies, for this session
    atexit.register(shutil.rmtree, workdir, True)
    return Prepared(capi.prepare(workdir, progress), prepare_root(progress))


@dataclass
class Site:
    cp: ControlPlane
    api: RealApi  # testbed.world's ObjectApi over the real API server
    sim_api: Api
    stack: k8s.Stack
    slurm: Slurm
    slinky: SlurmCluster
    network: Network
    manager: capi.Manager
    sim: MachineSimulator
    workdir: Path
    hosts: list[str] = field(default_factory=list)

    # -- the Kubernetes side

    def scale_mirror(self, replicas: int) -> None:
        """KEDA's move, by hand: ``kubectl scale`` the mirror through kube-apiserver (admitted by the scaling webhook)."""
        self.cp.kubectl("-n", SLIME_NAMESPACE, "scale", "deployment", MIRROR, f"--replicas={replicas}")

    def md(self) -> dict[str, Any]:
        md = self.sim_api.get(CAPI_V, "machinedeployments", SPEC.namespace, SPEC.pool)
        assert md is not None
        return md

    def md_replicas(self) -> int:
        return int(self.md()["spec"].get("replicas") or 0)

    def machines(self) -> list[dict[str, Any]]:
        return sorted(self.sim_api.list(CAPI_V, "machines", SPEC.namespace), key=lambda m: str(m["metadata"]["name"]))

    def machine(self, name: str) -> dict[str, Any] | None:
        return self.sim_api.get(CAPI_V, "machines", SPEC.namespace, name)

    def running(self) -> list[dict[str, Any]]:
        """Machines CAPI reports Running with a nodeRef, not deleting."""
        return [
            m
            for m in self.machines()
            if (m.get("status") or {}).get("phase") == "Running"
            and ((m.get("status") or {}).get("nodeRef") or {}).get("name")
            and not m["metadata"].get("deletionTimestamp")
        ]

    def running_exactly(self, count: int) -> list[dict[str, Any]] | None:
        running = self.running()
        return running if len(running) == count else None

    def add_host(self, name: str) -> None:
        taken = {a for a in self.host_addresses().values()}
        address = next(a for a in self.network.hosts() if a not in taken)
        add_host(self.sim_api, SPEC.namespace, name, address, dict(SPEC.host_labels))
        self.hosts.append(name)

    def host(self, name: str) -> dict[str, Any]:
        host = self.sim_api.get("metal3.io/v1alpha1", "baremetalhosts", SPEC.namespace, name)
        assert host is not None, f"no BareMetalHost {name}"
        return host

    def host_addresses(self) -> dict[str, str]:
        return {
            h["metadata"]["name"]: h["status"]["hardware"]["nics"][0]["ip"]
            for h in self.sim_api.list("metal3.io/v1alpha1", "baremetalhosts", SPEC.namespace)
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
            f"Slurm nodes {json.dumps({n: sorted(s) for n, s in self.slurm.node_states().items()})}",
            f"simulator errors {self.sim.errors[-5:]}",
            "--- CAPI manager ---\n" + self.manager.tail(15),
        ]
        for name, pod in self.stack.pods.items():
            parts.append(f"--- {name} ---\n" + "\n".join(pod.logs().splitlines()[-10:]))
        return "\n".join(parts)

    # -- Slurm

    def job_on(self, node: str, release: str) -> int:
        """A real job on ``node`` that runs until the test creates ``release`` in the shared directory; its id, once RUNNING."""
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
        found.update({f"node {k}": v for k, v in self.sim.node_logs().items()})
        found["capi-manager"] = self.manager.log.read_text(errors="replace") if self.manager.log.exists() else ""
        for name, pod in self.stack.pods.items():
            found[f"pod {name}"] = pod.logs()
        return found


def _slinky(api: RealApi, network: Network) -> tuple[SlurmCluster, int]:
    """Slinky's objects (Controller, slurmctld pod with its hostIP on the bridge, the key Secrets) and a NodePort for slurmctld."""
    slinky = seed_slinky(api, host_ip=network.host_address)
    port = free_port(30000, 32767)  # slurmctld listens on the NodePort's port, as in the thesis setup
    seed_nodeport(api, slinky.namespace, slinky.controller, node_port=port)
    seed_capm3_identity(api, (SPEC.namespace,))  # metaData Secrets are created as CAPM3
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
        api, sim_api = RealApi(cp), Api(cp)
        stack.callback(sim_api.close)
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
        seed_cluster(sim_api, cp, SPEC, replicas=0)
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
        manager = capi.Manager(prepared.capi.manager, cp, workdir / "capi").start()
        stack.callback(manager.stop)
        sim = MachineSimulator(cp, prepared.root, network, workdir / "machines", SPEC.namespace, slurm=slurm).start()
        stack.callback(sim.stop)
        result = Site(cp, api, sim_api, pods, slurm, slinky, network, manager, sim, workdir)
        for index in range(hosts):
            result.add_host(f"host-{index + 1}")
        say(
            f"CAPI site up in {time.monotonic() - started:.0f} s (CAPI manager ready in {manager.started_seconds:.1f} s)"
        )
        try:
            yield result
        finally:
            for name, text in result.logs().items():
                EVIDENCE.add_text(f"real_loop capi {name}", text)
