"""A real control plane on 127.0.0.1: etcd, kube-apiserver and kube-controller-manager, as envtest runs them.

- **etcd** on two random loopback ports (client, peer), data in the work directory, no fsync.
- **kube-apiserver** on a random loopback port with TLS (a serving certificate for 127.0.0.1 and
  ``localhost``), client certificates from a CA of its own (an admin in ``system:masters``, as
  envtest's), RBAC authorization, service-account token signing (issuer
  ``https://127.0.0.1:<port>``, so TokenRequest works), an audit log of every call made by a
  service account (``audit.log``: the tier reads each webhook's calls and their answers from it),
  the aggregation layer's flags (a front-proxy CA of its own for ``--requestheader-client-ca-file``,
  the ``front-proxy-client`` certificate it presents to an extension API server such as KEDA's
  metrics adapter; ``--enable-aggregator-routing`` stays off: it would dial Endpoints, and
  Endpoints cannot hold loopback addresses, so an ``APIService`` is routed like a webhook, through
  an ``ExternalName: localhost`` Service), and optionally an ``--admission-control-config-file``.
- **kube-controller-manager** (when there is a binary) with the deployment, replicaset,
  garbage-collector, namespace and service-account controllers, the root-CA publisher, and the
  horizontal-pod-autoscaler controller (KEDA's HPAs; synced every :data:`HPA_SYNC_SECONDS` s).

Each process logs to ``<name>.log`` in the work directory and is stopped by its PID. The API
server and etcd can be killed and started again on the same ports and data (:meth:`ControlPlane.kill`,
:meth:`ControlPlane.start_apiserver`, :meth:`ControlPlane.start_etcd`): what a crash and a restart
look like to clients. ``slime-control-plane`` (:func:`testbed.real.cli.main`) starts the same thing
for a person.
"""

from __future__ import annotations

import atexit
import base64
import datetime as dt
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.errors import ComponentFailed
from testbed.ports import free_port
from testbed.processes import stop_process
from testbed.real.build import ControlPlaneBinaries

# KCM's controllers (names as of 1.33+, which end in -controller): what Deployments, garbage
# collection, namespace deletion and the ServiceAccount admission plugin need. No scheduler and
# no kubelet: pods stay Pending, which the tier never needs otherwise.
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

_LIVE: dict[int, subprocess.Popen[bytes]] = {}  # every process started here, by PID, stopped at exit


@atexit.register
def _stop_leftovers() -> None:
    for proc in list(_LIVE.values()):
        _stop(proc, 2.0)


def _stop(proc: subprocess.Popen[bytes], grace: float, sig: int = signal.SIGTERM) -> None:
    """Stop one process we started, by its PID: ``sig``, then SIGKILL after ``grace`` seconds."""
    stop_process(proc, grace, sig)
    _LIVE.pop(proc.pid, None)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ControlPlaneError(ComponentFailed):
    """A component did not start or answer; the message carries the end of its log."""


# --- PKI ---------------------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


@dataclass(frozen=True)
class Ca:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, common_name: str) -> Ca:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5))
            .not_valid_after(_now() + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    def issue(
        self,
        common_name: str,
        organization: str = "",
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client_too: bool = False,
    ) -> tuple[bytes, bytes]:
        """A (certificate, key) PEM pair signed by this CA: a client certificate, or a serving one with SANs
        (``client_too``: both)."""
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        if client_too or not server:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5))
            .not_valid_after(_now() + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if dns or ips:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return _pem_cert(builder.sign(self.key, hashes.SHA256())), _pem_key(key)


def kubeconfig(
    server: str,
    ca_pem: bytes,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    user: str = "user",
) -> dict[str, Any]:
    """A kubeconfig document with the credentials inline (client certificate or bearer token)."""
    credentials: dict[str, str] = {}
    if cert_pem is not None and key_pem is not None:
        credentials = {
            "client-certificate-data": base64.b64encode(cert_pem).decode(),
            "client-key-data": base64.b64encode(key_pem).decode(),
        }
    if token is not None:
        credentials["token"] = token
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "real",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": user}}],
        "current-context": "real",
    }


