"""cert-manager for real (issue 15, item 1): the chart's PKI issued by cert-manager's own controllers, renewed under
load.

cert-manager's controller and cainjector (built from the Go module proxy, ``stack/certmanager``)
run out of cluster against the tier's kube-apiserver; ``helm install`` uses
``certManager.enabled=true`` (and ``admissionAuth``, so the client certificate kube-apiserver
presents is cert-manager's too). The webhooks run as the chart's pods, their secret volumes laid
out and refreshed the way kubelet does (``testbed.real.pods.VolumeSync``). Everything answers
on 127.0.0.1 only.

The renewal is what ``cmctl renew`` does (the ``Issuing=True`` condition), RENEWALS times in a row on both serving
certificates at once, while a bounded loop of admissions (``testbed.real.load.Load``: creates of a CAPM3 metaData
Secret for the injection webhook, stored as CAPM3's manager and removed again; dry-run scales of the mirror for the
scaling webhook) goes
through kube-apiserver. Acceptance: no admission fails (as the client sees it, and as
kube-apiserver counts its webhook calls), and each pod serves the new serial within
RENEWAL_BOUND_SECONDS of the renewal (a generous bound, not a timing claim: the measured figures
are in docs/reliability.md; ``SLIME_REAL_CERT_MANAGER_FIGURES=/path.json`` writes them).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed.real import story as k8s
from testbed.real.certmanager import (
    CertManager,
    CertManagerBuild,
    certificate_ready,
    renew,
    secret_serial,
    served_serial,
)
from testbed.real.components import component
from testbed.real.controlplane import ControlPlane, ControlPlaneError
from testbed.real.load import WEBHOOKS, Load, failed_calls, webhook_counters
from testbed.real.objects import RealApi
from testbed.real.pods import Pod, VolumeSync, run_pod, run_process
from testbed.real.release import Release, tier_values
from testbed.world import (
    SLIME_NAMESPACE,
    ensure_namespace,
    machine_deployment,
    seed_capm3_identity,
    seed_metal3,
)

pytestmark = [pytest.mark.real_loop, pytest.mark.timeout(600)]

OPT_IN = {"slurm-controller-namespace": "slurm"}
# kubelet refreshes secret volumes on its pod sync (1 min by default); here every few seconds, so
# the figures show cert-manager's and SliMe's part. A real cluster adds up to its sync period.
VOLUME_SYNC_SECONDS = 5.0
# The acceptance bound for the new serial to be served after `cmctl renew` (issuance + volume
# refresh + the services' certificate poll, certPollSeconds=10): generous, documented, not a target.
RENEWAL_BOUND_SECONDS = 90.0
RENEWALS = 3  # one after the other, each once the previous one is served
LOAD_TAIL_SECONDS = 5.0


@dataclass
class CertStack:
    stack: k8s.Stack
    manager: CertManager
    volume_sync: VolumeSync
    metal3_data: dict[str, Any]
    certificates: dict[str, str] = field(
        default_factory=dict
    )  # role -> Certificate name (ca, injection, scaling, client-ca, client)
    setup_seconds: dict[str, float] = field(
        default_factory=dict
    )  # cert-manager start, helm install -> every Certificate Ready

    @property
    def cp(self) -> ControlPlane:
        return self.stack.cp

    @property
    def release(self) -> Release:
        return self.stack.release

    def secret_of(self, role: str) -> dict[str, bytes]:
        cert = self.cp.request(
            "GET", f"/apis/cert-manager.io/v1/namespaces/{self.stack.namespace}/certificates/{self.certificates[role]}"
        )
        return self.release.secret_data(cert["spec"]["secretName"])

    def ca_bundles(self) -> dict[str, bytes]:
        """Each webhook configuration's caBundle (all of its webhooks carry the same), by component."""
        bundles: dict[str, bytes] = {}
        for component_name, kind in (
            ("injection", "mutatingwebhookconfigurations"),
            ("scaling", "validatingwebhookconfigurations"),
        ):
            obj = self.cp.request(
                "GET", f"/apis/admissionregistration.k8s.io/v1/{kind}/{self.release.service_name(component_name)}"
            )
            found = {base64.b64decode(w["clientConfig"].get("caBundle") or "") for w in obj["webhooks"]}
            assert len(found) == 1, f"{kind}: the webhooks carry different caBundles"
            bundles[component_name] = found.pop()
        return bundles

    def tls_context(self) -> ssl.SSLContext:
        return k8s.client_context(self.stack)


