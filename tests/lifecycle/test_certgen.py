"""slime-certgen against an API server (kubemu): made once, kept while valid, renewed near expiry, caBundle patched.

Each step runs the console script as the chart's hook Job runs it (a process, its args as the chart
renders them), against kubemu through a kubeconfig. The API calls it made are held against the
chart's hook-scoped RBAC; its output is searched for key material.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from kubemu import Emulator
from testbed.framework.audit import calls_by
from testbed.framework.chart import NAMESPACE, YAML_LOADER, by_kind, run_helm
from testbed.framework.helm import helm_binary
from testbed.framework.paths import CHART
from testbed.framework.rbac import assert_rbac_covers

INJ, SCL = "slime-injection-webhook", "slime-scaling-webhook"
VALUES = {"certManager": {"enabled": False}, "admissionAuth": {"enabled": True}}


_RENDERED: dict[str, str] = {}  # values and namespace -> helm's output (the same for the same values)


def rendered(tmp_path: Path, values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    import yaml

    key = json.dumps([values or VALUES, namespace], sort_keys=True)
    if key not in _RENDERED:
        args = ["template", "slime", str(CHART), "--namespace", namespace, "--skip-tests"]
        _RENDERED[key] = run_helm(helm_binary(), args, tmp_path, values or VALUES)
    return [d for d in yaml.load_all(_RENDERED[key], Loader=YAML_LOADER) if d]


def job_args(objects: list[dict[str, Any]], step: str) -> list[str]:
    (job,) = [j for j in by_kind(objects, "Job") if j["metadata"]["name"] == f"slime-certgen-{step}"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["slime-certgen"]
    return [str(a) for a in container["args"]]


class Runner:
    def __init__(self, emulator: Emulator, tmp_path: Path) -> None:
        self.kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        self.outputs: list[str] = []

    def __call__(self, args: list[str], expect: int = 0) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "lifecycle.certgen", *args, "--kubeconfig", self.kubeconfig],
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.outputs.append(proc.stdout + proc.stderr)
        assert proc.returncode == expect, proc.stderr
        return proc.stderr


def secret_data(emulator: Emulator, name: str) -> dict[str, bytes]:
    secret = emulator.get("v1", "Secret", NAMESPACE, name)
    assert secret is not None, name
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def cert(data: dict[str, bytes], key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[key])


def with_flags(args: list[str], **flags: str) -> list[str]:
    """The rendered args with some flags' values replaced (``ca_days="40"`` -> ``--ca-days 40``)."""
    out = list(args)
    for flag, value in flags.items():
        out[out.index("--" + flag.replace("_", "-")) + 1] = value
    return out


@pytest.fixture
def installed(emulator: Emulator, tmp_path: Path) -> tuple[list[dict[str, Any]], Runner]:
    """The rendered webhook configurations stored as `kubectl apply` leaves them (no caBundle: certgen sets it)."""
    objects = rendered(tmp_path)
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for config in [
        *by_kind(objects, "MutatingWebhookConfiguration"),
        *by_kind(objects, "ValidatingWebhookConfiguration"),
    ]:
        assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])
        emulator.create(config)
    return objects, Runner(emulator, tmp_path)


def bundles(emulator: Emulator) -> dict[str, str]:
    out = {}
    for kind, name in (("MutatingWebhookConfiguration", INJ), ("ValidatingWebhookConfiguration", SCL)):
        config = emulator.get("admissionregistration.k8s.io/v1", kind, "", name)
        assert config is not None
        out[name] = config["webhooks"][0]["clientConfig"].get("caBundle", "")
    return out


