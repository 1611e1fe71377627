"""``slime-check`` against the demo's emulated install: green as installed, and one useful line for each break.

The demo environment (:class:`demo.environment.DemoEnvironment`) is an install on kubemu: the
chart's webhook Deployments, Services (ExternalName ``localhost``), TLS Secrets and webhook
configurations, pointed at the two webhooks it runs over TLS, and the API server's admission
chain played from the chart. slime-check reads it through the real kubernetes client; its dry
runs go through that chain, its TLS probes to the webhooks. Each test breaks one thing, checks
the line that names it, and puts it back. The real-Kubernetes tier does the same on a real
kube-apiserver (tests/real_k8s/test_slime_check.py).
"""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.devcerts import create_ca
from common.names import CONF_SERVER_ANNOTATION
from demo import cluster
from demo.environment import DemoEnvironment
from preflight.main import run
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.framework.audit import EVIDENCE, RECORDED_CALLS, EvidenceHandler

NS = cluster.SLIME_NAMESPACE


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoEnvironment]:
    """The demo's install, its webhooks' log lines and API calls joining the session's secret scan and RBAC audit."""
    with DemoEnvironment(tmp_path_factory.mktemp("demo")) as environment:
        handler = EvidenceHandler(EVIDENCE)
        logging.getLogger().addHandler(handler)
        try:
            yield environment
        finally:
            logging.getLogger().removeHandler(handler)
            assert environment.emulator is not None
            RECORDED_CALLS.extend(environment.emulator.requests)


def check(env: DemoEnvironment, *argv: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = run(["--kubeconfig", str(env.kubeconfig), "--namespace", NS, *argv], lines.append)
    EVIDENCE.add_text("slime-check", "\n".join(lines))
    return code, lines


def lines_of(lines: list[str], status: str, check_name: str) -> list[str]:
    return [line for line in lines if line.split()[:2] == [status, check_name]]


def changed(env: DemoEnvironment, api_version: str, kind: str, namespace: str, name: str) -> Callable[[], None]:
    """Keep an object as it is now; the returned callable puts it back (re-created when it was deleted)."""
    assert env.emulator is not None
    saved = copy.deepcopy(env.emulator.get(api_version, kind, namespace, name))
    assert saved is not None, f"{kind} {namespace}/{name} not found"

    def restore() -> None:
        assert env.emulator is not None
        env.emulator.delete(api_version, kind, namespace, name)
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation"):
            saved["metadata"].pop(key, None)
        env.emulator.create(saved)

    return restore


def test_the_demo_install_passes_every_check(env: DemoEnvironment) -> None:
    code, lines = check(env)
    assert code == 0, "\n".join(lines)
    assert not [line for line in lines if line.startswith(("FAIL", "warn"))], "\n".join(lines)
    expected = {
        ("release", "injection-webhook Deployment slime-system/slime-injection-webhook"),
        ("release", "scaling-webhook Deployment slime-system/slime-scaling-webhook"),
        ("api", "Metal3 (CAPM3): metal3datas.infrastructure.cluster.x-k8s.io"),
        ("api", "Slinky: controllers.slinky.slurm.net served at v1beta1"),
        ("api", "Cluster API: machinedeployments.cluster.x-k8s.io"),
        ("slinky", "its only slurmctld pod slurm/slurm-controller-0 is Running on 192.0.2.10"),
        ("key", "Secret slurm/slurm-auth-slurm key slurm.key (slurm key, slurmKeyRef of Controller slurm/slurm"),
        ("conf-server", "a node provisioned now gets slurm_conf_server 192.0.2.10:30817"),
        ("capm3", "runs as system:serviceaccount:capm3-system:capm3-manager, which injection.allowedRequesters lists"),
        ("mapping", "mirror slime-system/mirror-slurm-workers -> MachineDeployment metal3/md-slurm-workers"),
        (
            "webhook",
            "MutatingWebhookConfiguration slime-injection-webhook: its caBundle verifies the certificate served at "
            "localhost:",
        ),
        ("webhook", "ValidatingWebhookConfiguration slime-scaling-webhook: its caBundle verifies"),
        (
            "admission",
            "injection-webhook: the API server called it for a server-side dry run of a metaData Secret in metal3",
        ),
        ("admission", "scaling-webhook: the API server called it for a server-side dry-run scale of mirror"),
    }
    for name, fragment in expected:
        assert any(fragment in line for line in lines_of(lines, "ok", name)), (
            f"no ok {name} line with {fragment!r}:\n" + "\n".join(lines)
        )
    assert lines[-1].startswith("slime-check passed: 14 ok, 0 warning(s), 0 failed")
    key = env.emulator.get("v1", "Secret", "slurm", "slurm-auth-slurm")["data"]["slurm.key"]  # type: ignore[union-attr]
    assert key not in "\n".join(lines) and base64.b64decode(key).decode() not in "\n".join(lines)


def test_a_release_that_is_not_there(env: DemoEnvironment) -> None:
    code, lines = check(env, "--release", "other")
    assert code == 1
    assert lines_of(lines, "FAIL", "release") == [
        "FAIL  release     no SliMe release other in namespace slime-system (no Deployment labelled "
        "app.kubernetes.io/instance=other, app.kubernetes.io/component=injection-webhook or scaling-webhook) "
        "-- fix: install it (docs/install.md), or name it: slime-check --namespace <namespace> --release <release>"
    ]


def _set_env(env: DemoEnvironment, deployment: str, name: str, value: str) -> Callable[[], None]:
    assert env.emulator is not None
    restore = changed(env, "apps/v1", "Deployment", NS, deployment)
    obj = env.emulator.get("apps/v1", "Deployment", NS, deployment)
    assert obj is not None
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != name] + [{"name": name, "value": value}]
    env.emulator.update(obj)
    return restore


