"""The real-Kubernetes tier (issue 12): fixtures, and the one-time build before any test runs.

The build (control plane from ``stack/``, CRDs, the image, Debian packages) takes minutes when
nothing is cached, so it runs in ``pytest_collection_finish``, outside every test's timeout,
and only when a ``real_k8s`` test was selected. Its progress lines go to the terminal even under
output capture. A missing prerequisite becomes each test's one-line skip reason locally and its
failure under ``CI=true`` (:func:`testbed.real.prerequisites.unavailable`).

``SLIME_REAL_RUNNER=process`` runs the webhooks as local processes instead of podman pods (the
inner loop; the default, and what CI runs, is ``pod``).
"""

from __future__ import annotations

import os
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.helm import HelmUnavailable, helm_binary
from testbed.real.build import BuildUnavailable, ControlPlaneBinaries, control_plane_binaries, crd_files
from testbed.real.controlplane import ControlPlane, ControlPlaneError
from testbed.real.debian import PackagesUnavailable
from testbed.real.image import build_image
from testbed.real.objects import RealApi
from testbed.real.pods import Pod, run_pod, run_process
from testbed.real.prerequisites import unavailable
from testbed.real.release import Release, tier_values
from testbed.world import SLIME_NAMESPACE, SlurmCluster, ensure_namespace, seed_nodeport, seed_slinky

RUNNER = os.environ.get("SLIME_REAL_RUNNER", "pod")
MIRROR, MD_NAMESPACE, MD_NAME, MD_START = "mirror-a", "metal3", "md-a", 2
CLUSTER = "bm-cluster"


@dataclass
class Prepared:
    binaries: ControlPlaneBinaries | None = None
    crds: list[Path] = field(default_factory=list)
    image: str = ""
    missing: str = ""  # a prerequisite is missing (skip locally, fail in CI)
    error: str = ""  # something ran and failed
    seconds: float = 0.0


PREPARED = Prepared()


def _progress_writer(config: pytest.Config, tier: str = "real_k8s") -> Callable[[str], None]:
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def write(line: str) -> None:
        text = f"[slime {tier}] {line}"
        if reporter is not None and capman is not None:
            with capman.global_and_fixture_disabled():
                reporter.write_line(text)
        else:
            print(text, flush=True)

    return write


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("real_k8s") for item in session.items):
        return
    prepare(_progress_writer(session.config))


def prepare(progress: Callable[[str], None]) -> None:
    """Build or fetch what the tier needs (once per session; the whole-loop tier calls it too)."""
    if PREPARED.binaries is not None or PREPARED.missing or PREPARED.error:
        return
    started = time.monotonic()
    try:
        PREPARED.binaries = control_plane_binaries(progress)
        PREPARED.crds = crd_files(progress)
        helm_binary()
        if RUNNER == "pod":
            PREPARED.image = build_image(progress)
    except (BuildUnavailable, PackagesUnavailable, HelmUnavailable) as exc:
        PREPARED.missing = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported by every test of the tier
        PREPARED.error = f"{type(exc).__name__}: {exc}"
    PREPARED.seconds = time.monotonic() - started
    state = PREPARED.missing or PREPARED.error or "ready"
    progress(f"prerequisites {state} after {PREPARED.seconds:.0f} s "
             f"({PREPARED.binaries.source if PREPARED.binaries else 'no control plane'}; runner {RUNNER})")


def prepared() -> Prepared:
    if PREPARED.missing:
        unavailable(PREPARED.missing)
    if PREPARED.error:
        pytest.fail(f"preparing the real-Kubernetes tier failed: {PREPARED.error}", pytrace=False)
    assert PREPARED.binaries is not None, "pytest_collection_finish did not run"
    return PREPARED


def start_control_plane(workdir: Path, admission_config: Path | None = None) -> ControlPlane:
    ready = prepared()
    assert ready.binaries is not None
    cp = ControlPlane(workdir, ready.binaries, admission_config=admission_config)
    try:
        cp.start()
        cp.install_crds(ready.crds)
    except Exception:
        cp.stop()
        raise
    return cp


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own, with the upstream CRDs and no webhooks."""
    cp = start_control_plane(tmp_path_factory.mktemp("control-plane"))
    yield cp
    cp.stop()


@dataclass
class Stack:
    """The chart installed on a real API server, its webhooks running as pods, the world seeded."""

    cp: ControlPlane
    release: Release
    api: RealApi
    slurm: SlurmCluster
    workdir: Path
    pods: dict[str, Pod] = field(default_factory=dict)
    contexts: dict[bool, ssl.SSLContext] = field(default_factory=dict)  # read once: the API server may be down later

    @property
    def namespace(self) -> str:
        return self.release.namespace

    def start_webhook(self, component: str) -> Pod:
        deployment = self.release.deployment(component)
        if RUNNER == "pod":
            pod = run_pod(self.cp, deployment, PREPARED.image, self.workdir / "pods")
        else:
            pod = run_process(self.cp, deployment, self.workdir / "pods")
        self.pods[component] = pod
        return pod

    def stop_webhooks(self) -> None:
        for pod in self.pods.values():
            pod.stop()
        self.pods.clear()

    def md_replicas(self) -> int | None:
        md = self.api.get("cluster.x-k8s.io/v1beta2", "MachineDeployment", MD_NAMESPACE, MD_NAME)
        return None if md is None else md["spec"].get("replicas")

    def mirror(self) -> dict[str, Any] | None:
        return self.api.get("apps/v1", "Deployment", self.namespace, MIRROR)

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait for ``condition``; a timeout shows the end of each webhook's log (they never hold a key)."""
        try:
            self.cp.wait_for(condition, timeout, what)
        except ControlPlaneError as exc:
            tails = "\n".join(f"--- {name} ---\n" + "\n".join(pod.logs().splitlines()[-12:]) for name, pod in self.pods.items())
            raise ControlPlaneError(f"{exc}\n{tails}") from None