def _roles(release: Release) -> dict[str, str]:
    """The chart's Certificates by role: the CA, one serving certificate per webhook, the client CA and certificate."""
    roles: dict[str, str] = {}
    for cert in release.certificates():
        spec, labels = cert["spec"], cert["metadata"].get("labels", {})
        role = labels.get("app.kubernetes.io/component", "")
        if role in ("injection-webhook", "scaling-webhook"):
            roles[role.removesuffix("-webhook")] = cert["metadata"]["name"]
        elif role == "admission-auth":
            roles["client-ca" if spec.get("isCA") else "client"] = cert["metadata"]["name"]
        elif spec.get("isCA"):
            roles["ca"] = cert["metadata"]["name"]
    return roles


def _start_pod(cp: ControlPlane, release: Release, component_name: str, workdir: Path) -> Pod:
    deployment = release.deployment(component_name)
    if k8s.RUNNER == "pod":
        return run_pod(cp, deployment, k8s.PREPARED.image, workdir / "pods", kubelet_volumes=True)
    return run_process(cp, deployment, workdir / "pods", kubelet_volumes=True)


@pytest.fixture(scope="module")
def cm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CertStack]:
    """Control plane + cert-manager, the chart installed with certManager.enabled=true, both webhooks as pods."""
    built: CertManagerBuild = component("cert-manager")
    workdir = tmp_path_factory.mktemp("cert-manager")
    cp = k8s.start_control_plane(workdir / "control-plane")
    manager: CertManager | None = None
    pods: list[Pod] = []
    try:
        cp.install_crds(built.crds)
        started = time.monotonic()
        manager = CertManager(cp, built, workdir / "cert-manager").start()
        setup = {"cert_manager_start": time.monotonic() - started}
        api = RealApi(cp)
        for namespace in (k8s.MD_NAMESPACE, "slurm"):
            ensure_namespace(api, namespace)
        slurm = k8s.seed_management_cluster(api)
        api.create(
            machine_deployment(
                k8s.MD_NAME, k8s.MD_NAMESPACE, replicas=k8s.MD_START, version="v1beta2", cluster=k8s.CLUSTER, full=True
            )
        )
        _, data = seed_metal3(api, template_labels=OPT_IN, index=40)
        seed_capm3_identity(api)  # the load creates metaData Secrets as CAPM3's manager does
        values = tier_values(
            k8s.PREPARED.image or "localhost/slime:process",
            [
                {
                    "mirror": {"name": k8s.MIRROR, "namespace": SLIME_NAMESPACE},
                    "machineDeployment": {"name": k8s.MD_NAME, "namespace": k8s.MD_NAMESPACE},
                    "partition": "batch",
                    "maxReplicas": 10,
                }
            ],
            certManager={"enabled": True},
        )
        release = Release(cp, SLIME_NAMESPACE, values, workdir)
        started = time.monotonic()
        release.install()
        roles = _roles(release)
        assert set(roles) == {"ca", "injection", "scaling", "client-ca", "client"}, roles
        for name in roles.values():
            try:
                cp.wait_for(
                    lambda name=name: certificate_ready(cp, SLIME_NAMESPACE, name), 120, f"Certificate {name} Ready"
                )
            except ControlPlaneError as exc:
                raise ControlPlaneError(
                    f"{exc}\n--- cert-manager-controller ---\n{manager.log_tail('cert-manager-controller')}"
                ) from None
        setup["install_to_all_ready"] = time.monotonic() - started
        # kube-apiserver gets the client certificate cert-manager issued (docs/install.md "Authenticated admission").
        cp.restart_apiserver(release.admission_configuration(workdir / "admission"))
        # /readyz comes before each custom resource's storage is initialized: until then it answers 429.
        for resource in ("certificates", "issuers", "certificaterequests"):
            cp.wait_for(
                lambda resource=resource: (
                    cp.request("GET", f"/apis/cert-manager.io/v1/namespaces/{SLIME_NAMESPACE}/{resource}") is not None
                ),
                60,
                f"cert-manager.io {resource} served again after the API server restart",
            )
        stack = k8s.Stack(cp, release, api, slurm, workdir)
        for component_name in ("injection", "scaling"):
            stack.pods[component_name] = _start_pod(cp, release, component_name, workdir)
            pods.append(stack.pods[component_name])
        with VolumeSync(cp, pods, VOLUME_SYNC_SECONDS) as sync:
            yield CertStack(stack, manager, sync, data, roles, setup)
    finally:
        for pod in pods:
            pod.stop()
        if manager is not None:
            manager.stop()
        cp.stop()