def test_capm3_running_as_an_identity_the_chart_does_not_allow(env: DemoEnvironment) -> None:
    restore = _set_env(
        env, "slime-injection-webhook", "SLIME_ALLOWED_REQUESTERS", "system:serviceaccount:capm3:manager"
    )
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "capm3")
    assert (
        "CAPM3 (Deployment capm3-system/capm3-controller-manager) runs as "
        "system:serviceaccount:capm3-system:capm3-manager, "
        "which injection.allowedRequesters (system:serviceaccount:capm3:manager) does not list" in line
    )
    assert "--set 'injection.allowedRequesters={system:serviceaccount:capm3-system:capm3-manager}'" in line


def test_a_controller_selector_that_matches_no_slurmctld(env: DemoEnvironment) -> None:
    restore = _set_env(env, "slime-injection-webhook", "SLIME_CONTROLLER_SELECTOR", "app.kubernetes.io/name=slurm-ctld")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "slinky")
    assert "no slurmctld pod matches app.kubernetes.io/name=slurm-ctld in namespace slurm of cluster local" in line
    assert "set injection.controllerSelector" in line


def test_an_invalid_setting_is_what_the_pod_would_exit_with(env: DemoEnvironment) -> None:
    restore = _set_env(env, "slime-scaling-webhook", "SLIME_RESYNC_SECONDS", "0")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "release")
    assert "scaling-webhook Deployment slime-system/slime-scaling-webhook: its pods would exit 2 at start" in line


def test_a_missing_key_secret(env: DemoEnvironment) -> None:
    assert env.emulator is not None
    restore = changed(env, "v1", "Secret", "slurm", "slurm-auth-slurm")
    env.emulator.delete("v1", "Secret", "slurm", "slurm-auth-slurm")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    assert lines_of(lines, "FAIL", "key") == [
        "FAIL  key         Secret slurm/slurm-auth-slurm key slurm.key (slurm key, slurmKeyRef of Controller "
        "slurm/slurm, cluster local) does not exist -- fix: create it, or correct Controller.spec.slurmKeyRef"
    ]


def test_a_policy_that_cannot_be_satisfied(env: DemoEnvironment) -> None:
    assert env.emulator is not None
    restore = changed(env, "infrastructure.cluster.x-k8s.io/v1beta1", "Metal3DataTemplate", "metal3", cluster.TEMPLATE)
    env.emulator.patch(
        "infrastructure.cluster.x-k8s.io/v1beta1",
        "Metal3DataTemplate",
        "metal3",
        cluster.TEMPLATE,
        {"metadata": {"annotations": {CONF_SERVER_ANNOTATION: "service"}}},
    )
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "conf-server")
    assert (
        "Metal3DataTemplate metal3/slurm-workers (policy service): nodes provisioned now would be denied: NodePort "
        "Service" in line
    )
    assert "needs stable node addresses" in line


def test_a_mapping_to_a_machine_deployment_that_is_gone(env: DemoEnvironment) -> None:
    assert env.emulator is not None
    restore = changed(env, cluster.CAPI_VERSION, "MachineDeployment", "metal3", cluster.MACHINE_DEPLOYMENT)
    env.emulator.delete(cluster.CAPI_VERSION, "MachineDeployment", "metal3", cluster.MACHINE_DEPLOYMENT)
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    assert lines_of(lines, "FAIL", "mapping") == [
        "FAIL  mapping     mirror slime-system/mirror-slurm-workers -> MachineDeployment metal3/md-slurm-workers: "
        "the MachineDeployment does not exist -- fix: create it, or correct the mapping"
    ]


def test_a_ca_bundle_that_does_not_verify_the_served_certificate(env: DemoEnvironment, tmp_path: Path) -> None:
    assert env.emulator is not None
    api = "admissionregistration.k8s.io/v1"
    restore = changed(env, api, "MutatingWebhookConfiguration", "", "slime-injection-webhook")
    other = create_ca(tmp_path / "other-ca")
    config = env.emulator.get(api, "MutatingWebhookConfiguration", "", "slime-injection-webhook")
    assert config is not None
    config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(other.pem).decode()
    env.emulator.update(config)
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "webhook")
    assert (
        "MutatingWebhookConfiguration slime-injection-webhook: the caBundle does not verify the certificate served at "
        "localhost:" in line
    )
    assert "unable to get local issuer certificate" in line and "delete the *-webhook-tls Secrets" in line


