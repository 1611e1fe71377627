"""Real cert-manager for the whole-loop tier: its controller and cainjector, built from ``stack/certmanager``, run
out of cluster.

**Build.** ``stack/certmanager`` requires ``github.com/cert-manager/cert-manager`` at one release and
has two small mains of ours over its exported packages (upstream's ``cmd/controller`` and
``cmd/cainjector`` are nested modules with a relative replace that the Go module proxy does not
serve; ``stack/README.md`` says why and what the mains leave out). :func:`build` builds both once
with :func:`testbed.framework.gobuild.go_build` (cached by version and hash, progress lines, the
machine-wide heavy-build lock). The CRDs are read from the same release's module zip
(``deploy/crds``, what the release's Helm chart templates its CRDs from), fetched by
``go mod download -json``.

**Run.** :class:`CertManager` starts both against the tier's API server with a kubeconfig of their
own (a client certificate in ``system:masters``: cert-manager's chart RBAC is not what is under
test here), without leader election, with ``--cluster-resource-namespace``, and with their only
listeners (controller metrics; cainjector health probes) on 127.0.0.1; the cainjector's metrics
are off. cert-manager's own webhook is not run, so nothing defaults or validates the
cert-manager resources beyond their CRD schemas (see ``docs/testing.md``). Each process logs to a
file in the work directory and is stopped by its PID.

Also here: what a person would do with ``cmctl`` (:func:`renew`, :func:`certificate_ready`) and
the serial a TLS server presents (:func:`served_serial`).
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509

from testbed.components.controlplane import ControlPlane, ControlPlaneError
from testbed.framework.cluster import resource_path
from testbed.framework.gobuild import files_in, go_build, module_dir
from testbed.framework.pins import CERT_MANAGER
from testbed.framework.ports import free_port
from testbed.framework.processes import spawn, stop_process, tail, wait_started
from testbed.framework.progress import Progress, to_stderr

MODULE = CERT_MANAGER.path
BINARIES = {
    "cert-manager-controller": "./cmd/cert-manager-controller",
    "cert-manager-cainjector": "./cmd/cert-manager-cainjector",
}
CRDS = (
    "cert-manager.io_certificates.yaml",
    "cert-manager.io_certificaterequests.yaml",
    "cert-manager.io_issuers.yaml",
    "cert-manager.io_clusterissuers.yaml",
    "acme.cert-manager.io_orders.yaml",
    "acme.cert-manager.io_challenges.yaml",
)
CLUSTER_RESOURCE_NAMESPACE = "cert-manager"


@dataclass(frozen=True)
class CertManagerBuild:
    version: str
    controller: Path
    cainjector: Path
    crds: list[Path]


def build(progress: Progress = to_stderr) -> CertManagerBuild:
    """Both binaries (built once, cached) and the release's CRD files."""
    version = CERT_MANAGER.version
    # The version stamp cert-manager puts in its User-Agent and logs (upstream's release builds set it the same way).
    ldflags = f"-X {MODULE}/pkg/util.AppVersion={version} -X {MODULE}/pkg/util.AppGitState=clean"
    binaries = go_build("certmanager", "certmanager", version, BINARIES, ldflags, progress)
    crds = files_in(module_dir(CERT_MANAGER) / "deploy" / "crds", CRDS, CERT_MANAGER.at)
    return CertManagerBuild(version, binaries["cert-manager-controller"], binaries["cert-manager-cainjector"], crds)


