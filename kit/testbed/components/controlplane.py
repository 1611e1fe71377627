"""A real control plane on 127.0.0.1: etcd, kube-apiserver and kube-controller-manager, as envtest runs them.

**Build.** :func:`binaries`: ``$KUBEBUILDER_ASSETS`` (envtest's layout) when set, else built once
from ``kit/stack/kube``: kube-apiserver, kube-controller-manager and kubectl from
``k8s.io/kubernetes`` :data:`~testbed.framework.pins.KUBE_VERSION` (each staging module replaced
by its published ``v0.Y.Z``) and etcd from ``go.etcd.io/etcd/server/v3`` at the version that
release requires, stamped with the release's version (Helm's ``kubeVersion`` checks read it).

**Run.** :class:`ControlPlane`:

- **etcd** on two random loopback ports (client, peer), data in the work directory, no fsync.
- **kube-apiserver** on a random loopback port with TLS (a serving certificate for 127.0.0.1 and
  ``localhost``), client certificates from a CA of its own (an admin in ``system:masters``, as
  envtest's), RBAC authorization, service-account token signing (issuer
  ``https://127.0.0.1:<port>``, so TokenRequest works), an audit log of every call made by a
  service account (``audit.log``: the tiers read each webhook's calls and their answers from it),
  the aggregation layer's flags (a front-proxy CA of its own for ``--requestheader-client-ca-file``,
  the ``front-proxy-client`` certificate it presents to an extension API server such as KEDA's
  metrics adapter; ``--enable-aggregator-routing`` stays off: it would dial Endpoints, and
  Endpoints cannot hold loopback addresses, so an ``APIService`` is routed like a webhook, through
  an ``ExternalName: localhost`` Service), and optionally an ``--admission-control-config-file``.
- **kube-controller-manager** (when there is a binary) with the deployment, replicaset,
  garbage-collector, namespace and service-account controllers, the root-CA publisher, and the
  horizontal-pod-autoscaler controller (KEDA's HPAs; synced every :data:`HPA_SYNC_SECONDS` s).
- **kube-scheduler** on demand only (:meth:`ControlPlane.start_scheduler`), with the default
  profile, for a tier that proves what is or is not scheduled (the mirror pods' scheduling gate);
  its nodes are Node objects registered by the tier (:meth:`ControlPlane.register_node`), no kubelet.

Each process logs to ``<name>.log`` in the work directory and is stopped by its PID. The API
server and etcd can be killed and started again on the same ports and data (:meth:`ControlPlane.kill`,
:meth:`ControlPlane.start_apiserver`, :meth:`ControlPlane.start_etcd`): what a crash and a restart
look like to clients. :attr:`ControlPlane.api` is the admin's
:class:`~testbed.framework.cluster.KubeClient`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from testbed.framework.cluster import Credentials, KubeClient
from testbed.framework.errors import ComponentFailed
from testbed.framework.gobuild import BuildUnavailable, go_build, version_ldflags
from testbed.framework.pins import KUBE_VERSION
from testbed.framework.pki import Ca, pem_key, write, write_pair
from testbed.framework.ports import free_port
from testbed.framework.processes import spawn, stop_process, wait_started
from testbed.framework.progress import Progress, to_stderr

# KCM's controllers (names as of 1.33+, which end in -controller): what Deployments, garbage
# collection, namespace deletion and the ServiceAccount admission plugin need. No scheduler and
# no kubelet: pods stay Pending unless a tier runs the kit's kubelet.
KCM_CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "horizontal-pod-autoscaler-controller",
)
HPA_SYNC_SECONDS = 5  # kube-controller-manager's default is 15 s; idle without HPAs
FRONT_PROXY_CLIENT = "front-proxy-client"  # the CN kube-apiserver's aggregator presents (--requestheader-allowed-names)
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    # Every call a service account makes (the webhooks'), with its verb, resource and answer; nothing else.
    "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
}
# With ``ControlPlane(audit_scale_steps=True)`` (the whole loop's timeline), first: every write of a
# Deployment's or MachineDeployment's /scale with its body (the replicas asked), and every creation
# of a Machine or a Secret, whoever makes it, timed by kube-apiserver to the microsecond. Cluster
# API's MachineSet controller creates Machines by server-side apply, a ``patch`` answered 201.
SCALE_STEP_RULES = [
    {
        "level": "Request",
        "verbs": ["update", "patch"],
        "resources": [
            {"group": "apps", "resources": ["deployments/scale"]},
            {"group": "cluster.x-k8s.io", "resources": ["machinedeployments/scale"]},
        ],
    },
    {
        "level": "Metadata",
        "verbs": ["create", "patch"],
        "resources": [{"group": "cluster.x-k8s.io", "resources": ["machines"]}],
    },
    {"level": "Metadata", "verbs": ["create"], "resources": [{"group": "", "resources": ["secrets"]}]},
]
PROCESSES = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")  # in the order they stop


class ControlPlaneError(ComponentFailed):
    """A component did not start or answer; the message carries the end of its log."""


# --- build ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlPlaneBinaries:
    kube_apiserver: Path
    etcd: Path
    kube_controller_manager: Path | None
    kubectl: Path
    source: str  # where they came from, for the logs and docs/testing.md
    kube_scheduler: Path | None = None


def build(progress: Progress = to_stderr) -> dict[str, Path]:
    """kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd from ``kit/stack/kube`` (cached)."""
    packages = {
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        "etcd": "./cmd/etcd",
    }
    stamp = version_ldflags("k8s.io/component-base/version", KUBE_VERSION)
    return go_build("kube", "kube", KUBE_VERSION, packages, stamp, progress)


def binaries(progress: Progress = to_stderr) -> ControlPlaneBinaries:
    """``$KUBEBUILDER_ASSETS`` (kube-apiserver, etcd, kubectl) when set, else ``kit/stack/kube``.

    setup-envtest ships no kube-controller-manager: with such assets it is built from ``kit/stack/kube``
    when Go is there, else the control plane runs without it (no Deployment, garbage-collector or
    namespace controllers; the story does not need them).
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        built = build(progress)
        found = (built["kube-apiserver"], built["etcd"], built["kube-controller-manager"], built["kubectl"])
        source = f"built from kit/stack/kube into {built['etcd'].parent}"
        return ControlPlaneBinaries(*found, source, kube_scheduler=built["kube-scheduler"])
    base = Path(assets)
    missing = [b for b in ("kube-apiserver", "etcd", "kubectl") if not (base / b).is_file()]
    if missing:
        raise BuildUnavailable(f"KUBEBUILDER_ASSETS={assets} has no {', '.join(missing)}")
    kcm: Path | None = base / "kube-controller-manager"
    if not (base / "kube-controller-manager").is_file():
        try:
            kcm = build(progress)["kube-controller-manager"]
        except BuildUnavailable:
            kcm = None
    return ControlPlaneBinaries(
        base / "kube-apiserver", base / "etcd", kcm, base / "kubectl", f"KUBEBUILDER_ASSETS={assets}"
    )


