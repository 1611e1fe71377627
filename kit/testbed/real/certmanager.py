"""Real cert-manager for the whole-loop tier: its controller and cainjector, built from ``stack/certmanager``, run
out of cluster.

**Build.** ``stack/certmanager`` requires ``github.com/cert-manager/cert-manager`` at one release and
has two small mains of ours over its exported packages (upstream's ``cmd/controller`` and
``cmd/cainjector`` are nested modules with a relative replace that the Go module proxy does not
serve; ``stack/README.md`` says why and what the mains leave out). :func:`build` builds both once
with :func:`testbed.real.build.go_build` (cached by version and hash, progress lines, the
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
import os
import re
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509

from testbed.ports import free_port
from testbed.real.build import STACK, BuildFailed, Progress, go_build, module_dir, to_stderr
from testbed.real.controlplane import _LIVE, ControlPlane, ControlPlaneError, _stop, _tail, kubeconfig

MODULE = "github.com/cert-manager/cert-manager"
STACK_MODULE = STACK / "certmanager"
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


def pinned_version() -> str:
    """The cert-manager release ``stack/certmanager/go.mod`` requires (the one place it is pinned)."""
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE)}\s+(v\S+)", (STACK_MODULE / "go.mod").read_text(), re.M)
    if not found:
        raise BuildFailed(f"{STACK_MODULE / 'go.mod'} requires no {MODULE}")
    return found.group(1)


@dataclass(frozen=True)
class CertManagerBuild:
    version: str
    controller: Path
    cainjector: Path
    crds: list[Path]


def build(progress: Progress = to_stderr) -> CertManagerBuild:
    """Both binaries (built once, cached) and the release's CRD files."""
    version = pinned_version()
    # The version stamp cert-manager puts in its User-Agent and logs (upstream's release builds set it the same way).
    ldflags = f"-X {MODULE}/pkg/util.AppVersion={version} -X {MODULE}/pkg/util.AppGitState=clean"
    binaries = go_build(STACK_MODULE, "certmanager", version, BINARIES, ldflags, progress)
    crd_dir = module_dir(MODULE, version, progress) / "deploy" / "crds"
    crds = [crd_dir / name for name in CRDS]
    missing = [str(path) for path in crds if not path.is_file()]
    if missing:
        raise BuildFailed(f"cert-manager {version}: CRD files missing from the module zip: {', '.join(missing)}")
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
        cert, key = self.cp.ca.issue(user, organization="system:masters")
        path = self.workdir / f"{user}.kubeconfig"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(yaml.safe_dump(kubeconfig(self.cp.url, self.cp.ca_pem, cert, key, user=user)))
        return path

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        _LIVE[proc.pid] = proc  # stopped at exit by PID if a test forgets
        self.processes[name] = proc

    def start(self, timeout: float = 90.0) -> CertManager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if (
            self.cp.request("GET", "/api/v1/namespaces?fieldSelector=metadata.name=" + self.cluster_resource_namespace)[
                "items"
            ]
            == []
        ):
            self.cp.request(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.cluster_resource_namespace}},
            )
        self._spawn(
            "cert-manager-controller",
            [
                str(self.built.controller),
                f"--kubeconfig={self._kubeconfig('cert-manager-controller')}",
                f"--cluster-resource-namespace={self.cluster_resource_namespace}",
                f"--metrics-listen-address=127.0.0.1:{self.metrics_port}",
                "--v=2",
            ],
        )
        self._spawn(
            "cert-manager-cainjector",
            [
                str(self.built.cainjector),
                f"--kubeconfig={self._kubeconfig('cert-manager-cainjector')}",
                "--metrics-listen-address=0",
                f"--health-probe-listen-address=127.0.0.1:{self.health_port}",
                "--v=2",
            ],
        )
        try:
            self._wait("cert-manager-controller", f"http://127.0.0.1:{self.metrics_port}/metrics", timeout)
            self._wait("cert-manager-cainjector", f"http://127.0.0.1:{self.health_port}/readyz", timeout)
        except Exception:
            self.stop()
            raise
        return self

    def _wait(self, name: str, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        proc = self.processes[name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited {proc.returncode}:\n{self.log_tail(name)}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not ready after {timeout:.0f} s ({url}):\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        return _tail(self.workdir / f"{name}.log", lines)

    def running(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self.processes.items()}

    def stop(self) -> None:
        for name in ("cert-manager-cainjector", "cert-manager-controller"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                _stop(proc, 10.0)


# --- what cmctl does, and what a TLS client sees ----------------------------------------------------------


def _certificate_path(namespace: str, name: str) -> str:
    return f"/apis/cert-manager.io/v1/namespaces/{namespace}/certificates/{name}"


def condition(cert: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (cert.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def certificate_ready(cp: ControlPlane, namespace: str, name: str) -> bool:
    """``Ready=True`` for the Certificate's current generation (what ``cmctl status``/``kubectl wait`` look at)."""
    cert = cp.request("GET", _certificate_path(namespace, name))
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
    cert = cp.request("GET", _certificate_path(namespace, name))
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
    cp.request("PUT", _certificate_path(namespace, name) + "/status", cert)


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


if __name__ == "__main__":  # python -m testbed.real.certmanager: build (or find) it, say where
    started = time.monotonic()
    found = build()
    to_stderr(f"cert-manager {found.version}: {found.controller}, {found.cainjector}; CRDs in {found.crds[0].parent}")
    to_stderr(f"ready in {time.monotonic() - started:.0f} s")
