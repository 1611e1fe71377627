"""The chart with cert-manager's PKI on a real control plane: the cert-manager tests' site.

Real cert-manager (controller and cainjector, :mod:`testbed.components.certmanager`) issues the
chart's CA, both serving certificates and the admission client certificate
(``certManager.enabled=true``); kube-apiserver is restarted with the issued client certificate
(docs/install.md "Authenticated admission"); both webhooks run as the chart's pods with their
secret volumes refreshed as kubelet does, so a renewal reaches them as on a node.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.components.certmanager import CertManagerBuild
from testbed.components.release import Release, tier_values
from testbed.framework.objects import machine_deployment
from testbed.framework.world import seed_metal3
from testbed.scenarios.site import Site, building
from testbed.scenarios.stack import CLUSTER, MD_NAME, MD_NAMESPACE, MD_START, image, story_mapping

OPT_IN = {"slurm-controller-namespace": "slurm"}


@dataclass
class CertificatesSite(Site):
    metal3_data: dict[str, Any] = field(default_factory=dict)  # a Metal3Data the load's metaData Secrets name
    certificates: dict[str, str] = field(default_factory=dict)  # role -> Certificate (roles())


def roles(release: Release) -> dict[str, str]:
    """The chart's Certificates by role: the CA, one serving certificate per webhook, the client CA and certificate."""
    found: dict[str, str] = {}
    for cert in release.certificates():
        spec, labels = cert["spec"], cert["metadata"].get("labels", {})
        role = labels.get("app.kubernetes.io/component", "")
        if role in ("injection-webhook", "scaling-webhook"):
            found[role.removesuffix("-webhook")] = cert["metadata"]["name"]
        elif role == "admission-auth":
            found["client-ca" if spec.get("isCA") else "client"] = cert["metadata"]["name"]
        elif spec.get("isCA"):
            found["ca"] = cert["metadata"]["name"]
    return found


@contextmanager
def certificates_site(workdir: Path, built: CertManagerBuild) -> Iterator[CertificatesSite]:
    """Control plane + cert-manager, the chart installed with certManager.enabled=true and every Certificate Ready,
    admission authenticated with the issued client certificate, both webhooks as pods."""
    with building(CertificatesSite(workdir)) as (site, build):
        build.control_plane(built.crds)
        build.certmanager(built)
        build.namespaces(MD_NAMESPACE, "slurm")
        build.slinky()  # with CAPM3's identity: the load creates metaData Secrets as CAPM3's manager does
        md = machine_deployment(MD_NAME, MD_NAMESPACE, replicas=MD_START, version="v1beta2", cluster=CLUSTER, full=True)
        site.api.create(md)
        _, site.metal3_data = seed_metal3(site.api, template_labels=OPT_IN, index=40)
        build.chart(tier_values(image(), story_mapping(), certManager={"enabled": True}))
        site.certificates = roles(site.release)
        build.authenticated_admission()
        build.webhooks(kubelet_volumes=True)
        yield site