def test_made_once_then_kept_and_the_ca_bundle_set(emulator: Emulator, installed: Any) -> None:
    objects, run = installed
    run(job_args(objects, "create"))
    run(job_args(objects, "patch"))
    first = {n: secret_data(emulator, n) for n in (f"{INJ}-tls", f"{SCL}-tls", "slime-apiserver-client")}
    for name in (INJ, SCL):
        serving = cert(first[f"{name}-tls"])
        sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(sans.get_values_for_type(x509.DNSName)) == {
            f"{name}.{NAMESPACE}.svc",
            f"{name}.{NAMESPACE}.svc.cluster.local",
        }
        serving.verify_directly_issued_by(cert(first[f"{name}-tls"], "ca.crt"))
        assert base64.b64decode(bundles(emulator)[name]) == first[f"{name}-tls"]["ca.crt"]
    client = cert(first["slime-apiserver-client"])
    client.verify_directly_issued_by(cert(first["slime-apiserver-client"], "ca.crt"))
    assert first["slime-apiserver-client"]["ca.crt"] != first[f"{INJ}-tls"]["ca.crt"]  # a client CA of its own
    versions = {n: emulator.get("v1", "Secret", NAMESPACE, n)["metadata"]["resourceVersion"] for n in first}  # type: ignore[index]
    configs = {
        k: emulator.get("admissionregistration.k8s.io/v1", k, "", n)["metadata"]["resourceVersion"]
        for k, n in (("MutatingWebhookConfiguration", INJ), ("ValidatingWebhookConfiguration", SCL))
    }  # type: ignore[index]
    # The next upgrade (or sync) runs both Jobs again: nothing is written.
    assert "serving certificate kept" in run(job_args(objects, "create"))
    assert "caBundle already right" in run(job_args(objects, "patch"))
    assert {n: secret_data(emulator, n) for n in first} == first
    assert {n: emulator.get("v1", "Secret", NAMESPACE, n)["metadata"]["resourceVersion"] for n in first} == versions  # type: ignore[index]
    assert {
        k: emulator.get("admissionregistration.k8s.io/v1", k, "", n)["metadata"]["resourceVersion"]
        for k, n in (("MutatingWebhookConfiguration", INJ), ("ValidatingWebhookConfiguration", SCL))
    } == configs  # type: ignore[index]
    secret = emulator.get("v1", "Secret", NAMESPACE, f"{INJ}-tls")
    assert secret is not None and secret["metadata"]["annotations"]["slime/tls-source"] == "slime-certgen"
    assert secret["metadata"]["labels"]["app.kubernetes.io/instance"] == "slime"


def test_a_serving_pair_near_expiry_is_renewed_under_the_same_ca(emulator: Emulator, installed: Any) -> None:
    objects, run = installed
    create = job_args(objects, "create")
    run(with_flags(create, cert_days="40"))
    run(job_args(objects, "patch"))
    before, bundle = secret_data(emulator, f"{INJ}-tls"), bundles(emulator)
    assert "serving certificate kept" in run(with_flags(create, cert_days="60", renew_days="30"))  # 40 days left
    out = run(with_flags(create, cert_days="60", renew_days="45"))  # within 45 days of expiry now
    assert "serving certificate renewed" in out and "CA kept" in out
    after = secret_data(emulator, f"{INJ}-tls")
    assert after["tls.crt"] != before["tls.crt"] and after["tls.key"] != before["tls.key"]
    assert after["ca.crt"] == before["ca.crt"]  # the same CA: the caBundle needs no change
    run(job_args(objects, "patch"))
    assert bundles(emulator) == bundle
    cert(after).verify_directly_issued_by(cert(before, "ca.crt"))


def test_a_ca_near_expiry_is_replaced_and_the_old_one_stays_trusted(emulator: Emulator, installed: Any) -> None:
    objects, run = installed
    create = job_args(objects, "create")
    run(with_flags(create, ca_days="40"))
    old = secret_data(emulator, f"{SCL}-tls")
    assert "CA renewed" in run(with_flags(create, ca_days="400", renew_days="45"))
    new = secret_data(emulator, f"{SCL}-tls")
    trusted = x509.load_pem_x509_certificates(new["ca.crt"])
    assert len(trusted) == 2 and cert(old, "ca.crt") in trusted  # a pod still serving the old pair is trusted
    cert(new).verify_directly_issued_by(trusted[0])
    run(job_args(objects, "patch"))
    assert base64.b64decode(bundles(emulator)[SCL]) == new["ca.crt"]


def test_a_pair_for_other_names_is_replaced(emulator: Emulator, installed: Any, tmp_path: Path) -> None:
    """The Service's names changed (a fullnameOverride, another namespace's copy): the pair is issued again."""
    objects, run = installed
    create = job_args(objects, "create")
    run(create)
    before = secret_data(emulator, f"{INJ}-tls")
    renamed = [a.replace(f"{INJ}.{NAMESPACE}.svc", f"{INJ}.elsewhere.svc") for a in create]
    assert "serving certificate renewed" in run(renamed)
    assert secret_data(emulator, f"{INJ}-tls")["tls.crt"] != before["tls.crt"]


def test_a_broken_or_foreign_secret_is_replaced(emulator: Emulator, installed: Any) -> None:
    objects, run = installed
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": f"{INJ}-tls", "namespace": NAMESPACE},
            "data": {"tls.crt": base64.b64encode(b"not a certificate").decode()},
        }
    )
    run(job_args(objects, "create"))
    secret = emulator.get("v1", "Secret", NAMESPACE, f"{INJ}-tls")
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    cert(secret_data(emulator, f"{INJ}-tls"))