def test_the_chain_is_issued(cm: CertStack) -> None:
    """Self-signed Issuer -> CA Certificate -> CA Issuer -> serving Certificates: all Ready, each leaf signed by the
    CA."""
    from cryptography import x509

    ns = cm.stack.namespace
    for issuer in cm.cp.request("GET", f"/apis/cert-manager.io/v1/namespaces/{ns}/issuers")["items"]:
        ready = [c for c in issuer.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", f"Issuer {issuer['metadata']['name']}: {ready}"
    ca = x509.load_pem_x509_certificate(cm.secret_of("ca")["tls.crt"])
    assert ca.issuer == ca.subject, "the CA is self-signed (by the chart's selfSigned Issuer)"
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for component_name in ("injection", "scaling"):
        secret = cm.secret_of(component_name)
        leaf = x509.load_pem_x509_certificate(secret["tls.crt"])
        leaf.verify_directly_issued_by(ca)
        assert _same_ca(secret["ca.crt"], cm.secret_of("ca")["tls.crt"]), "the Secret's ca.crt is the chart's CA"
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
        svc = f"{cm.release.service_name(component_name)}.{ns}.svc"
        assert sans == [svc, f"{svc}.cluster.local"]
    client = x509.load_pem_x509_certificate(cm.secret_of("client")["tls.crt"])
    client.verify_directly_issued_by(x509.load_pem_x509_certificate(cm.secret_of("client-ca")["tls.crt"]))


def _same_ca(pem: bytes, ca_pem: bytes) -> bool:
    """``pem`` is the chart's CA: same subject and key. Byte equality is too strict: cert-manager may
    issue the CA Certificate again (seen once in CI after the tier's API server restart), and a leaf
    Secret's ``ca.crt`` keeps the copy it was signed under until the leaf renews. The CA's
    ``rotationPolicy: Never`` keeps its key, so every copy verifies the same leaves."""
    from cryptography import x509

    cert, ca = x509.load_pem_x509_certificate(pem), x509.load_pem_x509_certificate(ca_pem)
    return cert.subject == ca.subject and cert.public_key() == ca.public_key()


def test_cainjector_writes_the_ca_bundle_into_both_webhook_configurations(cm: CertStack) -> None:
    ca = cm.secret_of("ca")["tls.crt"]
    cm.cp.wait_for(
        lambda: len(bundles := cm.ca_bundles()) == 2 and all(b and _same_ca(b, ca) for b in bundles.values()),
        30,
        "cainjector to inject the CA into both webhook configurations",
    )
    hooks = [
        cm.cp.request("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}/{cm.release.service_name(c)}")
        for c, kind in (("injection", "mutatingwebhookconfigurations"), ("scaling", "validatingwebhookconfigurations"))
    ]
    for hook, component_name in zip(hooks, ("injection", "scaling"), strict=True):
        annotation = hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert annotation == f"{cm.stack.namespace}/{cm.certificates[component_name]}"


def test_the_pods_serve_the_issued_certificates(cm: CertStack) -> None:
    context = cm.tls_context()
    for component_name in ("injection", "scaling"):
        assert served_serial(cm.release.port(component_name), context) == secret_serial(
            cm.secret_of(component_name)["tls.crt"]
        )


def _reloads(pod: Pod) -> float:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{pod.port('metrics')}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('slime_certificate_reloads_total{result="success"}')
    )


