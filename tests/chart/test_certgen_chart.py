"""Without cert-manager the chart renders no key: `helm template` gives the same manifest every time (GitOps).

selfSignedTLS.generator=job (the default) leaves the certificates to the slime-certgen hook Jobs
(tests/lifecycle/test_certgen.py runs them; kit/tests/real_k8s/test_certgen.py applies the rendering
twice to a real kube-apiserver). generator=helm still generates at render, which is why it is not
the default: the same comparison there finds new certificates in every render.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.framework.chart import NAMESPACE, RELEASE, by_kind
from testbed.framework.paths import CHART

VALUES = ["--set", "certManager.enabled=false", "--set", "admissionAuth.enabled=true"]


def template(helm: Path, *extra: str) -> str:
    args = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *VALUES, *extra]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def certgen_jobs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The certgen hook Jobs (the chart has others: uninstall's teardown)."""
    return [
        j for j in by_kind(objects, "Job") if j["metadata"]["labels"].get("app.kubernetes.io/component") == "certgen"
    ]


def test_helm_template_renders_the_same_manifest_every_time(helm: Path) -> None:
    assert template(helm) == template(helm)
    # The comparison can fail: Helm's own generator makes a new CA in every render.
    assert template(helm, "--set", "selfSignedTLS.generator=helm") != template(
        helm, "--set", "selfSignedTLS.generator=helm"
    )


def test_no_key_no_certificate_and_no_ca_bundle_is_rendered(render: Any) -> None:
    objects = render({"certManager": {"enabled": False}, "admissionAuth": {"enabled": True}})
    assert not [s["metadata"]["name"] for s in by_kind(objects, "Secret")]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for config in by_kind(objects, kind):
            assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])
            assert "cert-manager.io/inject-ca-from" not in (config["metadata"].get("annotations") or {})


def test_the_hook_jobs_and_their_scoped_rbac(render: Any) -> None:
    objects = render({"certManager": {"enabled": False}, "admissionAuth": {"enabled": True}})
    jobs = {j["metadata"]["name"]: j for j in certgen_jobs(objects)}
    assert set(jobs) == {f"{RELEASE}-certgen-create", f"{RELEASE}-certgen-patch"}
    hooks = {name: job["metadata"]["annotations"]["helm.sh/hook"] for name, job in jobs.items()}
    assert hooks == {
        f"{RELEASE}-certgen-create": "pre-install,pre-upgrade",
        f"{RELEASE}-certgen-patch": "post-install,post-upgrade",
    }
    rbac = [
        o
        for o in objects
        if o["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
        and o["metadata"]["name"] == f"{RELEASE}-certgen"
    ]
    assert {o["kind"] for o in rbac} == {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    for obj in rbac:
        annotations = obj["metadata"]["annotations"]
        # Created before the Jobs of each phase, gone once the phase succeeded: rights only while a hook runs.
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade,post-install,post-upgrade"
        assert int(annotations["helm.sh/hook-weight"]) < int(
            jobs[f"{RELEASE}-certgen-create"]["metadata"]["annotations"]["helm.sh/hook-weight"]
        )
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    (role,) = [o for o in rbac if o["kind"] == "Role"]
    named = next(r for r in role["rules"] if "resourceNames" in r)
    assert set(named["resourceNames"]) == {
        f"{RELEASE}-certgen-ca",
        f"{RELEASE}-injection-webhook-tls",
        f"{RELEASE}-scaling-webhook-tls",
        f"{RELEASE}-apiserver-client",
    }
    (cluster_role,) = [o for o in rbac if o["kind"] == "ClusterRole"]
    assert {r["resources"][0]: r["resourceNames"] for r in cluster_role["rules"]} == {
        "mutatingwebhookconfigurations": [f"{RELEASE}-injection-webhook"],
        "validatingwebhookconfigurations": [f"{RELEASE}-scaling-webhook"],
    }
    for job in jobs.values():
        spec = job["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == f"{RELEASE}-certgen"
        (container,) = spec["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    "values,gone",
    [
        ({"certManager": {"enabled": True}}, "cert-manager makes them"),
        ({"certManager": {"enabled": False}, "selfSignedTLS": {"generator": "helm"}}, "Helm makes them"),
        (
            {"certManager": {"enabled": False}, "injection": {"enabled": False}, "scaling": {"enabled": False}},
            "no webhook",
        ),
    ],
)
def test_no_certgen_where_something_else_makes_the_certificates(render: Any, values: dict[str, Any], gone: str) -> None:
    assert not certgen_jobs(render(values)), gone


def test_lifetimes_that_would_renew_at_every_upgrade_are_refused(render: Any) -> None:
    from testbed.framework.chart import HelmError

    with pytest.raises(HelmError) as exc:
        render({"certManager": {"enabled": False}, "selfSignedTLS": {"certValidityDays": 30, "renewBeforeDays": 30}})
    assert (
        "selfSignedTLS.certValidityDays (30) must be more than selfSignedTLS.renewBeforeDays (30)" in exc.value.stderr
    )
