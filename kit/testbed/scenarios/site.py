"""The one site builder of the real tiers: a scenario asks for the parts it needs, in order.

A :class:`SiteBuilder` starts each part (:mod:`testbed.components`), records it on the
:class:`Site` and registers how to stop it; leaving the ``with`` block stops everything in reverse
(processes by PID, containers by ID, network namespaces removed), even on failure. The scenarios
(:mod:`~testbed.scenarios.capi`, :mod:`~testbed.scenarios.keda`,
:mod:`~testbed.scenarios.whole_loop`, :mod:`~testbed.scenarios.certificates`,
:mod:`~testbed.scenarios.stack`) are compositions of these steps, so each part is wired once:
Prometheus and its ``ExternalName`` Service, cert-manager's issuance and the API server restart it
must survive, the chart and its pods, Cluster API with Metal3 and the hosts.

A :class:`Site` knows what a failing wait should show: :meth:`Site.diagnostics` reports on each
part the site has, and :meth:`Site.logs` gathers every component's log for the secret scan.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from testbed.components import capi, metal3
from testbed.components.certmanager import CertManager, CertManagerBuild, certificate_ready
from testbed.components.controlplane import ControlPlane
from testbed.components.debian_root import SlurmRoot
from testbed.components.host import slurmctld_refusals
from testbed.components.ironic import HostBooter, provisioning_state
from testbed.components.isolated import IsolatedManager
from testbed.components.keda import Keda, KedaBinaries
from testbed.components.metal3 import Metal3, Metal3Build
from testbed.components.metrics_adapter import ExternalMetricsAdapter, Value
from testbed.components.netns import Network
from testbed.components.pods import VolumeSync
from testbed.components.prometheus import Prometheus, PrometheusBinaries
from testbed.components.release import Release
from testbed.components.slurm import Slurm, SlurmConfig
from testbed.components.slurm_metrics import PATH as METRICS_PATH
from testbed.components.slurm_metrics import SlurmMetrics
from testbed.framework.audit import EVIDENCE
from testbed.framework.cluster import KubeClient
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.ports import free_port
from testbed.framework.progress import Progress, quiet
from testbed.framework.wait import wait_for, waiter
from testbed.framework.world import SlurmCluster, ensure_namespace
from testbed.scenarios.metal3_cluster import CAPI_V, ClusterSpec, register_host
from testbed.scenarios.stack import TRANSIENT, Stack, seed_management_cluster, start_control_plane

MONITORING = "monitoring"
JWT_SECRET = "slurm-auth-jwths256"
VOLUME_SYNC_SECONDS = 5.0  # kubelet's secret-volume refresh (1 min by default on a node)
CERT_MANAGER_RESOURCES = ("certificates", "issuers", "certificaterequests")


@dataclass
class Site:
    """The parts a scenario started (an attribute exists once its part runs) and how to read them."""

    workdir: Path
    cp: ControlPlane = field(init=False)
    network: Network = field(init=False)
    slinky: SlurmCluster = field(init=False)  # Slinky's objects; their keys are Slurm's
    slurm: Slurm = field(init=False)
    metrics: SlurmMetrics = field(init=False)
    prometheus: Prometheus = field(init=False)
    certmanager: CertManager = field(init=False)
    keda: Keda = field(init=False)
    adapter: ExternalMetricsAdapter = field(init=False)  # external.metrics.k8s.io without KEDA
    metal3: Metal3 = field(init=False)
    manager: IsolatedManager = field(init=False)  # CAPI's
    booter: HostBooter = field(init=False)
    stack: Stack = field(init=False)  # the chart and its pods
    volume_sync: VolumeSync = field(init=False)  # kubelet's refresh of the pods' secret volumes
    timings: dict[str, float] = field(default_factory=dict)  # seconds some steps took (the tests report them)

    def __post_init__(self) -> None:
        self.wait_for = waiter(interval=0.3, diagnostics=self.diagnostics, retry_on=TRANSIENT)

    def has(self, part: str) -> bool:
        return part in vars(self)

    @property
    def api(self) -> KubeClient:
        return self.cp.api

    @property
    def release(self) -> Release:
        return self.stack.release

    # -- what a failure shows, and what the secret scan reads

    def diagnostics(self) -> str:
        parts: list[str] = []
        if self.has("slurm"):
            states = {n: sorted(s) for n, s in self.slurm.node_states().items()}
            parts += [f"Slurm nodes {json.dumps(states)}", f"slurmctld's refusals {slurmctld_refusals(self.slurm)}"]
        if self.has("booter"):
            parts += [f"hosts booted {[b.node.describe() for b in self.booter.booted.values()]}"]
            parts += [f"host booter errors {self.booter.errors[-5:]}"]
        if self.has("manager"):
            parts += ["--- CAPI manager ---\n" + self.manager.tail(15), self.metal3.tail(15)]
        if self.has("keda"):
            parts += [f"KEDA restarts {self.keda.restarts()}"]
            parts += [f"--- KEDA {name} ---\n" + _tail(text, 12) for name, text in self.keda.logs().items()]
        if self.has("stack"):
            parts.append(self.stack.pod_tails(10))
        return "\n".join(parts)

    def logs(self) -> dict[str, str]:
        """Every log of the site (none may hold a key: the callers scan them)."""
        found: dict[str, str] = {}
        if self.has("slurm"):
            found.update({f"slurm {k}": v for k, v in self.slurm.logs().items()})
        if self.has("booter"):
            found.update({f"host {k}": v for k, v in self.booter.node_logs().items()})
        if self.has("metal3"):
            found.update(self.metal3.logs())
        if self.has("keda"):
            found.update({f"keda {k}": v for k, v in self.keda.logs().items()})
        if self.has("manager"):
            found["capi-manager"] = self.manager.log.read_text(errors="replace") if self.manager.log.exists() else ""
        if self.has("stack"):
            found.update({f"pod {name}": pod.logs() for name, pod in self.stack.pods.items()})
        return found


@dataclass
class Metal3Site(Site):
    """A site with a Metal3 pool under real Cluster API (:attr:`spec` names it)."""

    spec: ClusterSpec = field(default_factory=ClusterSpec)
    hosts: dict[str, str] = field(default_factory=dict)  # BareMetalHost name -> its NIC's address

    def md(self) -> dict[str, Any]:
        md = self.api.get(CAPI_V, "machinedeployments", self.spec.namespace, self.spec.pool)
        assert md is not None, f"no MachineDeployment {self.spec.pool}"
        return md

    def md_replicas(self) -> int:
        return int(self.md()["spec"].get("replicas") or 0)

    def machines(self) -> list[dict[str, Any]]:
        found = self.api.list(CAPI_V, "machines", self.spec.namespace)
        return sorted(found, key=lambda m: str(m["metadata"]["name"]))

    def machine(self, name: str) -> dict[str, Any] | None:
        return self.api.get(CAPI_V, "machines", self.spec.namespace, name)

    def host_states(self) -> dict[str, str]:
        """Each BareMetalHost's provisioning state, as BMO reports it."""
        hosts = self.api.list("metal3.io/v1alpha1", "baremetalhosts", self.spec.namespace)
        return {h["metadata"]["name"]: provisioning_state(h) for h in hosts}

    def host(self, name: str) -> dict[str, Any]:
        host = self.api.get("metal3.io/v1alpha1", "baremetalhosts", self.spec.namespace, name)
        assert host is not None, f"no BareMetalHost {name}"
        return host

    def add_host(self, name: str) -> None:
        """Enroll a host with the next free address of the test bridge (BMO takes it to available)."""
        address = next(a for a in self.network.hosts() if a not in self.hosts.values())
        register_host(self.api, self.spec.namespace, name, address, dict(self.spec.host_labels))
        self.hosts[name] = address

    def diagnostics(self) -> str:
        machines = [
            (m["metadata"]["name"], (m.get("status") or {}).get("phase"), bool(m["metadata"].get("deletionTimestamp")))
            for m in self.machines()
        ]
        pool = f"MachineDeployment replicas {self.md_replicas()}, Machines {machines}"
        return "\n".join([pool, f"BareMetalHosts {self.host_states()}", super().diagnostics()])


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