def seed_management_cluster(api: RealApi, cp: ControlPlane) -> SlurmCluster:
    """Slinky (Controller, slurmctld StatefulSet and pod with a hostIP, the slurm.key Secret, a NodePort)."""
    slurm = seed_slinky(api)
    seed_nodeport(api, slurm.namespace, slurm.controller)
    return slurm


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The chart installed with helm (chart-generated TLS, a mapping, admissionAuth), both webhooks as the chart's pods.

    Then kube-apiserver is restarted with ``--admission-control-config-file`` handing it the
    chart-generated client certificate, as docs/install.md tells an operator to.
    """
    from testbed.world import machine_deployment

    workdir = tmp_path_factory.mktemp("stack")
    cp = start_control_plane(workdir / "control-plane")
    try:
        api = RealApi(cp)
        for namespace in (MD_NAMESPACE, "slurm"):
            ensure_namespace(api, namespace)
        slurm = seed_management_cluster(api, cp)
        api.create(machine_deployment(MD_NAME, MD_NAMESPACE, replicas=MD_START, version="v1beta2", cluster=CLUSTER, full=True))
        values = tier_values(PREPARED.image or "localhost/slime:process", [
            {"mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
             "machineDeployment": {"name": MD_NAME, "namespace": MD_NAMESPACE}, "partition": "batch"}])
        release = Release(cp, SLIME_NAMESPACE, values, workdir)
        release.install()
        cp.restart_apiserver(release.admission_configuration(workdir / "admission"))
        stack = Stack(cp, release, api, slurm, workdir)
        for component in ("injection", "scaling"):
            stack.start_webhook(component)
    except Exception:
        cp.stop()
        raise
    yield stack
    stack.stop_webhooks()
    cp.stop()


def client_context(stack: Stack, with_certificate: bool = True) -> ssl.SSLContext:
    """TLS as kube-apiserver calls a webhook: trust the chart's CA bundle, present the chart's client certificate."""
    tls = stack.release.secret_data(stack.release.service_name("injection") + "-tls")
    context = ssl.create_default_context(cadata=tls["ca.crt"].decode())
    context.check_hostname = False  # dialled at 127.0.0.1; the certificate names <svc>.<ns>.svc (the chain is still verified)
    if with_certificate:
        client = stack.release.client_certificate()
        directory = stack.workdir / "client"
        directory.mkdir(exist_ok=True)
        (directory / "tls.crt").write_bytes(client["tls.crt"])
        key = directory / "tls.key"
        key.write_bytes(client["tls.key"])
        key.chmod(0o600)
        context.load_cert_chain(str(directory / "tls.crt"), str(key))
    return context


def send_review(stack: Stack, component: str, request: dict[str, Any], with_certificate: bool = True) -> dict[str, Any]:
    """POST one AdmissionReview straight to a webhook pod (not through the API server): a forged review."""
    path = "/mutate" if component == "injection" else "/validate"
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": str(uuid.uuid4()), **request}}
    if with_certificate not in stack.contexts:
        stack.contexts[with_certificate] = client_context(stack, with_certificate)
    with httpx.Client(verify=stack.contexts[with_certificate], timeout=10) as client:
        answer = client.post(f"https://127.0.0.1:{stack.release.port(component)}{path}", json=body)
    answer.raise_for_status()
    response: dict[str, Any] = answer.json()["response"]
    return response


def apiserver_webhook_calls(cp: ControlPlane, webhook: str) -> dict[str, float]:
    """``apiserver_admission_webhook_request_total`` of one webhook by HTTP code (what kube-apiserver got back)."""
    calls: dict[str, float] = {}
    for line in cp.metrics().splitlines():
        if line.startswith("apiserver_admission_webhook_request_total{") and f'name="{webhook}"' in line:
            code = line.split('code="', 1)[1].split('"', 1)[0]
            calls[code] = calls.get(code, 0.0) + float(line.rsplit(" ", 1)[1])
    return calls