def test_the_client_certificate_is_never_renewed_only_reported(emulator: Emulator, installed: Any) -> None:
    """kube-apiserver holds a copy: a renewal here would break every authenticated admission."""
    objects, run = installed
    create = job_args(objects, "create")
    run(with_flags(create, cert_days="40"))
    before = secret_data(emulator, "slime-apiserver-client")
    out = run(with_flags(create, cert_days="60", renew_days="45"))
    assert "the client certificate kube-apiserver presents expires soon" in out
    assert secret_data(emulator, "slime-apiserver-client") == before


def test_patch_without_the_configuration_fails_for_the_job_to_retry(emulator: Emulator, installed: Any) -> None:
    objects, run = installed
    run(job_args(objects, "create"))
    emulator.delete("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", "", SCL)
    out = run(job_args(objects, "patch"), expect=1)
    assert "the API server refused" in out


def test_bad_flags_exit_2(emulator: Emulator, installed: Any) -> None:
    _, run = installed
    assert "is not NAME=VALUE" in run(["create", "--namespace", NAMESPACE, "--ca-secret", "ca", "--serving", "x"], 2)
    assert "is not mutating/<name>" in run(["patch", "--namespace", NAMESPACE, "--webhook", "other/x=y"], 2)
    assert "must be more than --renew-days" in run(
        ["create", "--namespace", NAMESPACE, "--ca-secret", "c", "--serving", "s=h", "--cert-days", "10"], 2
    )


def test_its_calls_are_what_the_hook_rbac_grants_and_no_key_is_printed(
    emulator: Emulator, installed: Any, tmp_path: Path
) -> None:
    objects, run = installed
    for _ in range(2):
        run(job_args(objects, "create"))
        run(job_args(objects, "patch"))
    hooks = [o for o in objects if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    calls = calls_by(emulator.requests, "slime-certgen")
    assert {(c.verb, c.resource) for c in calls} >= {
        ("create", "secrets"),
        ("get", "secrets"),
        ("get", "mutatingwebhookconfigurations"),
        ("patch", "validatingwebhookconfigurations"),
    }, calls
    assert_rbac_covers(hooks, "slime-certgen", NAMESPACE, calls)
    keys = [secret_data(emulator, n)["tls.key"] for n in ("slime-certgen-ca", f"{INJ}-tls", "slime-apiserver-client")]
    for key in keys:
        body = b"".join(key.splitlines()[1:-1]).decode()
        for output in run.outputs:
            assert body[:40] not in output and base64.b64encode(key).decode()[:40] not in output


def test_the_ca_key_is_in_its_own_secret_the_webhooks_never_mount(installed: Any) -> None:
    objects, _ = installed
    mounted = {
        v["secret"]["secretName"]
        for d in by_kind(objects, "Deployment")
        for v in d["spec"]["template"]["spec"].get("volumes") or []
        if "secret" in v
    }
    assert "slime-certgen-ca" not in mounted and {f"{INJ}-tls", f"{SCL}-tls"} <= mounted


def test_moving_from_helms_generator_keeps_working_though_helm_deletes_its_secrets(
    emulator: Emulator, installed: Any, tmp_path: Path
) -> None:
    """generator helm -> job: the pre-upgrade Job re-issues Helm's pairs under its own CA; Helm then deletes the
    Secrets it had rendered (they left its manifest); the post-upgrade Job makes them again, same CA, and the
    caBundle matches what the pods will serve."""
    objects, run = installed
    helm_rendered = [
        s for s in by_kind(rendered(tmp_path, {**VALUES, "selfSignedTLS": {"generator": "helm"}}), "Secret")
    ]
    assert {s["metadata"]["name"] for s in helm_rendered} == {f"{INJ}-tls", f"{SCL}-tls", "slime-apiserver-client"}
    for secret in helm_rendered:
        emulator.create(secret)
    client_before = secret_data(emulator, "slime-apiserver-client")
    run(job_args(objects, "create"))  # pre-upgrade
    ca = secret_data(emulator, "slime-certgen-ca")["tls.crt"]
    for secret in helm_rendered:  # helm upgrade: no longer in the manifest
        emulator.delete("v1", "secrets", NAMESPACE, secret["metadata"]["name"])
    out = run(job_args(objects, "patch"))  # post-upgrade
    assert "serving certificate created" in out and "caBundle set" in out
    for name in (INJ, SCL):
        data = secret_data(emulator, f"{name}-tls")
        cert(data).verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
        assert base64.b64decode(bundles(emulator)[name]) == data["ca.crt"]
    # kube-apiserver's client certificate is made anew: its copy on the control plane must be replaced
    # (CHANGELOG.md's upgrade note says so).
    assert secret_data(emulator, "slime-apiserver-client")["tls.crt"] != client_before["tls.crt"]
