"""The real-Kubernetes tier's story (issue 12): the one-time build, the tier's stack, and forged reviews.

The build (control plane from ``kit/stack/``, CRDs, the image, Debian packages) takes minutes when
nothing is cached, so the tiers run :func:`prepare` from ``pytest_collection_finish``, outside
every test's timeout. A missing prerequisite becomes each test's one-line skip reason locally and
its failure under ``CI=true`` (:func:`testbed.real.prerequisites.unavailable`).

``SLIME_REAL_RUNNER=process`` runs the webhooks as local processes instead of podman pods (the
inner loop; the default, and what CI runs, is ``pod``).
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.real import tier
from testbed.real.controlplane import ControlPlane
from testbed.real.objects import RealApi
from testbed.real.prerequisites import unavailable
from testbed.real.release import Release, tier_values
from testbed.real.tier import PREPARED, RUNNER, Prepared, seed_management_cluster
from testbed.world import SLIME_NAMESPACE, ensure_namespace, machine_deployment

__all__ = ["PREPARED", "RUNNER", "Prepared", "seed_management_cluster"]

MIRROR, MD_NAMESPACE, MD_NAME, MD_START = "mirror-a", "metal3", "md-a", 2
CLUSTER = "bm-cluster"


def progress_writer(config: pytest.Config, tier_name: str = "real_k8s") -> Callable[[str], None]:
    """Progress lines on the terminal, even under pytest's output capture."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def write(line: str) -> None:
        text = f"[slime {tier_name}] {line}"
        if reporter is not None and capman is not None:
            with capman.global_and_fixture_disabled():
                reporter.write_line(text)
        else:
            print(text, flush=True)

    return write


def prepare(progress: Callable[[str], None]) -> None:
    """Build or fetch what the tier needs (once per session; the whole-loop tier calls it too)."""
    tier.prepare(progress)


def prepared() -> Prepared:
    if PREPARED.missing:
        unavailable(PREPARED.missing)
    if PREPARED.error:
        pytest.fail(f"preparing the real-Kubernetes tier failed: {PREPARED.error}", pytrace=False)
    assert PREPARED.binaries is not None, "pytest_collection_finish did not run"
    return PREPARED


def start_control_plane(workdir: Path, admission_config: Path | None = None) -> ControlPlane:
    prepared()
    return tier.start_control_plane(workdir, admission_config)


@dataclass
class Stack(tier.Stack):
    """The tier's stack, with the story's mirror and MachineDeployment at hand."""

    def md_replicas(self) -> int | None:
        md = self.api.get("cluster.x-k8s.io/v1beta2", "MachineDeployment", MD_NAMESPACE, MD_NAME)
        return None if md is None else md["spec"].get("replicas")

    def mirror(self) -> dict[str, Any] | None:
        return self.api.get("apps/v1", "Deployment", self.namespace, MIRROR)


def start_stack(workdir: Path) -> Stack:
    """The chart installed with helm (chart-generated TLS, a mapping, admissionAuth), both webhooks as the chart's pods.

    Then kube-apiserver is restarted with ``--admission-control-config-file`` handing it the
    chart-generated client certificate, as docs/install.md tells an operator to.
    """
    cp = start_control_plane(workdir / "control-plane")
    try:
        api = RealApi(cp)
        for namespace in (MD_NAMESPACE, "slurm"):
            ensure_namespace(api, namespace)
        slurm = seed_management_cluster(api)
        api.create(
            machine_deployment(MD_NAME, MD_NAMESPACE, replicas=MD_START, version="v1beta2", cluster=CLUSTER, full=True)
        )
        values = tier_values(
            PREPARED.image or "localhost/slime:process",
            [
                {
                    "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
                    "machineDeployment": {"name": MD_NAME, "namespace": MD_NAMESPACE},
                    "partition": "batch",
                    "maxReplicas": 10,
                }
            ],
        )
        release = Release(cp, SLIME_NAMESPACE, values, workdir)
        release.install()
        cp.restart_apiserver(release.admission_configuration(workdir / "admission"))
        stack = Stack(cp, release, api, slurm, workdir)
        for component in ("injection", "scaling"):
            stack.start_webhook(component)
    except Exception:
        cp.stop()
        raise
    return stack


def client_context(stack: Stack, with_certificate: bool = True) -> ssl.SSLContext:
    """TLS as kube-apiserver calls a webhook: trust the chart's CA bundle, present the chart's client certificate."""
    tls = stack.release.secret_data(stack.release.service_name("injection") + "-tls")
    context = ssl.create_default_context(cadata=tls["ca.crt"].decode())
    context.check_hostname = (
        False  # dialled at 127.0.0.1; the certificate names <svc>.<ns>.svc (the chain is still verified)
    )
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
    for line in cp.metrics().splitlines():
        if line.startswith("apiserver_admission_webhook_request_total{") and f'name="{webhook}"' in line:
            code = line.split('code="', 1)[1].split('"', 1)[0]
            calls[code] = calls.get(code, 0.0) + float(line.rsplit(" ", 1)[1])
    return calls