# --- the control plane ------------------------------------------------------------------------------


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
    startup_windows: list[tuple[dt.datetime, dt.datetime]] = field(
        default_factory=list
    )  # kube-apiserver start -> /readyz

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        self.ca = Ca.create("slime-real-k8s-ca")
        self.ca_file = _write(pki / "ca.crt", _pem_cert(self.ca.cert))
        crt, key = self.ca.issue(
            "kube-apiserver", dns=("localhost", "kubernetes", "kubernetes.default.svc"), ips=("127.0.0.1",), server=True
        )
        self.serving_cert, self.serving_key = (
            _write(pki / "apiserver.crt", crt),
            _write(pki / "apiserver.key", key, private=True),
        )
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = _write(pki / "sa.key", _pem_key(sa_key), private=True)
        self.sa_pub = _write(
            pki / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )
        self.admin_cert, self.admin_key = self.ca.issue("slime-admin", organization="system:masters")
        self.kubeconfig = self._write_kubeconfig("admin.kubeconfig", self.admin_cert, self.admin_key)
        kcm_cert, kcm_key = self.ca.issue("system:kube-controller-manager")
        self.kcm_kubeconfig = self._write_kubeconfig("kcm.kubeconfig", kcm_cert, kcm_key)
        _write(pki / "admin.crt", self.admin_cert)
        _write(pki / "admin.key", self.admin_key, private=True)
        # The aggregation layer: the API server proxies to extension API servers (APIService) with
        # this client certificate; they trust it through the CA kube-apiserver publishes in
        # kube-system/extension-apiserver-authentication.
        self.front_proxy_ca = Ca.create("slime-real-k8s-front-proxy-ca")
        self.front_proxy_ca_file = _write(pki / "front-proxy-ca.crt", _pem_cert(self.front_proxy_ca.cert))
        proxy_crt, proxy_key = self.front_proxy_ca.issue(FRONT_PROXY_CLIENT)
        self.proxy_client_cert = _write(pki / "front-proxy-client.crt", proxy_crt)
        self.proxy_client_key = _write(pki / "front-proxy-client.key", proxy_key, private=True)
        self.audit_log = self.workdir / "audit.log"
        self.audit_policy = self.workdir / "audit-policy.yaml"
        policy = {
            **AUDIT_POLICY,
            "rules": [*(SCALE_STEP_RULES if self.audit_scale_steps else []), *AUDIT_POLICY["rules"]],
        }
        self.audit_policy.write_text(yaml.safe_dump(policy))

    # -- addresses and clients

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        return _pem_cert(self.ca.cert)

    def _write_kubeconfig(self, name: str, cert: bytes, key: bytes) -> Path:
        path = self.workdir / name
        _write(
            path,
            yaml.safe_dump(kubeconfig(self.url, self.ca_pem, cert, key, user=name.split(".")[0])).encode(),
            private=True,
        )
        return path

    def write_token_kubeconfig(self, path: Path, token: str, user: str) -> Path:
        """A kubeconfig for a bearer token (a service account's), trusting this API server's CA."""
        return _write(
            path, yaml.safe_dump(kubeconfig(self.url, self.ca_pem, token=token, user=user)).encode(), private=True
        )

    def http(self, timeout: float = 10.0) -> httpx.Client:
        """An admin HTTPS client (client certificate in system:masters)."""
        pki = self.workdir / "pki"
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return httpx.Client(base_url=self.url, verify=context, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
        as_user: str | None = None,
    ) -> Any:
        """One API call as the admin, or as ``as_user`` (impersonated: kube-apiserver authorizes and names that
        user)."""
        headers = {"Content-Type": content_type, **({"Impersonate-User": as_user} if as_user else {})}
        with self.http(timeout) as client:
            answer = client.request(method, path, content=None if body is None else json.dumps(body), headers=headers)
        if answer.status_code >= 300:
            raise ControlPlaneError(f"{method} {path}: {answer.status_code} {answer.text[:500]}")
        return answer.json() if answer.content else None

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

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A service-account token from the TokenRequest API (what the kubelet projects into a pod)."""
        review = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )
        token: str = review["status"]["token"]
        return token

    def metrics(self) -> str:
        with self.http() as client:
            answer = client.get("/metrics")
        answer.raise_for_status()
        return answer.text

    # -- processes

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        _LIVE[proc.pid] = proc
        self.processes[name] = proc
        return proc

    def _wait(self, name: str, probe: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        proc = self.processes[name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited {proc.returncode}:\n{_tail(self.workdir / f'{name}.log')}")
            try:
                if probe():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise ControlPlaneError(f"{name} not ready after {timeout:.0f} s:\n{_tail(self.workdir / f'{name}.log')}")

    def start_etcd(self, timeout: float = 30.0) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name",
                "default",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"default={peer}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )
        self._wait("etcd", lambda: httpx.get(f"{client}/health", timeout=2).status_code == 200, timeout)

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

    def start_apiserver(self, timeout: float = 60.0) -> None:
        started = _now()
        self._spawn("kube-apiserver", self.apiserver_args())
        self._wait("kube-apiserver", lambda: self._exists("/readyz"), timeout)
        # Until /readyz, the port is open but the RBAC authorizer's informers may not have synced
        # yet: clients that (re)connect then are refused 403 and retry. The audit reads keep these apart.
        self.startup_windows.append((started, _now()))

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

    def start(self) -> ControlPlane:
        started = time.monotonic()
        self.start_etcd()
        self.start_apiserver()
        self.start_controller_manager()
        if self.binaries.kube_controller_manager is not None:
            self.wait_for(
                lambda: self._exists("/api/v1/namespaces/default/serviceaccounts/default"),
                30,
                "the default ServiceAccount",
            )
        self.started_seconds = time.monotonic() - started
        return self

    def _exists(self, path: str) -> bool:
        with self.http(2) as client:
            return client.get(path).status_code == 200

    def wait_for(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except (httpx.HTTPError, ControlPlaneError):
                pass
            time.sleep(0.1)
        raise ControlPlaneError(f"timed out after {timeout:.0f} s waiting for {what}")

    def kill(self, name: str) -> None:
        """SIGKILL one component (``etcd``, ``kube-apiserver``, ``kube-controller-manager``): a crash."""
        proc = self.processes.get(name)
        if proc is not None:
            _stop(proc, 0.0, signal.SIGKILL)

    def restart_apiserver(self, admission_config: Path | None = None) -> None:
        """Stop the API server (SIGTERM) and start it again, with a new admission configuration if given."""
        if admission_config is not None:
            self.admission_config = admission_config
        proc = self.processes.get("kube-apiserver")
        if proc is not None:
            _stop(proc, 15.0)
        self.start_apiserver()

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                _stop(proc, 10.0)

    # -- objects

    def install_crds(self, files: list[Path], timeout: float = 120.0) -> None:
        """Apply CRD files (server-side, as large CRDs need) and wait until each is Established."""
        args = ["apply", "--server-side", "--field-manager=slime-real-k8s"]
        for path in files:
            args += ["-f", str(path)]
        self.kubectl(*args, timeout=timeout)
        names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in files]
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout)}s",
            *[f"crd/{n}" for n in names],
            timeout=timeout + 10,
        )

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