S = TypeVar("S", bound=Site)


class SiteBuilder:
    """Starts the parts of ``site`` in the order a scenario calls its steps; ``exits`` stops them in reverse."""

    def __init__(self, site: Site, exits: ExitStack, progress: Progress = quiet) -> None:
        self.site, self.exits, self.progress = site, exits, progress
        self.started = time.monotonic()
        self.node_port = 30817  # slurmctld's port: the nodePort of Slinky's NodePort Service

    def step(self, what: str) -> None:
        """A progress line: what is up, and since when the site has been building."""
        self.progress(f"{what} ({time.monotonic() - self.started:.0f} s)")

    # -- Kubernetes

    def network(self) -> Network:
        self.site.network = self.exits.enter_context(Network())
        return self.site.network

    def control_plane(self, crds: list[Path] | None = None, audit_scale_steps: bool = False) -> ControlPlane:
        cp = start_control_plane(self.site.workdir / "control-plane", audit_scale_steps=audit_scale_steps)
        self.exits.callback(cp.stop)
        self.site.cp = cp
        if crds:
            cp.install_crds(crds)
        return cp

    def scheduler(self, node: str) -> None:
        """kube-scheduler, and one Node object (``node``, no kubelet) for it to bind pods to."""
        self.site.cp.register_node(node)
        self.site.cp.start_scheduler()

    def external_metrics(self, value: Value) -> ExternalMetricsAdapter:
        """The test adapter serving ``external.metrics.k8s.io`` from ``value``, registered and Available."""
        adapter = ExternalMetricsAdapter(self.site.cp, value)
        self.exits.callback(adapter.stop)
        adapter.register()
        self.site.adapter = adapter
        return adapter

    def namespaces(self, *names: str) -> None:
        for name in names:
            ensure_namespace(self.site.api, name)

    def slinky(self, on_bridge: bool = False, capm3_identity: bool = True) -> SlurmCluster:
        """Slinky's objects and a NodePort for slurmctld; ``on_bridge``: slurmctld's pod on the test bridge's host
        address and a NodePort of the node range, where the hosts boot and dial it."""
        if on_bridge:
            self.node_port = free_port(30000, 32767)  # slurmctld listens on the NodePort's port
            host_ip = self.site.network.host_address
            self.site.slinky = seed_management_cluster(self.site.api, host_ip, self.node_port, capm3_identity)
        else:
            self.site.slinky = seed_management_cluster(self.site.api, capm3_identity=capm3_identity)
        return self.site.slinky

    # -- Slurm, its metrics, Prometheus

    def slurm(self, root: SlurmRoot, config: SlurmConfig, future_nodes: str = "") -> Slurm:
        """Slurm with the keys of Slinky's Secrets; ``future_nodes``: FUTURE node records (a hostlist) for the pool."""
        slinky = self.site.slinky
        slurm = Slurm(root, self.site.workdir / "slurm", config, slurm_key=slinky.key, jwt_key=slinky.jwt_key)
        self.site.slurm = slurm
        self.exits.callback(_close_slurm, slurm)
        slurm.start()
        if future_nodes:
            slurm.scontrol("create", f"NodeName={future_nodes}", "CPUs=2", "State=FUTURE")
        return slurm

    def slurm_on_bridge(self, root: SlurmRoot, future: str = "", **config: Any) -> Slurm:
        """Slurm shaped as Slinky runs it, slurmctld on the test bridge at the NodePort Slinky's Service names."""
        address = self.site.network.host_address
        return self.slurm(root, SlurmConfig.slinky(root, address, self.node_port, **config), future)

    def prometheus(self, binaries: PrometheusBinaries) -> Prometheus:
        """Slurm's partition metrics, Prometheus scraping them every second, and ``monitoring/prometheus``: a Service
        of type ExternalName ``localhost``, so the chart's ``keda.serverAddress`` names it as an operator would."""
        metrics = SlurmMetrics(self.site.slurm.restd_url, self.site.slurm.jwt_key).start()
        self.exits.callback(metrics.stop)
        jobs = {"slurm": (METRICS_PATH, [metrics.address])}
        prometheus = Prometheus(self.site.workdir / "prometheus", binaries, jobs).start()
        self.exits.callback(prometheus.stop)
        ports = [{"name": "web", "port": prometheus.port, "protocol": "TCP"}]
        spec = {"type": "ExternalName", "externalName": "localhost", "ports": ports}
        meta = {"name": "prometheus", "namespace": MONITORING}
        self.site.api.create({"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec})
        self.site.metrics, self.site.prometheus = metrics, prometheus
        return prometheus

    # -- cert-manager and KEDA

    def certmanager(self, built: CertManagerBuild) -> CertManager:
        started = time.monotonic()
        self.site.certmanager = CertManager(self.site.cp, built, self.site.workdir / "cert-manager").start()
        self.site.timings["cert_manager_start"] = time.monotonic() - started
        self.exits.callback(self.site.certmanager.stop)
        return self.site.certmanager

    def keda(self, binaries: KedaBinaries) -> Keda:
        """KEDA installed from its own manifests and started (before the chart: the chart checks that the cluster
        serves ScaledObjects, and KEDA's webhook validates the chart's as they are created)."""
        keda = Keda(self.site.cp, binaries, self.site.workdir / "keda")
        self.exits.callback(_stop_keda, keda)
        keda.install()
        keda.start()
        self.site.keda = keda
        return keda

    # -- the chart and its pods

    def chart(self, values: dict[str, Any]) -> Release:
        """``helm install`` of the chart; with cert-manager, until every Certificate it renders is Ready."""
        # Routed at render (a post-renderer): a `helm upgrade` under load never turns the webhook Services back into
        # ClusterIP ones, which kube-apiserver would dial by their DNS name, off the machine (the KEDA loop's
        # upgrade, while KEDA and the HPA scale: calls failed open through the site's egress proxy).
        release = Release(self.site.cp, SLIME_NAMESPACE, values, self.site.workdir, routed_at_render=True)
        started = time.monotonic()
        release.install()
        for certificate in release.certificates():
            name = certificate["metadata"]["name"]
            wait_for(
                self._ready(name),
                120,
                f"Certificate {name} Ready",
                interval=0.1,
                retry_on=TRANSIENT,
                diagnostics=self._cert_manager_log,
            )
        self.site.timings["install_to_all_ready"] = time.monotonic() - started
        self.site.stack = Stack(self.site.cp, release, self.site.slinky, self.site.workdir)
        return release

    def _ready(self, certificate: str) -> Callable[[], bool]:
        return lambda: certificate_ready(self.site.cp, SLIME_NAMESPACE, certificate)

    def _cert_manager_log(self) -> str:
        return self.site.certmanager.log_tail("cert-manager-controller")

    def authenticated_admission(self) -> None:
        """kube-apiserver restarted with the chart's client certificate for the webhooks (docs/install.md); KEDA's
        names resolved again first. With cert-manager: until its resources are served again (/readyz comes before
        each custom resource's storage, which answers 429 until then)."""
        if self.site.has("keda"):
            self.site.keda.resolve()  # the chart's Services, now ExternalName localhost, resolve for KEDA
        release = self.site.release
        self.site.cp.restart_apiserver(release.admission_configuration(self.site.workdir / "admission"))
        if self.site.has("certmanager"):
            for resource in CERT_MANAGER_RESOURCES:
                what = f"cert-manager.io {resource} served again after the API server restart"
                wait_for(self._served(resource), 60, what, interval=0.1, retry_on=TRANSIENT)

    def _served(self, resource: str) -> Callable[[], bool]:
        def served() -> bool:
            self.site.api.list("cert-manager.io/v1", resource, SLIME_NAMESPACE)  # answers 429 until it is
            return True

        return served

    def webhooks(self, kubelet_volumes: bool = False, runner: str = "") -> Stack:
        """Both webhooks as the chart's pods; ``kubelet_volumes``: their secret volumes refreshed as kubelet does;
        ``runner``: ``pod`` or ``process`` (default: ``$SLIME_REAL_RUNNER``'s)."""
        stack = self.site.stack
        stack.runner = runner or stack.runner
        self.exits.callback(stack.stop_webhooks)
        stack.start_webhooks(**({"kubelet_volumes": True} if kubelet_volumes else {}))
        if kubelet_volumes:
            sync = VolumeSync(self.site.cp, list(stack.pods.values()), VOLUME_SYNC_SECONDS)
            self.site.volume_sync = self.exits.enter_context(sync)
        return stack

    # -- Cluster API, Metal3 and the hosts

    def metal3_install(self, built: Metal3Build) -> Metal3:
        """CAPM3's and BMO's CRDs, namespaces, ServiceAccounts and RBAC (their controllers start later)."""
        self.site.metal3 = Metal3(self.site.cp, built, self.site.workdir / "metal3")
        self.site.metal3.install()
        return self.site.metal3

    def controllers(self, built: capi.CapiBuild, root: SlurmRoot) -> HostBooter:
        """CAPI's manager, CAPM3 and BMO, and the host booter playing Ironic and the machines."""
        site = self.site
        assert isinstance(site, Metal3Site)
        site.manager = capi.manager(built.manager, site.cp, site.workdir / "capi")
        self.exits.callback(site.manager.stop)
        site.manager.start()
        self.exits.callback(site.metal3.stop)
        site.metal3.start()
        bmo_token = site.metal3.token(metal3.BMO_NAMESPACE, metal3.BMO_SERVICE_ACCOUNT)
        machines = site.workdir / "machines"
        booter = HostBooter(site.cp, root, site.network, machines, site.spec.namespace, bmo_token, slurm=site.slurm)
        site.booter = booter.start()
        self.exits.callback(booter.stop)
        return booter

    def hosts(self, names: list[str]) -> None:
        """Enroll the pool's hosts and wait until BMO takes them all to available."""
        site = self.site
        assert isinstance(site, Metal3Site)
        for name in names:
            site.add_host(name)
        site.wait_for(
            lambda: set(site.host_states().values()) == {"available"},
            "hosts-available",
            f"BMO to take the {len(names)} BareMetalHosts to available",
        )


@contextmanager
def building(site: S, progress: Progress = quiet) -> Iterator[tuple[S, SiteBuilder]]:
    """``with building(SomeSite(workdir)) as (site, build): build.control_plane(); ...``: every part stopped at exit."""
    with ExitStack() as exits:
        yield site, SiteBuilder(site, exits, progress)


def _close_slurm(slurm: Slurm) -> None:
    slurm.close()
    for name, text in slurm.logs().items():
        EVIDENCE.add_text(f"slurm {name}", text)


def _stop_keda(keda: Keda) -> None:
    keda.stop()
    for name, text in keda.logs().items():  # the session's secret scan: no key in KEDA's logs
        EVIDENCE.add_text(f"keda {name}", text)
