"""helm install / upgrade / uninstall of charts/slime on a real kube-apiserver (the session's plain control plane).

The API server validates every object (CRD schemas, RBAC, Services) and compiles the webhook
configurations' CEL matchConditions with cel-go at create time; the chart's ``lookup`` paths
(the CRD check, certificate reuse) run against a live server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.components.controlplane import ControlPlane
from testbed.components.release import Release, tier_values, webhook_configurations
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.world import ensure_namespace

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(300)]

MAPPING = [
    {
        "mirror": {"name": "mirror-a", "namespace": SLIME_NAMESPACE},
        "machineDeployment": {"name": "md-a", "namespace": "metal3"},
        "partition": "batch",
        "maxReplicas": 10,
    }
]


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart on the session's control plane; uninstalled at the end if a test left it installed (the control
    plane is shared: the next module finds it as it was)."""
    ensure_namespace(control_plane.api, "metal3")
    workdir = tmp_path_factory.mktemp("chart")
    release = Release(control_plane, SLIME_NAMESPACE, tier_values("localhost/slime:unused", MAPPING), workdir)
    yield release
    if webhook_configurations(control_plane, release.name):
        release.uninstall()


def tls_secrets(release: Release) -> dict[str, dict[str, bytes]]:
    names = [f"{release.service_name(c)}-tls" for c in ("injection", "scaling")] + [f"{release.name}-apiserver-client"]
    return {name: release.secret_data(name) for name in names}


def test_install_validates_and_compiles_every_object(release: Release) -> None:
    release.install()
    kinds = sorted({f"{o['kind']}" for o in release.manifest()})
    assert {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "Deployment",
        "Role",
        "ClusterRole",
        "Secret",
    } <= set(kinds)
    # Stored as rendered: the API server accepted (and compiled) the matchConditions.
    mutating = release.cp.api.request(
        "GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/slime-injection-webhook"
    )
    assert [c["name"] for c in mutating["webhooks"][0]["matchConditions"]] == [
        "owned-by-metal3data",
        "has-metadata-key",
    ]
    validating = release.cp.api.request(
        "GET", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/slime-scaling-webhook"
    )
    assert [c["name"] for c in validating["webhooks"][0]["matchConditions"]] == ["is-mapped-mirror"]


def test_the_api_server_compiles_match_conditions(release: Release, tmp_path: Path) -> None:
    """The same configuration with one expression misspelled is refused at create: CEL really is compiled."""
    broken = release.cp.api.request(
        "GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/slime-injection-webhook"
    )
    broken = {
        "apiVersion": broken["apiVersion"],
        "kind": broken["kind"],
        "metadata": {"name": "broken-cel"},
        "webhooks": broken["webhooks"],
    }
    broken["webhooks"][0]["matchConditions"][1]["expression"] = "has(object.data) && 'metaData' in objekt.data"
    proc = release.cp.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(broken), check=False)
    assert proc.returncode != 0 and "compilation failed" in proc.stderr and "objekt" in proc.stderr, proc.stderr


def test_upgrade_reuses_the_generated_certificates(release: Release) -> None:
    before = tls_secrets(release)
    bundles = {
        c["metadata"]["name"]: c["webhooks"][0]["clientConfig"]["caBundle"]
        for c in (
            release.cp.api.request("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
            for kind, name in (
                ("mutatingwebhookconfigurations", "slime-injection-webhook"),
                ("validatingwebhookconfigurations", "slime-scaling-webhook"),
            )
        )
    }
    release.values["logLevel"] = "DEBUG"  # a real change, so helm has something to upgrade
    release.upgrade()
    assert tls_secrets(release) == before, "helm upgrade must read the Secrets back (lookup) and reuse them"
    for kind, name in (
        ("mutatingwebhookconfigurations", "slime-injection-webhook"),
        ("validatingwebhookconfigurations", "slime-scaling-webhook"),
    ):
        config = release.cp.api.request("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
        assert config["webhooks"][0]["clientConfig"]["caBundle"] == bundles[name]
    deployment = release.cp.api.request(
        "GET", f"/apis/apps/v1/namespaces/{release.namespace}/deployments/slime-scaling-webhook"
    )
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SLIME_LOG_LEVEL"] == "DEBUG"


def test_uninstall_leaves_no_webhook_configuration(release: Release) -> None:
    assert len(webhook_configurations(release.cp, release.name)) == 2
    release.uninstall()
    assert webhook_configurations(release.cp, release.name) == []
    left = [
        o for o in release.cp.api.list("v1", "Secret", release.namespace) if o["metadata"]["name"].startswith("slime-")
    ]
    assert left == [], [o["metadata"]["name"] for o in left]
