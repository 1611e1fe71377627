"""KEDA's own install on the tier's API server, routed to processes on loopback (:mod:`testbed.components.keda`).

``kubectl kustomize config/default`` of KEDA's module zip (the CRDs with KEDA's patches, the
``keda`` namespace, the ``keda-operator`` ServiceAccount and RBAC, the
``keda-hpa-controller-external-metrics`` binding, the Services, the
``v1beta1.external.metrics.k8s.io`` APIService and the ``keda-admission``
ValidatingWebhookConfiguration), applied as rendered except: the Deployments (their containers run
as processes), the Services (``ExternalName: localhost`` on the processes' ports), and the
``caBundle`` of the APIService and the webhook configuration (certificates of our own, as
KEDA's BUILD.md says for running it locally).

Out of cluster no DNS resolves ``<svc>.<ns>.svc``: :func:`hosts_file` is the processes'
``/etc/hosts``, where every ``ExternalName: localhost`` Service of the cluster resolves to
127.0.0.1 (what cluster DNS plus kube-proxy do for a ClusterIP Service, here for pods on the
host network).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from testbed.components.controlplane import ControlPlane
from testbed.framework.pki import Ca, write, write_pair

Obj = dict[str, Any]
NAMESPACE = "keda"
OPERATOR_SERVICE, ADAPTER_SERVICE, WEBHOOK_SERVICE = (
    "keda-operator",
    "keda-metrics-apiserver",
    "keda-admission-webhooks",
)
CLUSTER_DOMAIN = "cluster.local"
# Each Service's named ports -> the process port (Keda.ports) behind it.
SERVICE_PORTS = {
    OPERATOR_SERVICE: {"metricsservice": "operator-grpc", "metrics": "operator-metrics"},
    ADAPTER_SERVICE: {"https": "adapter-https", "metrics": "adapter-metrics"},
    WEBHOOK_SERVICE: {"https": "webhooks-https", "metrics": "webhooks-metrics"},
}


def dns_names(service: str, namespace: str = NAMESPACE) -> list[str]:
    """The names KEDA's certificate manager puts in its certificate for a Service (``getDNSNames``)."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
    ]


def localhost_services(cp: ControlPlane) -> list[tuple[str, str]]:
    """(name, namespace) of every ``ExternalName: localhost`` Service: what resolves to 127.0.0.1 for KEDA."""
    return sorted(
        (s["metadata"]["name"], s["metadata"]["namespace"])
        for s in cp.api.list("v1", "services")
        if s["spec"].get("type") == "ExternalName" and s["spec"].get("externalName") == "localhost"
    )


def hosts_file(services: list[tuple[str, str]]) -> str:
    lines = [
        "# KEDA's view of cluster DNS (testbed/components/keda_install.py): ExternalName localhost -> 127.0.0.1",
        "127.0.0.1 localhost",
    ]
    for name, namespace in services:
        lines.append(f"127.0.0.1 {name}.{namespace}.svc {name}.{namespace}.svc.{CLUSTER_DOMAIN}")
    return "\n".join(lines) + "\n"


def certificates(cert_dir: Path) -> bytes:
    """One CA and one serving+client certificate for the three Services (like kedaorg-certs); the CA PEM."""
    ca = Ca.create("slime-real-keda-ca")
    names = tuple(n for service in SERVICE_PORTS for n in dns_names(service))
    pair = ca.issue("keda", dns=(*names, "localhost"), ips=("127.0.0.1",), server=True, client_too=True)
    write_pair(cert_dir, "tls", pair)
    write(cert_dir / "ca.crt", ca.pem)
    return ca.pem


def routed(obj: Obj, ca_pem: bytes, ports: dict[str, int]) -> Obj:
    """One rendered object as applied here (Services to ExternalName localhost on our ports, caBundles)."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    ca_bundle = base64.b64encode(ca_pem).decode()
    if kind == "Service":
        spec = obj["spec"]
        for port in spec["ports"]:
            port["port"] = port["targetPort"] = ports[SERVICE_PORTS[name][port["name"]]]
        obj["spec"] = {"type": "ExternalName", "externalName": "localhost", "ports": spec["ports"]}
    elif kind == "APIService":
        obj["spec"]["service"]["port"] = ports["adapter-https"]
        obj["spec"]["caBundle"] = ca_bundle
    elif kind == "ValidatingWebhookConfiguration":
        for webhook in obj["webhooks"]:
            webhook["clientConfig"]["service"]["port"] = ports["webhooks-https"]
            webhook["clientConfig"]["caBundle"] = ca_bundle
    return obj


def install(cp: ControlPlane, config: Path, workdir: Path, ports: dict[str, int], timeout: float = 120.0) -> list[Obj]:
    """Apply KEDA's manifests from its ``config/`` tree (no Deployments; routed Services; caBundles), wait for the
    CRDs; every rendered object (the Deployments' containers are run from them)."""
    ca_pem = certificates(workdir / "certs")
    rendered = cp.kubectl("kustomize", str(config / "default"), timeout=120).stdout
    manifest = [d for d in yaml.safe_load_all(rendered) if d]
    applied = [routed(o, ca_pem, ports) for o in manifest if o["kind"] != "Deployment"]
    path = workdir / "keda-manifest.yaml"
    path.write_text(yaml.safe_dump_all(applied))
    cp.kubectl("apply", "--server-side", "--field-manager=slime-real-keda", "-f", str(path), timeout=timeout)
    cp.wait_established([o["metadata"]["name"] for o in applied if o["kind"] == "CustomResourceDefinition"], timeout)
    return manifest