@dataclass
class CertManager:
    """cert-manager's controller and cainjector, out of cluster, against ``cp``."""

    cp: ControlPlane
    built: CertManagerBuild
    workdir: Path
    cluster_resource_namespace: str = CLUSTER_RESOURCE_NAMESPACE
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def _kubeconfig(self, user: str) -> Path:
        """A client certificate in ``system:masters``: cert-manager's chart RBAC is not what is under test here."""
        return self.cp.user_credentials(user, "system:masters").write_kubeconfig(self.workdir / f"{user}.kubeconfig")

    def start(self, timeout: float | str = "controller-start") -> CertManager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        namespace = self.cluster_resource_namespace
        if self.cp.api.get("v1", "Namespace", "", namespace) is None:
            self.cp.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        controller = [
            str(self.built.controller),
            f"--kubeconfig={self._kubeconfig('cert-manager-controller')}",
            f"--cluster-resource-namespace={namespace}",
            f"--metrics-listen-address=127.0.0.1:{self.metrics_port}",
            "--v=2",
        ]
        cainjector = [
            str(self.built.cainjector),
            f"--kubeconfig={self._kubeconfig('cert-manager-cainjector')}",
            "--metrics-listen-address=0",
            f"--health-probe-listen-address=127.0.0.1:{self.health_port}",
            "--v=2",
        ]
        for name, argv in (("cert-manager-controller", controller), ("cert-manager-cainjector", cainjector)):
            self.processes[name] = spawn(argv, self.workdir / f"{name}.log")
        try:
            self._started("cert-manager-controller", f"http://127.0.0.1:{self.metrics_port}/metrics", timeout)
            self._started("cert-manager-cainjector", f"http://127.0.0.1:{self.health_port}/readyz", timeout)
        except Exception:
            self.stop()
            raise
        return self

    def _started(self, name: str, url: str, timeout: float | str) -> None:
        def answers() -> bool:
            return httpx.get(url, timeout=2).status_code == 200

        log = self.workdir / f"{name}.log"
        wait_started(self.processes[name], answers, timeout, name, log, retry_on=(httpx.HTTPError,))

    def log_tail(self, name: str, lines: int = 30) -> str:
        return tail(self.workdir / f"{name}.log", lines)

    def running(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self.processes.items()}

    def stop(self) -> None:
        for name in ("cert-manager-cainjector", "cert-manager-controller"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                stop_process(proc, 10.0)


# --- what cmctl does, and what a TLS client sees ----------------------------------------------------------


def _certificate_path(namespace: str, name: str) -> str:
    return resource_path("cert-manager.io/v1", "certificates", namespace, name)


def condition(cert: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (cert.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def certificate_ready(cp: ControlPlane, namespace: str, name: str) -> bool:
    """``Ready=True`` for the Certificate's current generation (what ``cmctl status``/``kubectl wait`` look at)."""
    cert = cp.api.request("GET", _certificate_path(namespace, name))
    ready = condition(cert, "Ready")
    return bool(
        ready
        and ready.get("status") == "True"
        and ready.get("observedGeneration", cert["metadata"]["generation"]) == cert["metadata"]["generation"]
        and condition(cert, "Issuing") is None
    )


def renew(cp: ControlPlane, namespace: str, name: str) -> None:
    """``cmctl renew``: add the ``Issuing=True`` condition (reason ``ManuallyTriggered``) through the status
    subresource.

    cmctl refuses a Certificate that is already issuing; so does this. The update carries the
    resourceVersion it read, so a concurrent write by cert-manager makes it fail (409), as cmctl's.
    """
    cert = cp.api.request("GET", _certificate_path(namespace, name))
    if condition(cert, "Issuing") is not None:
        raise ControlPlaneError(f"Certificate {namespace}/{name} is already being issued")
    status = cert.setdefault("status", {})
    status.setdefault("conditions", []).append(
        {
            "type": "Issuing",
            "status": "True",
            "reason": "ManuallyTriggered",
            "message": "Certificate re-issuance manually triggered",
            "lastTransitionTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "observedGeneration": cert["metadata"]["generation"],
        }
    )
    cp.api.request("PUT", _certificate_path(namespace, name) + "/status", cert)


def secret_serial(pem: bytes) -> int:
    """The serial of the first (leaf) certificate of a PEM bundle."""
    return x509.load_pem_x509_certificate(pem).serial_number


def served_serial(port: int, context: ssl.SSLContext, timeout: float = 5.0) -> int:
    """The serial of the certificate a TLS server on 127.0.0.1:``port`` presents in a fresh handshake."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock, context.wrap_socket(sock) as tls:
        der = tls.getpeercert(binary_form=True)
    if der is None:
        raise ssl.SSLError("the server presented no certificate")
    return x509.load_der_x509_certificate(der).serial_number


if __name__ == "__main__":  # python -m testbed.components.certmanager: build (or find) it, say where
    started = time.monotonic()
    found = build()
    to_stderr(f"cert-manager {found.version}: {found.controller}, {found.cainjector}; CRDs in {found.crds[0].parent}")
    to_stderr(f"ready in {time.monotonic() - started:.0f} s")