def _certificate_log(pod: Pod) -> str:
    """The service's log lines about its serving certificate (fingerprint prefixes and errors, no key material)."""
    lines = [line for line in pod.logs().splitlines() if "serving certificate" in line or "certificate file" in line]
    return " | ".join(lines[-4:]) or "no certificate log line"


@dataclass
class Round:
    """One `cmctl renew` of both serving certificates: seconds from the renewal to each step, per webhook."""

    stored: dict[str, float] = field(default_factory=dict)  # the Secret holds the new certificate
    refreshed: dict[str, float] = field(default_factory=dict)  # the pod's tls volume shows it (kubelet's part)
    served: dict[str, float] = field(default_factory=dict)  # a fresh TLS handshake gets a new serial
    # Serials the Secret held after the renewal: cert-manager may issue more than once for one renewal (the
    # pod then serves the last one), so any of them counts as served.
    issued: dict[str, set[int]] = field(default_factory=dict)
    unserved: dict[str, str] = field(default_factory=dict)  # what a webhook served instead, when it did not

    def figures(self) -> dict[str, Any]:
        steps: dict[str, Any] = {
            step: {c: round(t, 2) for c, t in getattr(self, step).items()} for step in ("stored", "refreshed", "served")
        }
        steps["issued"] = {c: len(serials) for c, serials in self.issued.items()}
        if self.unserved:
            steps["unserved"] = self.unserved
        return steps


def _renew_once(cm: CertStack, context: ssl.SSLContext, loader: threading.Thread) -> Round:
    cp, ns, pods = cm.cp, cm.stack.namespace, cm.stack.pods
    for c in WEBHOOKS:  # cmctl renew refuses a Certificate that is still issuing
        cp.wait_for(
            lambda c=c: certificate_ready(cp, ns, cm.certificates[c]), 30, f"Certificate {c} Ready before renewing it"
        )
    old = {c: secret_serial(cm.secret_of(c)["tls.crt"]) for c in WEBHOOKS}
    assert all(served_serial(cm.release.port(c), context) == old[c] for c in WEBHOOKS)
    renewed_at = time.monotonic()
    for c in WEBHOOKS:
        renew(cp, ns, cm.certificates[c])
    done = Round(issued={c: set() for c in WEBHOOKS})
    while (
        len(done.served) < len(WEBHOOKS) and time.monotonic() - renewed_at < RENEWAL_BOUND_SECONDS and loader.is_alive()
    ):
        for c in WEBHOOKS:
            if c in done.served:
                continue
            serial = secret_serial(cm.secret_of(c)["tls.crt"])
            if serial != old[c]:
                done.stored.setdefault(c, time.monotonic() - renewed_at)
                done.issued[c].add(serial)
            if served_serial(cm.release.port(c), context) in done.issued[c]:
                done.served[c] = time.monotonic() - renewed_at
        time.sleep(0.2)
    for c in WEBHOOKS:
        if c not in done.served:
            serving = served_serial(cm.release.port(c), context)
            what = "the old serial" if serving == old[c] else "a serial not seen in the Secret"
            done.unserved[c] = f"{what}; {_reloads(pods[c]):.0f} reloads; {_certificate_log(pods[c])}"
    for c in WEBHOOKS:
        refreshed = [
            t for t, pod, volume in cm.volume_sync.events if t >= renewed_at and pod == pods[c].name and volume == "tls"
        ]
        if refreshed:
            done.refreshed[c] = min(refreshed) - renewed_at
    return done


