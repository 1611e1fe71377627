"""admissionAuth: the client CA mounted into both webhooks, the generated client certificate, its
reuse on upgrade (Helm `lookup`, against the kubemu API emulator), NOTES.txt and the docs.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.framework.chart import NAMESPACE, RELEASE, by_kind, one
from testbed.framework.paths import CHART, REPO_ROOT

INJ = f"{RELEASE}-injection-webhook"
SCL = f"{RELEASE}-scaling-webhook"
CLIENT = f"{RELEASE}-apiserver-client"
CLIENT_CA = f"{RELEASE}-client-ca"
CA_FILE = "/client-ca/ca.crt"


def auth(
    source: str = "generate",
    name: str = "",
    key: str | None = None,
    enforce: bool | None = None,
    cert_manager: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    client_ca: dict[str, Any] = {"source": source, "name": name}
    if key is not None:
        client_ca["key"] = key
    values: dict[str, Any] = {
        "admissionAuth": {"enabled": True, "clientCA": client_ca},
        "certManager": {"enabled": cert_manager},
        **({} if cert_manager else {"selfSignedTLS": {"generator": "helm"}}),
        **extra,
    }
    if enforce is not None:
        values["admissionAuth"]["enforce"] = enforce
    return values


def container(objs: list[dict[str, Any]], svc: str) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = one(objs, "Deployment", svc)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return pod, c


def client_ca_wiring(objs: list[dict[str, Any]], svc: str) -> dict[str, Any] | None:
    """The client-CA volume source of a webhook pod, after checking env and mount agree; None when absent."""
    pod, c = container(objs, svc)
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if "SLIME_CLIENT_CA_FILE" not in env:
        assert "client-ca" not in mounts and "client-ca" not in volumes
        return None
    assert env["SLIME_CLIENT_CA_FILE"] == CA_FILE
    assert mounts["client-ca"] == {"name": "client-ca", "mountPath": "/client-ca", "readOnly": True}
    assert "subPath" not in mounts["client-ca"], "subPath mounts never see an updated CA"
    volume = dict(volumes["client-ca"])
    volume.pop("name")
    return volume


# ---------------------------------------------------------------- render matrix


def test_off_by_default(render):
    for values in (None, {"certManager": {"enabled": False}}):
        objs = render(values)
        assert client_ca_wiring(objs, INJ) is None and client_ca_wiring(objs, SCL) is None
        names = {o["metadata"]["name"] for o in objs}
        assert CLIENT not in names and CLIENT_CA not in names


@pytest.mark.parametrize("cert_manager", [True, False], ids=["cert-manager", "helm-generated"])
@pytest.mark.parametrize(
    "source,name,key,expected_volume",
    [
        ("generate", "", None, None),
        (
            "secret",
            "my-apiserver-ca",
            None,
            {
                "secret": {
                    "secretName": "my-apiserver-ca",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    "defaultMode": 0o440,
                }
            },
        ),
        (
            "secret",
            "my-apiserver-ca",
            "bundle.pem",
            {
                "secret": {
                    "secretName": "my-apiserver-ca",
                    "items": [{"key": "bundle.pem", "path": "ca.crt"}],
                    "defaultMode": 0o440,
                }
            },
        ),
        (
            "configMap",
            "kube-apiserver-ca",
            None,
            {
                "configMap": {
                    "name": "kube-apiserver-ca",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    "defaultMode": 0o440,
                }
            },
        ),
    ],
    ids=["generate", "secret", "secret-key", "configMap"],
)
@pytest.mark.parametrize("enforce", [True, False], ids=["enforced", "prepared"])
def test_render_matrix(render, cert_manager, source, name, key, expected_volume, enforce):
    objs = render(auth(source, name, key, enforce=enforce, cert_manager=cert_manager))
    if source == "generate":
        ca_secret = CLIENT_CA if cert_manager else CLIENT
        expected_volume = {
            "secret": {"secretName": ca_secret, "items": [{"key": "ca.crt", "path": "ca.crt"}], "defaultMode": 0o440}
        }
    for svc in (INJ, SCL):
        assert client_ca_wiring(objs, svc) == (expected_volume if enforce else None), svc
    generated = {
        (o["kind"], o["metadata"]["name"])
        for o in objs
        if o["metadata"]["name"] in (CLIENT, CLIENT_CA, f"{CLIENT_CA}-issuer")
    }
    if source != "generate":
        assert not generated, "the operator's own CA: nothing generated"
    elif cert_manager:
        assert generated == {("Certificate", CLIENT_CA), ("Issuer", f"{CLIENT_CA}-issuer"), ("Certificate", CLIENT)}
    else:
        assert generated == {("Secret", CLIENT)}
    # The serving side is untouched: same TLS mount and environment as without admissionAuth.
    _, c = container(objs, INJ)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SLIME_CERT_FILE"] == "/tls/tls.crt" and env["SLIME_KEY_FILE"] == "/tls/tls.key"


def test_cert_manager_client_chain(render):
    objs = render(auth())
    certs = {c["metadata"]["name"]: c["spec"] for c in by_kind(objs, "Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in by_kind(objs, "Issuer")}
    ca = certs[CLIENT_CA]
    assert ca["isCA"] is True and ca["secretName"] == CLIENT_CA
    assert ca["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer", "name": f"{RELEASE}-selfsigned"}
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert ca["secretName"] != certs[f"{RELEASE}-ca"]["secretName"], "a client CA of its own, not the serving CA"
    assert issuers[f"{CLIENT_CA}-issuer"] == {"ca": {"secretName": CLIENT_CA}}
    client = certs[CLIENT]
    assert client["secretName"] == CLIENT and client["commonName"] == CLIENT
    assert "client auth" in client["usages"] and "server auth" not in client["usages"]
    assert client.get("isCA") is not True and "dnsNames" not in client
    assert client["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer", "name": f"{CLIENT_CA}-issuer"}
    assert (client["duration"], client["renewBefore"]) == ("8760h", "720h")
    custom = render(
        {"admissionAuth": {"enabled": True, "clientCertificate": {"duration": "2160h", "renewBefore": "360h"}}}
    )
    spec = one(custom, "Certificate", CLIENT)["spec"]
    assert (spec["duration"], spec["renewBefore"]) == ("2160h", "360h")


def test_only_the_enabled_webhooks_are_wired(render):
    objs = render(auth(cert_manager=False, scaling={"enabled": False}))
    assert client_ca_wiring(objs, INJ) is not None
    assert SCL not in [d["metadata"]["name"] for d in by_kind(objs, "Deployment")]
    one(objs, "Secret", CLIENT)
    none = render(auth(cert_manager=False, injection={"enabled": False}, scaling={"enabled": False}))
    assert not [o for o in none if o["metadata"]["name"] == CLIENT]


# ---------------------------------------------------------------- the generated certificate


def _pem(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def test_helm_generated_client_certificate(render):
    x509 = pytest.importorskip("cryptography.x509")
    objs = render(auth(cert_manager=False))
    secret = one(objs, "Secret", CLIENT)
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    assert secret["metadata"]["namespace"] == NAMESPACE
    cert = x509.load_pem_x509_certificate(_pem(secret, "tls.crt"))
    ca = x509.load_pem_x509_certificate(_pem(secret, "ca.crt"))
    cert.verify_directly_issued_by(ca)  # chains to the CA the webhooks trust
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usages
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    # The key in the Secret belongs to the certificate.
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(_pem(secret, "tls.key"), password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    # Its own CA: the serving CA cannot mint client certificates, nor the client CA serving ones.
    serving = one(objs, "Secret", f"{INJ}-tls")
    assert _pem(serving, "ca.crt") != _pem(secret, "ca.crt")
    # What the webhooks mount is exactly that CA (the Secret's ca.crt, projected alone).
    assert client_ca_wiring(objs, INJ)["secret"]["secretName"] == CLIENT  # type: ignore[index]


# ---------------------------------------------------------------- reuse on upgrade (lookup)


def _emulator_with_chart_kinds() -> Any:
    """kubemu serving every kind the chart renders (Helm maps each one to an API resource)."""
    from kubemu import Emulator
    from kubemu.resources import Resource, default_resources

    extra = [
        Resource("", ["v1"], "ServiceAccount", "serviceaccounts", status=False),
        Resource(
            "admissionregistration.k8s.io",
            ["v1"],
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            namespaced=False,
            status=False,
        ),
        Resource(
            "admissionregistration.k8s.io",
            ["v1"],
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            namespaced=False,
            status=False,
        ),
        Resource("rbac.authorization.k8s.io", ["v1"], "Role", "roles", status=False),
        Resource("rbac.authorization.k8s.io", ["v1"], "RoleBinding", "rolebindings", status=False),
        Resource("rbac.authorization.k8s.io", ["v1"], "ClusterRole", "clusterroles", namespaced=False, status=False),
        Resource(
            "rbac.authorization.k8s.io",
            ["v1"],
            "ClusterRoleBinding",
            "clusterrolebindings",
            namespaced=False,
            status=False,
        ),
        Resource("policy", ["v1"], "PodDisruptionBudget", "poddisruptionbudgets"),
        Resource("cert-manager.io", ["v1"], "Certificate", "certificates", custom=True),
        Resource("cert-manager.io", ["v1"], "Issuer", "issuers", custom=True),
    ]
    return Emulator(resources=[*default_resources(), *extra]).start()


def test_generated_secrets_are_reused_on_upgrade(helm, tmp_path):
    """`helm template --dry-run=server` against kubemu runs the chart's `lookup`s like an upgrade does."""
    emulator = _emulator_with_chart_kinds()
    try:
        env = {**os.environ, "KUBECONFIG": emulator.write_kubeconfig(tmp_path / "kubeconfig"), "HOME": str(tmp_path)}
        args = [
            str(helm),
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--dry-run=server",
            "--disable-openapi-validation",
            "--set",
            "certManager.enabled=false",
            "--set",
            "selfSignedTLS.generator=helm",
            "--set",
            "admissionAuth.enabled=true",
        ]

        def secrets() -> dict[str, dict[str, Any]]:
            proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
            assert proc.returncode == 0, proc.stderr
            return {d["metadata"]["name"]: d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "Secret"}

        def install(secret: dict[str, Any]) -> None:
            """What `helm install` leaves behind: the object, owned by the release."""
            meta = secret["metadata"]
            meta.setdefault("annotations", {}).update(
                {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": NAMESPACE}
            )
            emulator.create(secret)

        first = secrets()
        assert secrets()[CLIENT]["data"] != first[CLIENT]["data"], "nothing in the cluster yet: fresh each render"
        emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for secret in first.values():
            install(secret)
        upgrade = secrets()
        for name in (CLIENT, f"{INJ}-tls", f"{SCL}-tls"):
            assert upgrade[name]["data"] == first[name]["data"], f"{name} was regenerated on upgrade"
        # An incomplete Secret (no key) is not reused: a new CA and client certificate.
        emulator.delete("v1", "secrets", NAMESPACE, CLIENT)
        broken = dict(first[CLIENT], data={k: v for k, v in first[CLIENT]["data"].items() if k != "tls.key"})
        broken["metadata"] = {k: v for k, v in first[CLIENT]["metadata"].items() if k not in ("resourceVersion", "uid")}
        install(broken)
        again = secrets()[CLIENT]["data"]
        assert set(again) == {"ca.crt", "tls.crt", "tls.key"} and again["ca.crt"] != first[CLIENT]["data"]["ca.crt"]
    finally:
        emulator.stop()


# ---------------------------------------------------------------- NOTES.txt and docs


def _notes(helm: Path, kubeconfig: str, tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (Helm 3 asks the cluster for its version even with --dry-run=client)."""
    args = [
        str(helm),
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "--disable-openapi-validation",
    ]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "KUBECONFIG": kubeconfig, "HOME": str(tmp_path)}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def test_notes_show_the_kube_apiserver_side(helm, tmp_path):
    emulator = _emulator_with_chart_kinds()
    try:
        _check_notes(helm, emulator.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
    finally:
        emulator.stop()


def _check_notes(helm: Path, kubeconfig: str, tmp_path: Path) -> None:
    notes = _notes(helm, kubeconfig, tmp_path, "admissionAuth.enabled=true", "certManager.enabled=false")
    assert "The chart cannot configure kube-apiserver" in notes
    assert f"kubectl -n {NAMESPACE} get secret {CLIENT} -o jsonpath='{{.data.tls\\.crt}}' | base64 -d" in notes
    assert "--admission-control-config-file=/etc/kubernetes/admission/admission.yaml" in notes
    for svc, port in ((INJ, 8443), (SCL, 8444)):
        assert f"- name: {svc}.{NAMESPACE}.svc:{port}" in notes
    for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"):
        assert f"- name: {plugin}" in notes
    assert "kind: WebhookAdmissionConfiguration" in notes and "REQUIRE" in notes
    prepared = _notes(helm, kubeconfig, tmp_path, "admissionAuth.enabled=true", "admissionAuth.enforce=false")
    assert "admissionAuth.enforce=false" in prepared and "REQUIRE" not in prepared
    own = _notes(
        helm,
        kubeconfig,
        tmp_path,
        "admissionAuth.enabled=true",
        "admissionAuth.clientCA.source=secret",
        "admissionAuth.clientCA.name=my-ca",
    )
    assert f"secret {NAMESPACE}/my-ca" in own and "get secret" not in own
    assert "Authenticated admission" not in _notes(helm, kubeconfig, tmp_path)


def _section(title: str) -> str:
    doc = (REPO_ROOT / "docs" / "install.md").read_text()
    return doc.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_docs_examples_parse_and_match_the_chart(render):
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", _section("Authenticated admission"), re.S)]
    admission = next(b for b in blocks if b.get("kind") == "AdmissionConfiguration")
    assert admission["apiVersion"] == "apiserver.config.k8s.io/v1"
    plugins = {p["name"]: p["configuration"] for p in admission["plugins"]}
    assert set(plugins) == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    for config in plugins.values():
        assert (
            config["apiVersion"] == "apiserver.config.k8s.io/v1" and config["kind"] == "WebhookAdmissionConfiguration"
        )
    kubeconfig = next(b for b in blocks if b.get("kind") == "Config")
    assert "current-context" not in kubeconfig
    assert config["kubeConfigFile"] == "/etc/kubernetes/admission/kubeconfig.yaml"
    # The user keys are the hosts the chart's webhook configurations are called at.
    objs = render()
    hosts = set()
    for cfg in [*by_kind(objs, "MutatingWebhookConfiguration"), *by_kind(objs, "ValidatingWebhookConfiguration")]:
        svc = cfg["webhooks"][0]["clientConfig"]["service"]
        hosts.add(f"{svc['name']}.{svc['namespace']}.svc:{svc['port']}")
        assert svc["port"] != 443, "the docs key users by <svc>.<ns>.svc:<port>: the port-less form matches only 443"
    assert {u["name"] for u in kubeconfig["users"]} == hosts
