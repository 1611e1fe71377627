"""The chart on a real control plane: what the real tiers build once, and the chart's webhooks as its pods.

- :func:`prepare` builds or fetches, once per process, what every real tier needs: the control
  plane binaries (``kit/stack/kube``), the upstream CRDs, ``helm``, and (for the ``pod`` runner)
  the image built from the ``Dockerfile``. A missing prerequisite is kept as
  :attr:`Prepared.missing` (the tests skip on it locally and fail under ``CI=true``), anything that
  ran and failed as :attr:`Prepared.error`.
- :func:`start_control_plane`: etcd, kube-apiserver and kube-controller-manager with the CRDs.
- :class:`Stack`: the chart installed with ``helm`` on that API server, its webhooks run as the
  chart's pods (``SLIME_REAL_RUNNER=pod``, the default and what CI runs) or as local processes
  (``process``: the inner loop, no image rebuild after each change).
- :func:`start_stack`: the real-Kubernetes tier's stack (the chart with a mapping and authenticated
  admission on a seeded management cluster); :func:`send_review` forges a review straight to a pod.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.components import crds
from testbed.components.controlplane import ControlPlane, ControlPlaneBinaries, binaries
from testbed.components.image import build_image
from testbed.components.pods import Completed, Pod, run_pod, run_process, run_process_to_completion, run_to_completion
from testbed.components.release import Release, tier_values
from testbed.framework.cluster import Cluster, KubeClient
from testbed.framework.errors import ApiCallFailed, ComponentUnavailable
from testbed.framework.helm import helm_binary
from testbed.framework.metrics import samples
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment
from testbed.framework.prerequisites import unavailable
from testbed.framework.progress import Progress
from testbed.framework.wait import waiter
from testbed.framework.world import SlurmCluster, ensure_namespace, seed_capm3_identity, seed_nodeport, seed_slinky

RUNNER = os.environ.get("SLIME_REAL_RUNNER", "pod")  # "pod": the image with podman (CI); "process": local processes
MIRROR, MD_NAMESPACE, MD_NAME, MD_START = "mirror-a", "metal3", "md-a", 2
CLUSTER = "bm-cluster"
TRANSIENT = (ApiCallFailed, httpx.HTTPError)  # an API server restarting answers 429 or not at all for a moment


@dataclass
class Prepared:
    binaries: ControlPlaneBinaries | None = None
    crds: list[Path] = field(default_factory=list)
    image: str = ""
    missing: str = ""  # a prerequisite is missing (skip locally, fail in CI)
    error: str = ""  # something ran and failed
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.binaries is not None or bool(self.missing or self.error)


PREPARED = Prepared()


_PREPARING = threading.Lock()


def prepare(progress: Progress) -> Prepared:
    """Build or fetch what a real tier needs (once per process; a second caller waits for the first); never raises,
    the outcome is in the result."""
    with _PREPARING:
        if not PREPARED.done:
            _prepare(progress)
    return PREPARED


def _prepare(progress: Progress) -> None:
    started = time.monotonic()
    try:
        PREPARED.binaries = binaries(progress)
        PREPARED.crds = crds.crd_files(progress)
        helm_binary()
        if RUNNER == "pod":
            PREPARED.image = build_image(progress)
    except ComponentUnavailable as exc:
        PREPARED.missing = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported by every user of the tier
        PREPARED.error = f"{type(exc).__name__}: {exc}"
    PREPARED.seconds = time.monotonic() - started
    state = PREPARED.missing or PREPARED.error or "ready"
    source = PREPARED.binaries.source if PREPARED.binaries else "no control plane"
    progress(f"prerequisites {state} after {PREPARED.seconds:.0f} s ({source}; runner {RUNNER})")


def prepared() -> Prepared:
    """:data:`PREPARED`, or the test stops: skipped (locally) or failed (CI) when it could not be had."""
    if PREPARED.missing:
        unavailable(PREPARED.missing)
    if PREPARED.error:
        pytest.fail(f"preparing the real-Kubernetes tier failed: {PREPARED.error}", pytrace=False)
    assert PREPARED.binaries is not None, "the real tiers' preparation did not run"
    return PREPARED


def image() -> str:
    """The image the chart's pods run (a tag no runner pulls when the webhooks run as processes)."""
    return PREPARED.image or "localhost/slime:process"


def start_control_plane(
    workdir: Path, admission_config: Path | None = None, audit_scale_steps: bool = False
) -> ControlPlane:
    """A control plane with the upstream CRDs (once :func:`prepare` succeeded)."""
    found = prepared()
    assert found.binaries is not None
    cp = ControlPlane(workdir, found.binaries, admission_config=admission_config, audit_scale_steps=audit_scale_steps)
    try:
        cp.start()
        cp.install_crds(found.crds)
    except Exception:
        cp.stop()
        raise
    return cp