def test_renewal_under_load_fails_no_admission_and_the_new_serial_is_served(cm: CertStack) -> None:
    """RENEWALS times `cmctl renew` of both serving certificates while admissions flow through kube-apiserver."""
    cp = cm.cp
    cm.stack.wait_for(
        lambda: ((cm.stack.mirror() or {}).get("spec") or {}).get("replicas") == k8s.MD_START,
        60,
        "the mirror to adopt the MachineDeployment (scales are then consistent)",
    )
    context = cm.tls_context()
    bundles_before = cm.ca_bundles()
    reloads_before = {c: _reloads(cm.stack.pods[c]) for c in WEBHOOKS}
    containers = {c: (cm.stack.pods[c].container_id, cm.stack.pods[c].process) for c in WEBHOOKS}
    counters_before = webhook_counters(cp)

    load = Load(cp, cm.metal3_data, cm.stack.namespace, k8s.MIRROR)
    loader = load.start()
    rounds: list[Round] = []
    try:
        time.sleep(2.0)  # the load is flowing before the first renewal
        for _ in range(RENEWALS):
            rounds.append(_renew_once(cm, context, loader))
            if len(rounds[-1].served) < len(WEBHOOKS):
                break
        time.sleep(LOAD_TAIL_SECONDS)  # admissions keep flowing on the new certificates
    finally:
        load.stop.set()
        loader.join(timeout=60)
    delta = {k: v - counters_before.get(k, 0.0) for k, v in webhook_counters(cp).items()}
    figures = {
        "setup_seconds": {k: round(v, 1) for k, v in cm.setup_seconds.items()},
        "admissions": dict(load.sent),
        "load_seconds": round(load.seconds, 1),
        "rounds": [r.figures() for r in rounds],
        "apiserver_webhook_calls": {k.split(":", 1)[1]: v for k, v in sorted(delta.items()) if v},
        "failures": load.failures[:10],
        "volume_sync_errors": cm.volume_sync.errors[:5],
    }
    print(f"\n[cert-manager renewal under load] {figures}")
    if os.environ.get("SLIME_REAL_CERT_MANAGER_FIGURES"):  # docs/reliability.md's figures, as JSON
        Path(os.environ["SLIME_REAL_CERT_MANAGER_FIGURES"]).write_text(json.dumps(figures, indent=1))

    assert not load.failures, f"{len(load.failures)} admissions failed during the renewals: {load.failures[:10]}"
    bad_calls = failed_calls(delta)
    assert not bad_calls, f"kube-apiserver counted failed or rejected webhook calls: {bad_calls}"
    for c, webhook in WEBHOOKS.items():
        assert delta.get(f"apiserver_admission_webhook_request_total:{webhook}:200", 0) >= load.sent[c] > 0, (
            f"every {c} admission called the webhook: {figures}"
        )
    assert len(rounds) == RENEWALS and all(set(r.served) == set(WEBHOOKS) for r in rounds), (
        f"a new serial was not served within {RENEWAL_BOUND_SECONDS:.0f} s of its renewal: {figures}"
    )
    for c in WEBHOOKS:
        cp.wait_for(
            lambda c=c: certificate_ready(cp, cm.stack.namespace, cm.certificates[c]),
            30,
            f"Certificate {c} Ready after the renewals",
        )
        pod = cm.stack.pods[c]
        assert pod.running() and (pod.container_id, pod.process) == containers[c], f"{c}: the pod was not restarted"
        assert _reloads(pod) >= reloads_before[c] + RENEWALS, (
            f"{c}: the service reloaded each renewed certificate in place"
        )
    bundles_after = cm.ca_bundles()
    assert all(_same_ca(bundles_after[c], bundles_before[c]) for c in WEBHOOKS), (
        "the CA key is kept (rotationPolicy Never): the caBundle names the same CA"
    )
    assert all(cm.manager.running().values()), cm.manager.running()
