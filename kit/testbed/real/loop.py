"""The whole loop, real (issue 15): Slurm → Prometheus/`/demand` → KEDA → HPA → mirror → scaling webhook → Cluster
API → injected node joins Slurm → job starts.

Everything is the real program except the metal:

- kube-apiserver, etcd, kube-controller-manager v1.36.4 (with the HPA controller and the
  aggregation layer), :mod:`testbed.real.tier`;
- cert-manager v1.21.2 issuing the chart's PKI (:mod:`testbed.real.certmanager`), the webhook pods'
  secret volumes refreshed as kubelet does;
- KEDA v2.21.0's operator, metrics adapter and admission webhooks (:mod:`testbed.real.keda`),
  Debian's Prometheus (:mod:`testbed.real.prometheus`) scraping Slurm 25.11's partition metrics
  computed from the real Slurm state (:mod:`testbed.real.slurm_metrics`);
- Slurm 24.11 (slurmctld, slurmrestd; :mod:`testbed.real.slurm`), the pool's hosts declared as
  FUTURE node records named after the BareMetalHosts (docs/install.md: Slurm only queues jobs for
  nodes it has records of);
- the chart installed with ``helm`` (certManager, KEDA with ``keda.demand=nodes``, safe scale-in,
  capacity-aware scale-up, authenticated admission), both webhooks as the chart's pods;
- Cluster API v1.14.2's core manager (:mod:`testbed.real.capi`), CAPM3 v1.13.2 and the
  baremetal-operator v0.13.2 in test mode (:mod:`testbed.real.metal3`), CAPM3 creating every
  ``metaData`` Secret as its own ServiceAccount;
- the hosts (:mod:`testbed.real.machines`, :mod:`testbed.real.host`): when BMO reports one
  provisioned, its config drive is built as Ironic builds it and it boots with real cloud-init in a
  network namespace, which runs the documented user-data: its ``slurmd -Z`` joins with the join
  data the injection webhook filled in. No Ironic, no BMC, no kubelet (no Node, no nodeRef).

:func:`whole_loop` starts it all and stops it in reverse, even on failure. :class:`Recorder`
watches a scale-up and fills a :class:`testbed.real.timeline.ScaleUp`: kube-apiserver's audit log
gives the Kubernetes steps to the microsecond (the scale writes with their bodies, Machine and
Secret creations), the scaling webhook's log the admission, and polling (every
:data:`POLL_SECONDS`) the demand and Slurm's node and job states. The whole-loop test and
``slime-demo --real`` run the same story (:func:`run_story`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.names import ADOPTED_ANNOTATION
from testbed.ports import free_port
from testbed.real import capi, certmanager, keda, metal3, prometheus, tier
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
from testbed.real.pods import VolumeSync
from testbed.real.release import Release, tier_values
from testbed.real.slurm import Slurm, SlurmConfig, SlurmFailed, SlurmRoot, prepare_root
from testbed.real.slurm_metrics import PATH as METRICS_PATH
from testbed.real.slurm_metrics import SlurmMetrics
from testbed.real.timeline import ScaleUp, plot, render
from testbed.world import (
    SLIME_NAMESPACE,
    SlurmCluster,
    ensure_namespace,
    seed_nodeport,
    seed_slinky,
)

Progress = Callable[[str], None]
PARTITION = "batch"
MIRROR = "mirror-batch"
SPEC = ClusterSpec(pool="md-batch", hostname_object="baremetalhost")  # node names = host names = FUTURE records
JWT_SECRET = "slurm-auth-jwths256"
MONITORING = "monitoring"
log = logging.getLogger("slime.testbed.loop")
POLL_SECONDS = 0.2
STARTED_STATES = {"RUNNING", "COMPLETING", "COMPLETED"}  # a job that already ended has started too
VOLUME_SYNC_SECONDS = 5.0  # kubelet's secret-volume refresh (1 min by default on a node)
KEDA_POLLING_SECONDS = 2  # the thesis used 15 s; short here so the story takes a minute, not several
KEDA_COOLDOWN_SECONDS = 15


def _no_progress(_: str) -> None:
    return None


@dataclass(frozen=True)
class Parts:
    """What the loop needs built or fetched, besides the real-Kubernetes tier's (:func:`testbed.real.tier.prepare`)."""

    certmanager: certmanager.CertManagerBuild
    keda: keda.KedaBinaries
    prometheus: prometheus.PrometheusBinaries
    capi: capi.Prepared
    metal3: metal3.Metal3Build
    root: SlurmRoot  # Slurm and cloud-init: the hosts' image, and slurmctld's root