@dataclass
class Stack:
    """The chart installed on a real API server, its webhooks running as pods (or processes), Slinky seeded."""

    cp: ControlPlane
    release: Release
    slurm: SlurmCluster
    workdir: Path
    pods: dict[str, Pod] = field(default_factory=dict)
    contexts: dict[bool, Any] = field(default_factory=dict)  # TLS contexts, read once: the API server may be down later
    runner: str = RUNNER

    def __post_init__(self) -> None:
        self.wait_for = waiter(interval=0.1, diagnostics=self.pod_tails, retry_on=TRANSIENT)

    @property
    def api(self) -> KubeClient:
        return self.cp.api

    @property
    def namespace(self) -> str:
        return self.release.namespace

    def start_webhook(self, component: str, **options: Any) -> Pod:
        deployment = self.release.deployment(component)
        if self.runner == "pod":
            pod = run_pod(self.cp, deployment, PREPARED.image, self.workdir / "pods", **options)
        else:
            pod = run_process(self.cp, deployment, self.workdir / "pods", **options)
        self.pods[component] = pod
        return pod

    def start_webhooks(self, **options: Any) -> None:
        for component in ("injection", "scaling"):
            self.start_webhook(component, **options)

    def run_hook(self, pod: dict[str, Any]) -> Completed:
        """A Helm hook Pod (``helm test``) run to its end, its status reported as the kubelet would."""
        if self.runner == "pod":
            return run_to_completion(self.cp, pod, PREPARED.image, self.workdir / "hooks")
        return run_process_to_completion(self.cp, pod, self.workdir / "hooks")

    def stop_webhooks(self) -> None:
        for pod in self.pods.values():
            pod.stop()
        self.pods.clear()

    def pod_tails(self, lines: int = 12) -> str:
        """The end of each webhook's log (they never hold a key)."""
        return "\n".join(
            f"--- {name} ---\n" + "\n".join(pod.logs().splitlines()[-lines:]) for name, pod in self.pods.items()
        )

    def md_replicas(self) -> int | None:
        md = self.api.get("cluster.x-k8s.io/v1beta2", "MachineDeployment", MD_NAMESPACE, MD_NAME)
        return None if md is None else md["spec"].get("replicas")

    def mirror(self) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.api.get("apps/v1", "Deployment", self.namespace, MIRROR)
        return found


def seed_management_cluster(
    api: Cluster, host_ip: str = "192.0.2.10", node_port: int = 30817, capm3_identity: bool = True
) -> SlurmCluster:
    """Slinky (Controller, slurmctld StatefulSet and pod with a hostIP, the key Secrets), a NodePort for slurmctld, and
    (``capm3_identity``) CAPM3's ServiceAccount with the Secret rights its role grants."""
    slurm = seed_slinky(api, host_ip=host_ip, complete_refs=True)
    seed_nodeport(api, slurm.namespace, slurm.controller, node_port=node_port)
    if capm3_identity:
        seed_capm3_identity(api)  # the tiers create metaData Secrets as CAPM3's ServiceAccount, as CAPM3 does
    return slurm


def story_mapping() -> list[dict[str, Any]]:
    """The real-Kubernetes tier's one mapping: ``mirror-a`` -> ``metal3/md-a`` on partition ``batch``."""
    return [
        {
            "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
            "machineDeployment": {"name": MD_NAME, "namespace": MD_NAMESPACE},
            "partition": "batch",
            "maxReplicas": 10,
        }
    ]


def start_stack(workdir: Path) -> Stack:
    """The chart installed with helm (chart-generated TLS, a mapping, admissionAuth), both webhooks as the chart's pods.

    Then kube-apiserver is restarted with ``--admission-control-config-file`` handing it the
    chart-generated client certificate, as docs/install.md tells an operator to.
    """
    cp = start_control_plane(workdir / "control-plane")
    try:
        for namespace in (MD_NAMESPACE, "slurm"):
            ensure_namespace(cp.api, namespace)
        slurm = seed_management_cluster(cp.api)
        md = machine_deployment(MD_NAME, MD_NAMESPACE, replicas=MD_START, version="v1beta2", cluster=CLUSTER, full=True)
        cp.api.create(md)
        release = Release(cp, SLIME_NAMESPACE, tier_values(image(), story_mapping()), workdir)
        release.install()
        cp.restart_apiserver(release.admission_configuration(workdir / "admission"))
        stack = Stack(cp, release, slurm, workdir)
        stack.start_webhooks()
    except Exception:
        cp.stop()
        raise
    return stack


def client_context(stack: Stack, with_certificate: bool = True) -> ssl.SSLContext:
    """TLS as kube-apiserver calls a webhook: trust the chart's CA bundle, present the chart's client certificate."""
    tls = stack.release.secret_data(stack.release.service_name("injection") + "-tls")
    context = ssl.create_default_context(cadata=tls["ca.crt"].decode())
    # Dialled at 127.0.0.1; the certificate names <svc>.<ns>.svc (the chain is still verified).
    context.check_hostname = False
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
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": str(uuid.uuid4()), **request},
    }
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
    for labels, value in samples(cp.api.metrics(), "apiserver_admission_webhook_request_total"):
        if labels.get("name") == webhook:
            calls[labels["code"]] = calls.get(labels["code"], 0.0) + value
    return calls