def test_a_webhook_configuration_that_is_gone(env: DemoEnvironment) -> None:
    assert env.emulator is not None
    api = "admissionregistration.k8s.io/v1"
    restore = changed(env, api, "ValidatingWebhookConfiguration", "", "slime-scaling-webhook")
    env.emulator.delete(api, "ValidatingWebhookConfiguration", "", "slime-scaling-webhook")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    assert lines_of(lines, "FAIL", "webhook") == [
        "FAIL  webhook     ValidatingWebhookConfiguration slime-scaling-webhook is not registered: the API server "
        "never "
        "calls scaling-webhook -- fix: helm upgrade slime <chart> -n slime-system --reuse-values (the chart renders it)"
    ]


def test_dry_runs_the_api_server_admits_without_calling_the_webhooks(env: DemoEnvironment) -> None:
    chain, env.chain = (
        env.chain,
        None,
    )  # the emulator's admission then calls no webhook, as with a configuration that never matches
    try:
        code, lines = check(env)
    finally:
        env.chain = chain
    assert code == 1
    failed = lines_of(lines, "FAIL", "admission")
    assert len(failed) == 2
    assert (
        "injection-webhook: the API server admitted a server-side dry run of a metaData Secret in metal3 without "
        "calling the webhook" in failed[0]
    )
    assert (
        "scaling-webhook: the API server admitted a server-side dry-run scale of mirror "
        "slime-system/mirror-slurm-workers without an answer" in failed[1]
    )


def _with_node_demand(env: DemoEnvironment, slurmrestd: str, jwt_key: str) -> Callable[[], None]:
    assert env.emulator is not None
    restore = changed(env, "v1", "ConfigMap", NS, "scaling-webhook-configmap")
    configmap = env.emulator.get("v1", "ConfigMap", NS, "scaling-webhook-configmap")
    assert configmap is not None
    mappings: list[dict[str, Any]] = yaml.safe_load(configmap["data"]["mappings"])
    mappings[0]["nodeDemand"] = {
        "partition": cluster.PARTITION,
        "slurmrestd": slurmrestd,
        "jwtSecret": "slurm/slurm-auth-jwths256",
        "jwtKey": jwt_key,
    }
    configmap["data"]["mappings"] = yaml.safe_dump(mappings)
    env.emulator.update(configmap)
    return restore


def test_slurmrestd_answers_with_the_jwt_and_names_its_data_parser(env: DemoEnvironment) -> None:
    assert env.emulator is not None
    secret = env.emulator.get("v1", "Secret", "slurm", "slurm-auth-jwths256")
    assert secret is not None
    fake = FakeSlurmrestd(base64.b64decode(secret["data"]["jwt_hs256.key"]))
    restore = _with_node_demand(env, "http://slurm-restapi.slurm:6820", "jwt_hs256.key")
    try:
        code, lines = check(env, "--slurmrestd", f"http://slurm-restapi.slurm:6820={fake.url}")
        unreachable, unreachable_lines = check(env)
    finally:
        restore()
        fake.stop()
    assert code == 0, "\n".join(lines)
    (line,) = lines_of(lines, "ok", "slurmrestd")
    assert (
        f"http://slurm-restapi.slurm:6820 (reached at {fake.url}) for mappings[0] nodeDemand: lists 0 node(s)" in line
    )
    assert "with a JWT signed by Secret slurm/slurm-auth-jwths256 as user slurm; data parser v0.0.45" in line
    assert unreachable == 1
    (line,) = lines_of(unreachable_lines, "FAIL", "slurmrestd")
    assert (
        "cannot reach slurmrestd http://slurm-restapi.slurm:6820" in line
        and "--slurmrestd http://slurm-restapi.slurm:6820=" in line
    )


def test_slurmrestd_refusing_the_jwt(env: DemoEnvironment) -> None:
    fake = FakeSlurmrestd(b"k" * 32)  # not the key in the Secret
    restore = _with_node_demand(env, fake.url, "jwt_hs256.key")
    try:
        code, lines = check(env)
    finally:
        restore()
        fake.stop()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "slurmrestd")
    assert "refused the JWT (511) twice" in line
    assert "the key in Secret slurm/slurm-auth-jwths256 (jwt_hs256.key) is not the one slurmrestd verifies with" in line


def test_usage_errors_exit_2(env: DemoEnvironment, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--kubeconfig", "/nonexistent/kubeconfig"]) == 2
    assert run(["--namespace", "Bad_NS", "--kubeconfig", str(env.kubeconfig)]) == 2
    assert run(["--slurmrestd", "no-equals-sign", "--kubeconfig", str(env.kubeconfig)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "slime-check: kubeconfig /nonexistent/kubeconfig is not usable: No such file or directory",
        "slime-check: --namespace: 'Bad_NS' is not a namespace name",
        "slime-check: --slurmrestd: 'no-equals-sign' is not URL=URL",
    ]