# --- run --------------------------------------------------------------------------------------------------------


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on 127.0.0.1, in ``workdir``."""

    workdir: Path
    binaries: ControlPlaneBinaries
    admission_config: Path | None = None
    audit_scale_steps: bool = False  # SCALE_STEP_RULES too
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # kube-apiserver start -> /readyz, each time it started
    startup_windows: list[tuple[dt.datetime, dt.datetime]] = field(default_factory=list)
    started_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = self.workdir / "pki"
        self.pki.mkdir(exist_ok=True)
        self.ca = Ca.create("slime-real-k8s-ca")
        self.ca_file = write(self.pki / "ca.crt", self.ca.pem)
        serving = self.ca.issue(
            "kube-apiserver", dns=("localhost", "kubernetes", "kubernetes.default.svc"), ips=("127.0.0.1",), server=True
        )
        self.serving_cert, self.serving_key = write_pair(self.pki, "apiserver", serving)
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = write(self.pki / "sa.key", pem_key(sa_key), private=True)
        public = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.sa_pub = write(self.pki / "sa.pub", public)
        self.credentials = self.user_credentials("slime-admin", "system:masters", "admin")
        self.kubeconfig = self.credentials.write_kubeconfig(self.workdir / "admin.kubeconfig", "admin")
        kcm = self.user_credentials("system:kube-controller-manager", "", "kcm")
        self.kcm_kubeconfig = kcm.write_kubeconfig(self.workdir / "kcm.kubeconfig", "kcm")
        # The aggregation layer: the API server proxies to extension API servers (APIService) with
        # this client certificate; they trust it through the CA kube-apiserver publishes in
        # kube-system/extension-apiserver-authentication.
        self.front_proxy_ca = Ca.create("slime-real-k8s-front-proxy-ca")
        self.front_proxy_ca_file = write(self.pki / "front-proxy-ca.crt", self.front_proxy_ca.pem)
        proxy = self.front_proxy_ca.issue(FRONT_PROXY_CLIENT)
        self.proxy_client_cert, self.proxy_client_key = write_pair(self.pki, "front-proxy-client", proxy)
        self.audit_log = self.workdir / "audit.log"
        self.audit_policy = self.workdir / "audit-policy.yaml"
        rules = [*(SCALE_STEP_RULES if self.audit_scale_steps else []), *AUDIT_POLICY["rules"]]
        self.audit_policy.write_text(yaml.safe_dump({**AUDIT_POLICY, "rules": rules}))
        self.api = KubeClient(self.credentials)

    # -- addresses and clients

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        return self.ca.pem

    def user_credentials(self, user: str, group: str = "", name: str = "") -> Credentials:
        """A client certificate for ``user`` (in ``group``) signed by the API server's CA, written as ``<name>``."""
        cert, key = write_pair(self.pki, name or user, self.ca.issue(user, organization=group))
        return Credentials(self.url, self.ca_file, cert, key)

    def client(self, **options: Any) -> KubeClient:
        """A new admin client (a thread of its own keeps its own connections)."""
        return KubeClient(self.credentials, **options)

    def token_kubeconfig(self, path: Path, namespace: str, service_account: str, seconds: int = 3600) -> Path:
        """A kubeconfig holding a TokenRequest token of ``namespace/service_account``, trusting this API server."""
        token = self.api.token(namespace, service_account, seconds)
        return self.credentials.with_token(token).write_kubeconfig(path, f"{namespace}-{service_account}")

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl as the admin; ``check`` raises with its stderr on failure."""
        proc = subprocess.run(
            [str(self.binaries.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    # -- processes

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        self.processes[name] = spawn(args, self.workdir / f"{name}.log")
        return self.processes[name]

    def _started(self, name: str, probe: Any, timeout: float | str) -> None:
        log = self.workdir / f"{name}.log"
        wait_started(self.processes[name], probe, timeout, name, log, retry_on=(httpx.HTTPError,))

    def start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        args = [str(self.binaries.etcd), "--name", "default", "--data-dir", str(self.workdir / "etcd")]
        args += ["--listen-client-urls", client, "--advertise-client-urls", client]
        args += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
        args += ["--initial-cluster", f"default={peer}", "--unsafe-no-fsync", "--log-level", "warn"]
        self._spawn("etcd", args)
        self._started("etcd", lambda: httpx.get(f"{client}/health", timeout=2).status_code == 200, "process-start")

    def apiserver_args(self) -> list[str]:
        args = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--secure-port={self.port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={self.serving_cert}",
            f"--tls-private-key-file={self.serving_key}",
            f"--client-ca-file={self.ca_file}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            # The kubernetes Service would get 127.0.0.1 as its endpoint, which is not allowed.
            "--endpoint-reconciler-type=none",
            f"--audit-policy-file={self.audit_policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-maxbackup=1",
            # The aggregation layer (see the module doc); no --enable-aggregator-routing.
            f"--requestheader-client-ca-file={self.front_proxy_ca_file}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.proxy_client_cert}",
            f"--proxy-client-key-file={self.proxy_client_key}",
        ]
        if self.binaries.kube_controller_manager is None:
            # Without the service-account controller no namespace gets its `default` ServiceAccount.
            args.append("--disable-admission-plugins=ServiceAccount")
        if self.admission_config is not None:
            args.append(f"--admission-control-config-file={self.admission_config}")
        return args

    def start_apiserver(self) -> None:
        started = dt.datetime.now(dt.UTC)
        self._spawn("kube-apiserver", self.apiserver_args())
        self._started("kube-apiserver", lambda: self.api.ok("/readyz"), "apiserver-start")
        # Until /readyz, the port is open but the RBAC authorizer's informers may not have synced
        # yet: clients that (re)connect then are refused 403 and retry. The audit reads keep these apart.
        self.startup_windows.append((started, dt.datetime.now(dt.UTC)))

    def start_controller_manager(self) -> None:
        if self.binaries.kube_controller_manager is None:
            return
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.kcm_kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"--controllers={','.join(KCM_CONTROLLERS)}",
                f"--service-account-private-key-file={self.sa_key}",
                f"--root-ca-file={self.ca_file}",
                "--use-service-account-credentials=true",
                f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_SECONDS}s",
            ],
        )

    def start_scheduler(self) -> None:
        """kube-scheduler with its default profile, as the user kubeadm gives it (``system:kube-scheduler``,
        which the API server's bootstrap RBAC binds); no serving port, no leader election."""
        if self.binaries.kube_scheduler is None:
            raise ControlPlaneError(f"no kube-scheduler among the control plane's binaries ({self.binaries.source})")
        credentials = self.user_credentials("system:kube-scheduler", "", "scheduler")
        kubeconfig = credentials.write_kubeconfig(self.workdir / "scheduler.kubeconfig", "scheduler")
        args = [str(self.binaries.kube_scheduler), f"--kubeconfig={kubeconfig}", "--leader-elect=false"]
        self._spawn("kube-scheduler", [*args, "--bind-address=127.0.0.1", "--secure-port=0"])

    def register_node(self, name: str, pods: int = 110) -> None:
        """A Node object as a kubelet registers it (Ready, room for ``pods`` pods), with no kubelet behind it:
        what kube-scheduler binds pods to. Nothing runs what it binds."""
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "registered by the kit"}
        capacity = {"cpu": "64", "memory": "256Gi", "pods": str(pods)}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]},
        }
        self.api.create(node)
        # The API server's TaintNodesByCondition plugin taints a new Node not-ready; kube-controller-manager's
        # node-lifecycle controller lifts it once the Node reports Ready. That controller does not run here
        # (with no kubelet heartbeats it would taint the Node again), so the taint is lifted as it would.
        self.api.patch("v1", "Node", "", name, {"spec": {"taints": None}})

    def start(self) -> ControlPlane:
        started = time.monotonic()
        self.start_etcd()
        self.start_apiserver()
        self.start_controller_manager()
        if self.binaries.kube_controller_manager is not None:
            path = "/api/v1/namespaces/default/serviceaccounts/default"
            self._started("kube-controller-manager", lambda: self.api.ok(path), "api-object")
        self.started_seconds = time.monotonic() - started
        return self

    def kill(self, name: str) -> None:
        """SIGKILL one component (``etcd``, ``kube-apiserver``, ``kube-controller-manager``): a crash."""
        proc = self.processes.get(name)
        if proc is not None:
            stop_process(proc, 0.0, signal.SIGKILL)

    def restart_apiserver(self, admission_config: Path | None = None) -> None:
        """Stop the API server (SIGTERM) and start it again, with a new admission configuration if given."""
        if admission_config is not None:
            self.admission_config = admission_config
        proc = self.processes.get("kube-apiserver")
        if proc is not None:
            stop_process(proc, 15.0)
        self.start_apiserver()

    def stop(self) -> None:
        for name in PROCESSES:
            proc = self.processes.pop(name, None)
            if proc is not None:
                stop_process(proc, 10.0)
        self.api.close()

    # -- objects

    def install_crds(self, files: list[Path], timeout: float = 120.0) -> None:
        """Apply CRD files (server-side, as large CRDs need) and wait until each is Established."""
        args = ["apply", "--server-side", "--field-manager=slime-real-k8s"]
        for path in files:
            args += ["-f", str(path)]
        self.kubectl(*args, timeout=timeout)
        self.wait_established([yaml.safe_load(path.read_text())["metadata"]["name"] for path in files], timeout)

    def wait_established(self, crds: list[str], timeout: float = 120.0) -> None:
        """``kubectl wait --for=condition=Established`` on ``crds``."""
        wait = ["wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *[f"crd/{n}" for n in crds]]
        self.kubectl(*wait, timeout=timeout + 10)

    def during_startup(self, timestamp: str, margin: float = 2.0) -> bool:
        """Whether an audit timestamp falls in a kube-apiserver start (spawn to /readyz, plus ``margin`` s)."""
        when = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        return any(start <= when <= ready + dt.timedelta(seconds=margin) for start, ready in self.startup_windows)

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log so far (every call a service account made), oldest first."""
        events: list[dict[str, Any]] = []
        for path in sorted(self.workdir.glob("audit*.log"), key=lambda p: p.stat().st_mtime):
            for line in path.read_text(errors="replace").splitlines():
                if line.strip():
                    events.append(json.loads(line))
        return events