def prepare(workdir: Path, progress: Progress) -> Parts:
    """Build or fetch every part (each is cached by version, so a second call takes seconds)."""
    return Parts(
        certmanager.build(progress),
        keda.build(progress),
        prometheus.binaries(progress),
        capi.prepare(workdir, progress),
        metal3.build(progress),
        prepare_root(progress, extra_packages=PACKAGES),
    )


@dataclass
class Loop:
    cp: ControlPlane
    api: RealApi
    kube: Api
    stack: tier.Stack
    slurm: Slurm
    slinky: SlurmCluster
    network: Network
    metrics: SlurmMetrics
    prometheus: prometheus.Prometheus
    keda: keda.Keda
    certmanager: certmanager.CertManager
    manager: IsolatedManager  # CAPI's
    metal3: metal3.Metal3
    booter: HostBooter
    workdir: Path
    hosts: list[str] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)

    @property
    def release(self) -> Release:
        return self.stack.release

    # -- reading the loop

    def mirror_replicas(self) -> int:
        mirror = self.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, MIRROR)
        return int(((mirror or {}).get("spec") or {}).get("replicas") or 0)

    def md_replicas(self) -> int:
        md = self.kube.get(capi_version(), "machinedeployments", SPEC.namespace, SPEC.pool)
        return int(((md or {}).get("spec") or {}).get("replicas") or 0)

    def machines(self) -> list[dict[str, Any]]:
        return self.kube.list(capi_version(), "machines", SPEC.namespace)

    def host_states(self) -> dict[str, str]:
        """Each BareMetalHost's provisioning state, as BMO reports it."""
        return {
            h["metadata"]["name"]: provisioning_state(h)
            for h in self.kube.list("metal3.io/v1alpha1", "baremetalhosts", SPEC.namespace)
        }

    def demand(self) -> dict[str, Any] | None:
        """``/demand/<partition>`` of the scaling webhook's pod (KEDA reads the same through the Service)."""
        answer = httpx.get(f"http://127.0.0.1:{self.release.metrics_port('scaling')}/demand/{PARTITION}", timeout=5)
        return answer.json() if answer.status_code == 200 else None

    def _demand_or_error(self) -> str:
        try:
            return json.dumps(self.demand())
        except httpx.HTTPError as exc:
            return f"unreadable ({type(exc).__name__})"

    def slurm_jobs(self) -> dict[int, dict[str, Any]]:
        """Slurm's jobs through slurmrestd (the same API SliMe reads)."""
        answer = self.slurm.rest("GET", f"/slurm/{self.slurm.root.api_version}/jobs/")
        answer.raise_for_status()
        return {int(j["job_id"]): j for j in answer.json().get("jobs") or []}

    def slurm_nodes(self) -> dict[str, set[str]]:
        answer = self.slurm.rest("GET", f"/slurm/{self.slurm.root.api_version}/nodes/")
        answer.raise_for_status()
        return {n["name"]: set(n.get("state") or []) for n in answer.json().get("nodes") or []}

    # -- acting

    def submit(self, nodes: int, release: str) -> int:
        """A job of ``nodes`` nodes that runs until :meth:`finish` ``release`` (one task per node, in the shared
        directory)."""
        job = self.slurm.sbatch(
            f"-N{nodes}",
            "-p",
            PARTITION,
            "--wrap",
            f"srun -N{nodes} sh -c 'while [ ! -e /srv/slime/{release} ]; do sleep 0.2; done'",
        )
        self.jobs.append(job)
        return job

    def finish(self, release: str) -> None:
        (self.slurm.shared / release).touch()

    def wait_for(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        """Wait until ``condition()`` is truthy and return it; a timeout names what and shows each component's recent
        log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition()
            except (ControlPlaneError, ApiError, httpx.HTTPError):  # an API answering 429 for a moment
                value = None
            if value:
                return value
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        phases = [(m["metadata"]["name"], (m.get("status") or {}).get("phase")) for m in self.machines()]
        scaled = self.api.get("keda.sh/v1alpha1", "scaledobjects", SLIME_NAMESPACE, MIRROR) or {}
        conditions = [
            (c.get("type"), c.get("status"), c.get("reason"))
            for c in (scaled.get("status") or {}).get("conditions") or []
        ]
        waiting = {
            job: (j.get("job_state"), j.get("state_reason"), (j.get("node_count") or {}).get("number"))
            for job, j in self.slurm_jobs().items()
            if "COMPLETED" not in (j.get("job_state") or [])
        }
        parts = [
            f"mirror {self.mirror_replicas()}, MachineDeployment {self.md_replicas()}, Machines {phases}",
            f"/demand/{PARTITION} {self._demand_or_error()}; ScaledObject conditions {conditions}",
            f"jobs not completed (state, reason, nodes) {waiting}",
            f"Slurm nodes {json.dumps({n: sorted(s) for n, s in self.slurm.node_states().items()})}",
            f"BareMetalHosts {self.host_states()}",
            f"hosts booted {[b.node.describe() for b in self.booter.booted.values()]}",
            f"slurmctld's refusals {slurmctld_refusals(self.slurm)}",
            f"host booter errors {self.booter.errors[-5:]}",
            "--- CAPI manager ---\n" + self.manager.tail(10),
            self.metal3.tail(10),
        ]
        parts += [
            f"--- KEDA {name} ---\n" + "\n".join(text.splitlines()[-8:]) for name, text in self.keda.logs().items()
        ]
        parts += [
            f"--- {name} ---\n" + "\n".join(pod.logs().splitlines()[-8:]) for name, pod in self.stack.pods.items()
        ]
        return "\n".join(parts)

    def key_leaks(self) -> list[str]:
        """The names of the logs that hold slurm.key or the JWT key, raw or base64 (none may)."""
        secrets = [self.slinky.key, self.slinky.jwt_key]
        needles = [n for secret in secrets for n in (secret, base64.b64encode(secret)) if len(secret) >= 16]
        return [name for name, text in self.logs().items() if any(n.decode("latin-1") in text for n in needles)]

    def logs(self) -> dict[str, str]:
        """Every log of the loop (none may hold a key: the callers scan them)."""
        found = {f"slurm {k}": v for k, v in self.slurm.logs().items()}
        found.update({f"host {k}": v for k, v in self.booter.node_logs().items()})
        found.update(self.metal3.logs())
        found.update({f"keda {k}": v for k, v in self.keda.logs().items()})
        found["capi-manager"] = self.manager.log.read_text(errors="replace") if self.manager.log.exists() else ""
        found.update({f"pod {name}": pod.logs() for name, pod in self.stack.pods.items()})
        return found


def capi_version() -> str:
    return "cluster.x-k8s.io/v1beta2"


def values(image: str, slurm: Slurm, hosts: int, prometheus_port: int) -> dict[str, Any]:
    """The chart as an operator would install it for one Metal3 pool that KEDA scales on node demand."""
    mapping = {
        "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
        "machineDeployment": {"name": SPEC.pool, "namespace": SPEC.namespace},
        "partition": PARTITION,
        # The HPA's scale-down window as short as KEDA's cooldown: with its default 300 s, a story run
        # again within 5 minutes started its 1-node job at the previous story's 4 (chart values.yaml).
        "keda": {
            "demand": "nodes",
            "minReplicaCount": 0,
            "maxReplicaCount": hosts,
            "pollingInterval": KEDA_POLLING_SECONDS,
            "cooldownPeriod": KEDA_COOLDOWN_SECONDS,
            "scaleDownStabilizationSeconds": KEDA_COOLDOWN_SECONDS,
        },
        "config": {
            "capacityAware": True,
            "safeScaleIn": {"slurmrestd": slurm.restd_url, "jwtSecret": f"{SPEC.slurm_namespace}/{JWT_SECRET}"},
        },
    }
    return tier_values(
        image,
        [mapping],
        certManager={"enabled": True},
        keda={"enabled": True, "serverAddress": f"http://prometheus.{MONITORING}.svc:{prometheus_port}"},
        scaling={
            "safeScaleIn": {"enabled": True, "jwtSecrets": [{"name": JWT_SECRET, "namespace": SPEC.slurm_namespace}]},
            "capacityAware": {"enabled": True},
            "extraArgs": ["--demand-interval-seconds=1"],
        },
    )


@contextmanager
def whole_loop(workdir: Path, parts: Parts, hosts: int = 4, progress: Progress = _no_progress) -> Iterator[Loop]:
    """Everything up in order (a line of progress per part), and down in reverse, by PID, namespaces removed, even on
    failure."""
    assert tier.PREPARED.binaries is not None, "testbed.real.tier.prepare() has not succeeded"
    started = time.monotonic()

    def step(what: str) -> None:
        progress(f"{what} ({time.monotonic() - started:.0f} s)")

    with ExitStack() as stack:
        network = stack.enter_context(Network())
        cp = tier.start_control_plane(workdir / "control-plane", audit_scale_steps=True)
        stack.callback(cp.stop)
        cp.install_crds([*parts.capi.crds, *parts.certmanager.crds])
        metal = metal3.Metal3(cp, parts.metal3, workdir / "metal3")
        metal.install()  # CAPM3's and BMO's CRDs, namespaces, ServiceAccounts and RBAC
        api, kube = RealApi(cp), Api(cp)
        stack.callback(kube.close)
        for namespace in (SPEC.namespace, SPEC.slurm_namespace, MONITORING):
            ensure_namespace(api, namespace)
        step("control plane up")
        # Slinky's objects and a real Slurm with their keys; slurmctld on the test bridge, where the hosts boot.
        slinky = seed_slinky(api, host_ip=network.host_address)
        port = free_port(30000, 32767)
        seed_nodeport(api, slinky.namespace, slinky.controller, node_port=port)
        slurm = Slurm(
            parts.root,
            workdir / "slurm",
            SlurmConfig.slinky(parts.root, network.host_address, port, partition=PARTITION),
            slurm_key=slinky.key,
            jwt_key=slinky.jwt_key,
        )
        stack.callback(slurm.close)
        slurm.start()
        names = [f"host-{index + 1}" for index in range(hosts)]
        slurm.scontrol("create", f"NodeName={','.join(names)}", "CPUs=2", "State=FUTURE")
        step("Slurm 24.11 up, the pool's hosts declared as FUTURE records")
        metrics = SlurmMetrics(slurm.restd_url, slurm.jwt_key).start()
        stack.callback(metrics.stop)
        prom = prometheus.Prometheus(
            workdir / "prometheus", parts.prometheus, {"slurm": (METRICS_PATH, [metrics.address])}
        ).start()
        stack.callback(prom.stop)
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "prometheus", "namespace": MONITORING},
                "spec": {
                    "type": "ExternalName",
                    "externalName": "localhost",
                    "ports": [{"name": "web", "port": prom.port, "protocol": "TCP"}],
                },
            }
        )
        manager = certmanager.CertManager(cp, parts.certmanager, workdir / "cert-manager").start()
        stack.callback(manager.stop)
        autoscaler = keda.Keda(cp, parts.keda, workdir / "keda")
        stack.callback(autoscaler.stop)
        autoscaler.install()
        autoscaler.start()
        step("Prometheus, cert-manager and KEDA up")
        seed_cluster(kube, cp, SPEC, replicas=0)
        release = Release(
            cp,
            SLIME_NAMESPACE,
            values(tier.PREPARED.image or "localhost/slime:process", slurm, hosts, prom.port),
            workdir,
        )
        release.install()
        for certificate in release.certificates():
            name = certificate["metadata"]["name"]
            cp.wait_for(
                lambda name=name: certmanager.certificate_ready(cp, SLIME_NAMESPACE, name),
                120,
                f"Certificate {name} Ready",
            )
        autoscaler.resolve()  # the chart's Services, now ExternalName localhost, resolve for KEDA
        cp.restart_apiserver(release.admission_configuration(workdir / "admission"))
        for resource in ("certificates", "issuers", "certificaterequests"):
            cp.wait_for(
                lambda resource=resource: (
                    cp.request("GET", f"/apis/cert-manager.io/v1/namespaces/{SLIME_NAMESPACE}/{resource}") is not None
                ),
                60,
                f"cert-manager.io {resource} served again after the API server restart",
            )
        webhooks = tier.Stack(cp, release, api, slinky, workdir)
        stack.callback(webhooks.stop_webhooks)
        for component in ("injection", "scaling"):
            webhooks.start_webhook(component, kubelet_volumes=True)
        stack.enter_context(VolumeSync(cp, list(webhooks.pods.values()), VOLUME_SYNC_SECONDS))
        step("the chart installed with helm: certificates issued by cert-manager, both webhooks serving them")
        capi_manager = capi.manager(parts.capi.manager, cp, workdir / "capi")
        stack.callback(capi_manager.stop)
        capi_manager.start()
        stack.callback(metal.stop)
        metal.start()
        booter = HostBooter(
            cp,
            parts.root,
            network,
            workdir / "machines",
            SPEC.namespace,
            bmo_token=metal.token(metal3.BMO_NAMESPACE, metal3.BMO_SERVICE_ACCOUNT),
            slurm=slurm,
        ).start()
        stack.callback(booter.stop)
        loop = Loop(
            cp,
            api,
            kube,
            webhooks,
            slurm,
            slinky,
            network,
            metrics,
            prom,
            autoscaler,
            manager,
            capi_manager,
            metal,
            booter,
            workdir,
        )
        for name, address in zip(names, network.hosts(), strict=False):
            register_host(kube, SPEC.namespace, name, address, dict(SPEC.host_labels))
            loop.hosts.append(name)
        loop.wait_for(
            lambda: set(loop.host_states().values()) == {"available"},
            180,
            f"BMO to take the {hosts} BareMetalHosts to available",
        )
        step(f"Cluster API, CAPM3 and BMO up, {hosts} BareMetalHosts registered and available")
        # Steady state before the story, as on a cluster that has run a while: the mirror adopted the
        # pool's 0, and KEDA has polled the node demand once without error (Ready, not Active).
        loop.wait_for(lambda: _adopted(api), 60, f"the scaling leader to adopt {SPEC.pool}'s replicas into {MIRROR}")
        loop.wait_for(lambda: _keda_polled(api), 120, f"KEDA to poll {MIRROR}'s node demand without error")
        step("KEDA polls the node demand; the pool is at 0")
        yield loop


def _adopted(api: RealApi) -> bool:
    mirror = api.get("apps/v1", "Deployment", SLIME_NAMESPACE, MIRROR) or {}
    return bool(((mirror.get("metadata") or {}).get("annotations") or {}).get(ADOPTED_ANNOTATION))


def _keda_polled(api: RealApi) -> bool:
    """KEDA's ScaledObject says Ready and not Active: a poll of its trigger ran and answered (an error sets Ready
    False)."""
    scaled = api.get("keda.sh/v1alpha1", "scaledobjects", SLIME_NAMESPACE, MIRROR) or {}
    conditions = {c.get("type"): c for c in (scaled.get("status") or {}).get("conditions") or []}
    ready, active = conditions.get("Ready") or {}, conditions.get("Active") or {}
    return (
        ready.get("status") == "True" and active.get("status") == "False" and active.get("reason") == "ScalerNotActive"
    )


# --- the timeline of a scale-up ----------------------------------------------------------------


def _timestamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Recorder:
    """Fills the :class:`ScaleUp` of one job while it goes from submitted to running (call :meth:`finish` after)."""

    loop: Loop
    scale_up: ScaleUp
    job: int
    nodes: int  # the nodes the job needs
    target: int  # the replicas the pool goes to
    before: int  # the Machines the pool had when the job was submitted
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Recorder:
        self._thread = threading.Thread(target=self._poll, name=f"recorder {self.scale_up.label}", daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        # A polled step is known to a poll's resolution: marked at the poll that found it, and, as a
        # lower bound, at the last poll that read the same source without finding it (for the order
        # check: KEDA may react to the demand between two of these polls).
        absent: dict[str, float] = {}

        def found(step: str, now: float, condition: bool) -> None:
            if condition:
                self.scale_up.mark(step, now, not_before=absent.get(step))
            elif step not in self.scale_up.at:
                absent[step] = now

        while not self._stop.wait(POLL_SECONDS):
            now = time.time()
            try:
                demand = self.loop.demand()
                found("seen", now, demand is not None and demand["pendingNodes"] >= self.nodes)
                states, up = self._hosts_up()
                found("registered", now, len(up) >= self.target)
                job = self.loop.slurm_jobs().get(self.job)
                started = job is not None and bool(set(job.get("job_state") or []) & STARTED_STATES)
                found("started", now, started)
                if started and job is not None:
                    if "registered" not in self.scale_up.at:
                        # The last host registered and the job started between the two reads of this poll:
                        # Slurm starts a job only on registered nodes, so read the nodes once more.
                        states, up = self._hosts_up()
                        found("registered", now, len(up) >= self.target)
                    if "registered" not in self.scale_up.at:  # what the timeline will miss, for the failure's reader
                        log.warning(
                            "%s: job %s %s with %d of %d hosts up; node states %s",
                            self.scale_up.label,
                            self.job,
                            job.get("job_state"),
                            len(up),
                            self.target,
                            {n: sorted(s) for n, s in states.items()},
                        )
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                continue  # a component busy for a moment: the next poll sees it

    def _hosts_up(self) -> tuple[dict[str, set[str]], list[str]]:
        states = self.loop.slurm_nodes()
        up = [n for n in self.loop.hosts if states.get(n, set()) & {"IDLE", "MIXED", "ALLOCATED", "COMPLETING"}]
        return states, up

    def _leader_calls(self, events: list[dict[str, Any]]) -> None:
        """The scaling webhook's requests received between the mirror stored and its MachineDeployment write."""
        stored, written = self.scale_up.at.get("mirror"), self.scale_up.at.get("md")
        if stored is None or written is None:
            return
        for event in sorted(events, key=_received):
            username = str((event.get("user") or {}).get("username", ""))
            if username.endswith(":slime-scaling-webhook") and stored <= _received(event) <= written:
                ref = event.get("objectRef") or {}
                what = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
                self.scale_up.leader_calls.append((_received(event) - stored, f"{event.get('verb')} {what}"))

    def finish(self, since: float) -> ScaleUp:
        """Stop polling; add the Kubernetes steps from the audit log and the webhook's log (events after ``since``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        events = [
            e
            for e in self.loop.cp.audit_events()
            if e.get("stage") == "ResponseComplete" and _timestamp(e["stageTimestamp"]) >= since
        ]
        for key, resource, name in (("mirror", "deployments", MIRROR), ("md", "machinedeployments", SPEC.pool)):
            for event in events:
                ref = event.get("objectRef") or {}
                body = event.get("requestObject") or {}
                if (
                    (ref.get("resource"), ref.get("subresource"), ref.get("name")) == (resource, "scale", name)
                    and ((body.get("spec") or {}).get("replicas") or 0) >= self.target
                    and event["responseStatus"]["code"] < 300
                ):
                    self.scale_up.mark(key, _timestamp(event["stageTimestamp"]))
                    break
        self._leader_calls(events)
        for key, resource in (("machine", "machines"), ("injected", "secrets")):
            # A creation is answered 201, whether by a create or by a server-side apply (CAPI's Machines).
            created = sorted(
                _timestamp(e["stageTimestamp"])
                for e in events
                if e["responseStatus"]["code"] == 201
                and (e.get("objectRef") or {}).get("resource") == resource
                and (resource == "machines" or str(e["objectRef"].get("name", "")).endswith("-metadata"))
            )
            new = self.target - self.before
            if len(created) >= new > 0:
                self.scale_up.mark(key, created[new - 1])
        for line in self.loop.stack.pods["scaling"].logs().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if (
                entry.get("msg") == "admission"
                and entry.get("name") == MIRROR
                and entry.get("decision") == "allowed"
                and str(entry.get("reason", "")).endswith(f"follows the stored mirror to {self.target}")
                and _timestamp(entry["ts"]) >= since
            ):
                self.scale_up.mark("admitted", _timestamp(entry["ts"]))
                break
        return self.scale_up


def _received(event: dict[str, Any]) -> float:
    return _timestamp(event.get("requestReceivedTimestamp") or event["stageTimestamp"])


def scale_up(loop: Loop, label: str, nodes: int, release: str, timeout: float = 240.0) -> tuple[int, ScaleUp]:
    """Submit a ``nodes``-node job; wait until it runs; its job id and timeline."""
    before = len([m for m in loop.machines() if not m["metadata"].get("deletionTimestamp")])
    target = max(before, nodes)
    since = time.time()
    job = loop.submit(nodes, release)
    timeline = ScaleUp(label)
    timeline.mark("submitted", time.time())
    recorder = Recorder(loop, timeline, job, nodes, target, before).start()
    # The recorder is the one that sees the job start (stopping it as soon as another poll saw it
    # could lose the step); it polls until then.
    loop.wait_for(lambda: "started" in timeline.at, timeout, f"job {job} ({nodes} nodes) to start")
    return job, recorder.finish(since - 1.0)


# --- the story -------------------------------------------------------------------------------------


@dataclass
class Story:
    """What :func:`run_story` saw: the scale-ups' timelines, the jobs' final states, the scale-in."""

    scale_ups: list[ScaleUp] = field(default_factory=list)
    jobs: dict[int, list[str]] = field(default_factory=dict)  # job id -> its final job_state
    scale_in_seconds: float = 0.0  # from the jobs' end to the pool at 0 with no Machine left (the first scale-in)
    busy_hosts_released: list[str] = field(default_factory=list)  # the host booter's record: must stay empty
    queued_after_scale_in: bool = False  # a job as big as the pool accepted (and run) once the pool was back at 0
    key_leaks: list[str] = field(default_factory=list)  # the logs slurm.key or the JWT key appeared in: must stay empty

    def problems(self) -> list[str]:
        """What went wrong, one line each (empty when the loop did everything it should)."""
        found = []
        for scale_up in self.scale_ups:
            if scale_up.missing():
                found.append(f"{scale_up.label}: steps not seen: {', '.join(scale_up.missing())}")
            if scale_up.out_of_order():
                found.append(f"{scale_up.label}: out of order: {scale_up.out_of_order()}")
        if not all(state == ["COMPLETED"] for state in self.jobs.values()):
            found.append(f"a job did not complete: {self.jobs}")
        if self.busy_hosts_released:
            found.append(f"hosts powered off while Slurm ran jobs on them: {self.busy_hosts_released}")
        if not self.queued_after_scale_in:
            found.append("after scale-in Slurm refuses a job as big as the pool: its node records were lost")
        if self.key_leaks:
            found.append(f"a key appeared in: {', '.join(self.key_leaks)}")
        return found

    def write_figures(self, target: Path) -> list[Path]:
        """The timeline as text, JSON and PNG in ``target`` (docs/performance.md's figures come from these)."""
        target.mkdir(parents=True, exist_ok=True)
        text, data, image = target / "timeline.txt", target / "timeline.json", target / "timeline.png"
        text.write_text(render(self.scale_ups) + "\n")
        data.write_text(
            json.dumps(
                {
                    "scale_ups": [
                        {
                            "label": s.label,
                            "since_submit": {k: s.since_submit(k) for k in s.at},
                            "phases": dict(s.phases()),
                            "leader_calls": s.leader_calls,
                        }
                        for s in self.scale_ups
                    ],
                    "scale_in_seconds": round(self.scale_in_seconds, 1),
                    "jobs": {str(k): v for k, v in self.jobs.items()},
                },
                indent=2,
            )
            + "\n"
        )
        plot(self.scale_ups, image)
        return [text, data, image]


def run_story(loop: Loop, say: Progress = _no_progress) -> Story:
    """A 1-node job on an empty pool, then a pool-sized job (multi-node: all its nodes come), scale-in to 0;
    then the pool-sized job again, on hosts that were deprovisioned and provisioned anew, and scale-in again."""
    story = Story()
    pool = len(loop.hosts)
    for label, nodes in (("1-node job, pool at 0", 1), (f"{pool}-node job", pool)):
        _run_job(loop, story, label, nodes, say)
    story.scale_in_seconds = _scale_in(loop, say)
    say(f"pool back at 0 in {story.scale_in_seconds:.1f} s; a {pool}-node job again: Slurm must still accept it")
    try:
        _run_job(loop, story, f"{pool}-node job after scale-in to 0", pool, say)
    except SlurmFailed as exc:  # sbatch refused it: the pool's node records were lost at scale-in
        say(f"Slurm refused it: {exc}")
    else:
        story.queued_after_scale_in = True
        _scale_in(loop, say)
    jobs = loop.slurm_jobs()
    story.jobs = {job: list((jobs.get(job) or {}).get("job_state") or ["GONE"]) for job in loop.jobs}
    story.busy_hosts_released = list(loop.booter.violations)
    story.key_leaks = loop.key_leaks()
    say(f"jobs {story.jobs}")
    return story


def _run_job(loop: Loop, story: Story, label: str, nodes: int, say: Progress) -> None:
    """Submit a ``nodes``-node job, record its scale-up, let it end, wait until Slurm says COMPLETED."""
    # unique in the loop: a file left by an earlier story would end this job at once
    release = f"release-{len(loop.jobs) + 1}"
    say(f"submitting a {nodes}-node job")
    job, timeline = scale_up(loop, label, nodes, release)
    story.scale_ups.append(timeline)
    say(f"job {job} runs on {nodes} node(s), {timeline.since_submit('started') or 0:.1f} s after it was submitted")
    loop.finish(release)
    _wait_completed(loop, job)


def _scale_in(loop: Loop, say: Progress) -> float:
    """Wait for KEDA's cooldown and safe scale-in to take the pool to 0 with no Machine left; the seconds it took."""
    ended = time.monotonic()
    say(
        f"all jobs done; KEDA scales the mirror to 0 after its cooldown ({KEDA_COOLDOWN_SECONDS} s), then safe scale-in"
    )
    loop.wait_for(
        lambda: loop.md_replicas() == 0 and not loop.machines(), 240, "the pool back at 0 with every Machine gone"
    )
    return time.monotonic() - ended


def _wait_completed(loop: Loop, job: int) -> None:
    def completed() -> bool:
        return "COMPLETED" in (loop.slurm_jobs().get(job, {}).get("job_state") or [])

    loop.wait_for(completed, 60, f"job {job} to complete")
