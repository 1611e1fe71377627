"""``slime-check`` against the demo's emulated install: green as installed, and one useful line for each break.

The demo environment (:class:`demo.environment.DemoEnvironment`) is an install on kubemu: the
chart's webhook Deployments, Services (ExternalName ``localhost``), TLS Secrets and webhook
configurations, pointed at the two webhooks it runs over TLS, and the API server's admission
chain played from the chart. slime-check reads it through the real kubernetes client; its dry
runs go through that chain, its TLS probes to the webhooks. Each test breaks one thing, checks
the line that names it, and puts it back. The real-Kubernetes tier does the same on a real
kube-apiserver (kit/tests/real_k8s/test_slime_check.py).
"""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from certs.devcerts import create_ca
from common.names import CLUSTER_OVERRIDE_LABEL, CONF_SERVER_ANNOTATION, OPT_IN_LABEL
from demo import cluster
from demo.environment import DemoEnvironment
from kubemu import Emulator, Fault
from preflight.main import run
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.framework.audit import EVIDENCE, RECORDED_CALLS, EvidenceHandler
from testbed.framework.objects import kubeconfig_secret, metadata_secret, slinky_controller
from testbed.framework.wait import wait_for
from testbed.framework.world import ensure_namespace, impersonating, seed_metal3, seed_nodeport, seed_slinky

NS = cluster.SLIME_NAMESPACE
INJECTION = "slime-injection-webhook"  # the release's injection Deployment


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoEnvironment]:
    """The demo's install, its webhooks' log lines and API calls joining the session's secret scan and RBAC audit.

    The demo runs its injection webhook with the operator's bindings and template opt-ins
    (:data:`demo.cluster.SLURM_BINDINGS`, :data:`demo.cluster.TEMPLATE_OPT_INS`); the release's Deployment in
    kubemu is rendered from :func:`demo.cluster.chart_values`, which leaves them out. They are set on it here, as
    an operator's values would set them, so the Deployment says what its webhook runs with."""
    with DemoEnvironment(tmp_path_factory.mktemp("demo")) as environment:
        _set_env(environment, INJECTION, "SLIME_SLURM_BINDINGS", cluster.SLURM_BINDINGS)
        _set_env(environment, INJECTION, "SLIME_TEMPLATE_OPT_INS", cluster.TEMPLATE_OPT_INS)
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
        (
            "bindings",
            "Metal3DataTemplate metal3/slurm-workers names the Slinky Controller in namespace slurm of the management "
            "cluster (slurm-controller-cluster absent): namespace metal3 is bound to it (metal3=slurm in "
            "--slurm-bindings); it asks for controller-name, which --template-opt-ins or --extra-join-data allow",
        ),
        (
            "slinky",
            "Controller slurm/slurm (slinky.slurm.net/v1beta1, cluster local, for metal3/slurm-workers): its only "
            "slurmctld pod slurm/slurm-controller-0 is Running on 192.0.2.10",
        ),
        (
            "key",
            "Secret slurm/slurm-auth-slurm key slurm.key (slurm key, slurmKeyRef of Controller slurm/slurm, cluster "
            "local): 1024 bytes",
        ),
        (
            "conf-server",
            "a node provisioned now gets slurm_conf_server 192.0.2.10:30817 (the node running slurmctld: a node "
            "provisioned before a move keeps the old address), from Controller slurm/slurm in cluster local",
        ),
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
    assert lines[-1].startswith("slime-check passed: 15 ok, 0 warning(s), 0 failed")
    assert env.emulator is not None
    stored = env.emulator.get("v1", "Secret", "slurm", "slurm-auth-slurm")
    assert stored is not None
    key = stored["data"]["slurm.key"]
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
    restore = _set_env(env, INJECTION, "SLIME_ALLOWED_REQUESTERS", "system:serviceaccount:capm3:manager")
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
    restore = _set_env(env, INJECTION, "SLIME_CONTROLLER_SELECTOR", "app.kubernetes.io/name=slurm-ctld")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "slinky")
    assert (
        "no slurmctld pod matches app.kubernetes.io/name=slurm-ctld in namespace slurm of cluster local, for "
        "metal3/slurm-workers -- fix: set injection.controllerSelector to your Slinky release's labels" in line
    )


def test_a_template_choosing_an_external_controller(env: DemoEnvironment) -> None:
    """Slinky v1.1's external Controller (slurmctld outside Kubernetes): slime-check says so, as the webhook does."""
    emu = env.emulator
    assert emu is not None
    external = slinky_controller(
        "outside", "slurm", "v1beta1", {"external": True, "externalConfig": {"host": "ctld.example.org", "port": 6817}}
    )
    emu.create(external)
    template = ("infrastructure.cluster.x-k8s.io/v1beta1", "Metal3DataTemplate", "metal3", "slurm-workers")
    emu.patch(*template, {"metadata": {"labels": {"slurm-controller-name": "outside"}}})
    try:
        code, lines = check(env)
    finally:
        emu.patch(*template, {"metadata": {"labels": {"slurm-controller-name": None}}})  # a merge patch removes it
        emu.delete("slinky.slurm.net/v1beta1", "Controller", "slurm", "outside")
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "slinky")
    assert "Controller slurm/outside is external (spec.external: true, slurmctld at 'ctld.example.org:6817'" in line
    assert "-- fix: point the template's slurm-controller-name at a Controller Slinky runs" in line


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


# --- bindings: what the operator lets each template have ---------------------------------------------------


def test_a_template_naming_an_unbound_namespace(env: DemoEnvironment) -> None:
    # The operator binds another namespace only: the demo's tenant (metal3) is no longer bound to slurm.
    restore = _set_env(env, INJECTION, "SLIME_SLURM_BINDINGS", "*=slurm-site")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    assert lines_of(lines, "FAIL", "bindings") == [
        "FAIL  bindings    Metal3DataTemplate metal3/slurm-workers names the Slinky Controller in namespace slurm "
        "(slurm-controller-namespace=slurm) of the management cluster (slurm-controller-cluster absent), and namespace "
        "metal3 is not bound to it (the injection webhook runs with --slurm-bindings *=slurm-site): its nodes get no "
        "join data -- fix: if that tenant may use that Controller, bind it: helm upgrade slime <chart> -n slime-system "
        "--reuse-values --set 'injection.slurmBindings={*=slurm-site,metal3=slurm}' (in values: add metal3=slurm to "
        "injection.slurmBindings); otherwise label the template slurm-controller-namespace=<a Slurm namespace bound "
        "to metal3>"
    ]
    # As the webhook: no Slinky lookup for a template it stops at, so no key and no address for it.
    assert lines_of(lines, "skip", "slinky") == [
        "skip  slinky      Metal3DataTemplate metal3/slurm-workers: its Slinky Controller not looked up, as the "
        "webhook stops before it: its nodes get no join data (the FAIL line above says why)"
    ]
    assert not [line for line in lines if line.split()[1] in ("key", "conf-server")], "\n".join(lines)


def test_a_template_asking_for_extra_join_data_templates_may_not_choose(env: DemoEnvironment) -> None:
    restore_opt_ins = _set_env(env, INJECTION, "SLIME_TEMPLATE_OPT_INS", "")
    try:
        code, lines = check(env)
        annotations = {"metadata": {"annotations": {"slurm-extra-join-data": "controller-name,jwt-key"}}}
        restore_template = _patched_template(env, annotations)
        restore_opt_ins()
        restore_opt_ins = _set_env(env, INJECTION, "SLIME_TEMPLATE_OPT_INS", "controller-name")
        try:
            jwt_code, jwt_lines = check(env)
        finally:
            restore_template()
    finally:
        restore_opt_ins()
    assert code == 1
    assert lines_of(lines, "FAIL", "bindings") == [
        "FAIL  bindings    Metal3DataTemplate metal3/slurm-workers asks for controller-name "
        "(slurm-extra-join-data='controller-name'), which templates may not choose (the injection webhook runs with "
        "--template-opt-ins (none) and --extra-join-data (none)): its nodes get no join data -- fix: if templates may "
        "ask for it, allow it: helm upgrade slime <chart> -n slime-system --reuse-values --set "
        "'injection.templateOptIns={controller-name}'; otherwise remove controller-name from the template's "
        "annotation slurm-extra-join-data"
    ]
    assert jwt_code == 1
    (line,) = lines_of(jwt_lines, "FAIL", "bindings")
    assert (
        "Metal3DataTemplate metal3/slurm-workers asks for jwt-key (slurm-extra-join-data='controller-name,jwt-key'), "
        "which templates may not choose (the injection webhook runs with --template-opt-ins controller-name" in line
    )
    assert (
        "--set 'injection.templateOptIns={controller-name,jwt-key}' (jwt-key also needs the JWT key Secrets' names "
        "in injection.jwtKeySecretNames)" in line
    )
    assert not lines_of(jwt_lines, "ok", "key"), "no JWT key is looked at for a template the webhook stops at"


def test_an_invalid_template_annotation_is_what_the_webhook_denies_with(env: DemoEnvironment) -> None:
    annotations = {"slurm-extra-join-data": "munge-key", "slurm-node-features": "gpu,gpu"}
    restore = _patched_template(env, {"metadata": {"annotations": annotations}})
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    assert lines_of(lines, "FAIL", "bindings") == [
        "FAIL  bindings    Metal3DataTemplate metal3/slurm-workers has an invalid annotation "
        "slurm-extra-join-data='munge-key': unknown item 'munge-key'; the items are controller-name, jwt-key: the "
        "webhook denies its nodes' metaData Secrets (CAPM3 retries; no node is provisioned) -- fix: a comma list of "
        "controller-name, jwt-key, or remove the annotation"
    ]
    assert lines_of(lines, "FAIL", "conf-server") == [
        "FAIL  conf-server Metal3DataTemplate metal3/slurm-workers has an invalid annotation "
        "slurm-node-features='gpu,gpu': a feature is listed twice: the webhook denies its nodes' metaData Secrets "
        "(CAPM3 retries; no node is provisioned) -- fix: a comma list of the features of the pool's NodeSet, each once"
    ]
    assert lines_of(lines, "skip", "slinky"), "no Slinky lookup for a template the webhook denies"


# --- which cluster: each Metal3Data's own, as the webhook decides --------------------------------------------

TENANT = "tenant"
WORKLOAD_TEMPLATE = {OPT_IN_LABEL: "slurm", CLUSTER_OVERRIDE_LABEL: "workload"}
METAL3 = cluster.METAL3_VERSION


class Tenant:
    """A second tenant's objects in the demo's management cluster, deleted again after the test."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.created: dict[tuple[str, str, str], None] = {}

    def metal3(self, template: str, labels: dict[str, str], cluster_name: str, index: int) -> dict[str, Any]:
        """A Metal3Data of ``template`` in Cluster ``cluster_name``, tied to it as CAPM3 v1.14 ties it (no template
        owner reference: ``spec.template.name``); the template is made by the first call, its ``spec.clusterName``
        naming that first Cluster (the field v1.14 deprecates)."""
        _, data = seed_metal3(
            self.emulator, TENANT, cluster_name, template, labels, index, METAL3.split("/")[1], template_owner=False
        )
        self.created[(METAL3, "Metal3DataTemplate", template)] = None
        self.created[(METAL3, "Metal3Data", data["metadata"]["name"])] = None
        return data

    def template(self, template: str, labels: dict[str, str]) -> None:
        """A template with no Metal3Data (yet)."""
        ensure_namespace(self.emulator, TENANT)
        body = {"apiVersion": METAL3, "kind": "Metal3DataTemplate", "metadata": {"name": template, "labels": labels}}
        self.emulator.create({**body, "spec": {}}, TENANT)
        self.created[(METAL3, "Metal3DataTemplate", template)] = None

    def kubeconfig(self, workload: Emulator | str, cluster_name: str, **options: Any) -> None:
        """The ``<cluster>-kubeconfig`` Secret Cluster API writes (or a kubeconfig given as text)."""
        kubeconfig = workload if isinstance(workload, str) else workload.kubeconfig()
        self.emulator.create(kubeconfig_secret(kubeconfig, cluster_name, TENANT, **options))
        self.created[("v1", "Secret", f"{cluster_name}-kubeconfig")] = None

    def remove(self) -> None:
        for api_version, kind, name in reversed(self.created):
            self.emulator.delete(api_version, kind, TENANT, name)


@pytest.fixture
def tenant(env: DemoEnvironment) -> Iterator[Tenant]:
    assert env.emulator is not None
    objects = Tenant(env.emulator)
    try:
        yield objects
    finally:
        objects.remove()


def workload_cluster(emulator_factory: Callable[..., Emulator], host_ip: str, node_port: int) -> Emulator:
    """A workload cluster (https, a token) running its own Slinky Controller, slurmctld on ``host_ip``."""
    workload = emulator_factory(workload=True, token=f"token-{node_port}")
    seed_slinky(workload, "slurm", "slurm", host_ip=host_ip)
    seed_nodeport(workload, "slurm", "slurm", node_port)
    return workload


def test_a_shared_template_is_checked_in_the_cluster_of_each_metal3data(
    env: DemoEnvironment, tenant: Tenant, emulator_factory: Callable[..., Emulator]
) -> None:
    c1 = workload_cluster(emulator_factory, "203.0.113.1", 31001)
    c2 = workload_cluster(emulator_factory, "203.0.113.2", 31002)
    tenant.metal3("shared", WORKLOAD_TEMPLATE, "c1", 0)
    tenant.metal3("shared", WORKLOAD_TEMPLATE, "c2", 1)  # the template's spec.clusterName says c1: not read
    tenant.kubeconfig(c1, "c1")
    tenant.kubeconfig(c2, "c2")
    restore = _set_env(env, INJECTION, "SLIME_SLURM_BINDINGS", f"{cluster.SLURM_BINDINGS},{TENANT}=workload:slurm")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 0, "\n".join(lines)
    assert (
        "ok    bindings    Metal3DataTemplate tenant/shared names the Slinky Controller in namespace slurm of each "
        "Metal3Data's own workload cluster (slurm-controller-cluster=workload): namespace tenant is bound to it "
        "(tenant=workload:slurm in --slurm-bindings)"
    ) in lines
    for name, host, port, index in (("c1", "203.0.113.1", 31001, 0), ("c2", "203.0.113.2", 31002, 1)):
        workload = f"cluster {TENANT}/{name}"
        (slinky,) = [line for line in lines_of(lines, "ok", "slinky") if workload in line]
        assert (
            f"Controller slurm/slurm (slinky.slurm.net/v1beta1, {workload}, for tenant/shared; Metal3Data "
            f"tenant/shared-{index}): its only slurmctld pod slurm/slurm-controller-0 is Running on {host} (reached "
            f"through Secret tenant/{name}-kubeconfig; the webhook's RBAC on it not checked" in slinky
        )
        (key,) = [line for line in lines_of(lines, "ok", "key") if workload in line]
        assert (
            "Secret slurm/slurm-auth-slurm key slurm.key (slurm key, slurmKeyRef of Controller slurm/slurm, "
            f"{workload}): 1024 bytes (read by the webhook with {workload}'s kubeconfig)" in key
        )
        (conf,) = [line for line in lines_of(lines, "ok", "conf-server") if workload in line]
        assert (
            f"Metal3DataTemplate tenant/shared (policy hostIP): a node provisioned now gets slurm_conf_server "
            f"{host}:{port}"
        ) in conf
        assert f"from Controller slurm/slurm in {workload} (Metal3Data tenant/shared-{index})" in conf
    # The demo's own template is still checked in the management cluster, and only there.
    assert any("cluster local, for metal3/slurm-workers)" in line for line in lines_of(lines, "ok", "slinky"))
    assert c1.count_requests(resource="pods") >= 1 and c2.count_requests(resource="pods") >= 1


def test_a_workload_template_without_metal3data_has_nothing_to_check_yet(env: DemoEnvironment, tenant: Tenant) -> None:
    tenant.template("fresh", WORKLOAD_TEMPLATE)
    restore = _set_env(env, INJECTION, "SLIME_SLURM_BINDINGS", f"{cluster.SLURM_BINDINGS},{TENANT}=workload:slurm")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 0, "\n".join(lines)
    assert lines_of(lines, "skip", "slinky") == [
        "skip  slinky      Metal3DataTemplate tenant/fresh (slurm-controller-cluster=workload) has no Metal3Data yet: "
        "nothing to check yet (the Controller of each Metal3Data is looked up in that Metal3Data's own Cluster, its "
        "label cluster.x-k8s.io/cluster-name); run slime-check again once CAPM3 has made one"
    ]
    assert not [line for line in lines if "tenant/fresh" in line and "cluster local" in line], "no silent fallback"


def test_a_template_naming_another_cluster_gets_the_webhooks_refusal(env: DemoEnvironment, tenant: Tenant) -> None:
    data = tenant.metal3("elsewhere", {OPT_IN_LABEL: "slurm", CLUSTER_OVERRIDE_LABEL: "other"}, "c1", 0)
    restore = _set_env(env, INJECTION, "SLIME_SLURM_BINDINGS", f"{cluster.SLURM_BINDINGS},{TENANT}=workload:slurm")
    try:
        code, lines = check(env)
    finally:
        restore()
    refusal = (
        "Metal3DataTemplate tenant/elsewhere has an invalid label slurm-controller-cluster: it names cluster 'other', "
        "but a template chooses only 'local' (the default: the management cluster) or 'workload' (each Metal3Data's "
        "own Cluster, here c1)"
    )
    assert code == 1
    assert lines_of(lines, "FAIL", "slinky") == [
        f"FAIL  slinky      {refusal} (Metal3Data tenant/elsewhere-0): the webhook denies their metaData Secrets -- "
        "fix: label the template slurm-controller-cluster=workload (each Metal3Data's own Cluster) or local (the "
        "management cluster)"
    ]
    # The same words as the webhook's own denial of that Metal3Data's Secret, created as CAPM3 creates it.
    assert refusal in _denial_as_capm3(env, data)


@pytest.mark.parametrize(
    ("case", "expected", "fix"),
    [
        (
            "absent",
            "Secret tenant/c1-kubeconfig (the kubeconfig of Cluster tenant/c1) does not exist",
            "Cluster API writes it once Cluster tenant/c1 has a control plane (kubectl -n tenant get cluster c1); or "
            "label the template slurm-controller-cluster=local for the management cluster",
        ),
        (
            "written by hand",
            "Secret tenant/c1-kubeconfig is not the kubeconfig Cluster API writes for Cluster tenant/c1 (it needs type "
            "cluster.x-k8s.io/secret and label cluster.x-k8s.io/cluster-name=c1)",
            "let Cluster API write it again (kubectl -n tenant delete secret c1-kubeconfig; it is re-created)",
        ),
        (
            "exec",
            "kubeconfig for cluster tenant/c1 refused: users[0].user.exec is not allowed (only server, "
            "certificate-authority-data and inline credentials are accepted: token, client-certificate-data, "
            "client-key-data) (from Secret tenant/c1-kubeconfig)",
            "let Cluster API write it again (kubectl -n tenant delete secret c1-kubeconfig; it is re-created)",
        ),
    ],
)
def test_a_workload_kubeconfig_the_webhook_would_not_use(
    env: DemoEnvironment, tenant: Tenant, tmp_path: Path, case: str, expected: str, fix: str
) -> None:
    ran = tmp_path / "ran"
    tenant.metal3("shared", WORKLOAD_TEMPLATE, "c1", 0)
    if case == "written by hand":
        tenant.kubeconfig("apiVersion: v1\nkind: Config\n", "c1", secret_type="Opaque")
    elif case == "exec":
        command = {"apiVersion": "client.authentication.k8s.io/v1", "command": "touch", "args": [str(ran)]}
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "c1",
            "clusters": [{"name": "c1", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "c1", "user": {"exec": command}}],
            "contexts": [{"name": "c1", "context": {"cluster": "c1", "user": "c1"}}],
        }
        tenant.kubeconfig(yaml.safe_dump(kubeconfig), "c1")
    restore = _set_env(env, INJECTION, "SLIME_SLURM_BINDINGS", f"{cluster.SLURM_BINDINGS},{TENANT}=workload:slurm")
    try:
        code, lines = check(env)
    finally:
        restore()
    assert code == 1
    assert lines_of(lines, "FAIL", "slinky") == [
        f"FAIL  slinky      {expected}: the webhook denies the metaData Secrets of Metal3Data tenant/shared-0 of "
        f"tenant/shared -- fix: {fix}"
    ]
    assert not ran.exists(), "the kubeconfig's exec command ran"


def test_a_kubeconfig_not_readable_by_this_identity_is_not_checked_and_said(
    env: DemoEnvironment, tenant: Tenant
) -> None:
    assert env.emulator is not None
    tenant.metal3("shared", WORKLOAD_TEMPLATE, "c1", 0)
    tenant.kubeconfig("apiVersion: v1\nkind: Config\n", "c1")
    # helm test's ServiceAccount reads no Secret: the API server answers 403.
    hidden = env.emulator.add_fault(
        Fault(method="GET", path_regex=r"/namespaces/tenant/secrets/c1-kubeconfig$", status=403, message="forbidden")
    )
    restore = _set_env(env, INJECTION, "SLIME_SLURM_BINDINGS", f"{cluster.SLURM_BINDINGS},{TENANT}=workload:slurm")
    try:
        code, lines = check(env)
    finally:
        restore()
        hidden.remove()
    assert code == 0, "\n".join(lines)
    assert lines_of(lines, "skip", "slinky") == [
        "skip  slinky      Secret tenant/c1-kubeconfig (the kubeconfig of Cluster tenant/c1) is not readable by this "
        "identity: the Slinky Controller in cluster tenant/c1 not checked (for Metal3Data tenant/shared-0 of "
        "tenant/shared)"
    ]
    assert not [line for line in lines if "tenant/shared" in line and "cluster local" in line], "no silent fallback"


def test_a_kubeconfig_secret_does_not_move_the_lookup(
    env: DemoEnvironment, tenant: Tenant, emulator_factory: Callable[..., Emulator]
) -> None:
    """Cluster API writes a kubeconfig for every Cluster; the demo's template (no slurm-controller-cluster label)
    still has its Controller in the management cluster, as the webhook looks it up."""
    decoy = workload_cluster(emulator_factory, "198.51.100.1", 31003)
    assert env.emulator is not None
    env.emulator.create(kubeconfig_secret(decoy.kubeconfig(), cluster.CAPI_CLUSTER, cluster.METAL3_NAMESPACE))
    try:
        code, lines = check(env)
    finally:
        env.emulator.delete("v1", "Secret", cluster.METAL3_NAMESPACE, f"{cluster.CAPI_CLUSTER}-kubeconfig")
    assert code == 0, "\n".join(lines)
    (line,) = lines_of(lines, "ok", "slinky")
    assert (
        "cluster local, for metal3/slurm-workers): its only slurmctld pod slurm/slurm-controller-0 is Running on "
        "192.0.2.10" in line
    )
    assert decoy.count_requests() == 0


def _patched_template(env: DemoEnvironment, patch: dict[str, Any]) -> Callable[[], None]:
    assert env.emulator is not None
    restore = changed(env, METAL3, "Metal3DataTemplate", cluster.METAL3_NAMESPACE, cluster.TEMPLATE)
    env.emulator.patch(METAL3, "Metal3DataTemplate", cluster.METAL3_NAMESPACE, cluster.TEMPLATE, patch)
    return restore


def _denial_as_capm3(env: DemoEnvironment, data: dict[str, Any]) -> str:
    """The API server's answer when CAPM3 creates the metaData Secret of ``data``: the injection webhook's denial.

    The webhook knows a Metal3Data from its cache; one it has not seen yet is answered as unknown, so the create is
    tried again until the webhook's answer is about the Metal3Data itself."""
    api = impersonating(env.api_client())
    try:
        core = client.CoreV1Api(api)

        def denied() -> str | None:
            try:
                core.create_namespaced_secret(TENANT, cast(Any, metadata_secret(data)))
            except client.ApiException as exc:
                body = str(exc.body)
                return None if "does not name a Metal3Data SliMe can verify" in body else body
            raise AssertionError("the injection webhook admitted the Secret")

        return str(wait_for(denied, 10, "the injection webhook's answer on the Metal3Data", interval=0.2))
    finally:
        api.close()


def test_machines_machine_health_judged_unhealthy_are_named(env: DemoEnvironment) -> None:
    """slime-check reads the condition the leader writes: it names each unhealthy Machine of a slurmHealth pool."""
    assert env.emulator is not None
    secret = env.emulator.get("v1", "Secret", "slurm", "slurm-auth-jwths256")
    assert secret is not None
    fake = FakeSlurmrestd(base64.b64decode(secret["data"]["jwt_hs256.key"]))
    restore = changed(env, "v1", "ConfigMap", NS, "scaling-webhook-configmap")
    configmap = env.emulator.get("v1", "ConfigMap", NS, "scaling-webhook-configmap")
    assert configmap is not None
    mappings: list[dict[str, Any]] = yaml.safe_load(configmap["data"]["mappings"])
    mappings[0]["slurmHealth"] = {
        "slurmrestd": "http://slurm-restapi.slurm:6820",
        "jwtSecret": "slurm/slurm-auth-jwths256",
        "remediate": True,
        "maxUnhealthy": 1,
    }
    configmap["data"]["mappings"] = yaml.safe_dump(mappings)
    env.emulator.update(configmap)
    machine = {
        "apiVersion": cluster.CAPI_VERSION,
        "kind": "Machine",
        "metadata": {
            "name": "md-slurm-workers-x1",
            "namespace": "metal3",
            "labels": {"cluster.x-k8s.io/deployment-name": cluster.MACHINE_DEPLOYMENT},
        },
        "spec": {"clusterName": "c1"},
        "status": {
            "conditions": [
                {
                    "type": "SlurmNodeHealthy",
                    "status": "False",
                    "reason": "NeverRegistered",
                    "message": "provisioned 1200s ago and no Slurm node registered for it",
                    "lastTransitionTime": "2026-11-26T10:00:00Z",
                }
            ]
        },
    }
    try:
        env.emulator.create(machine)
        healthy_before = check(env, "--slurmrestd", f"http://slurm-restapi.slurm:6820={fake.url}")
        env.emulator.delete(cluster.CAPI_VERSION, "Machine", "metal3", "md-slurm-workers-x1")
        healthy_after = check(env, "--slurmrestd", f"http://slurm-restapi.slurm:6820={fake.url}")
    finally:
        restore()
        fake.stop()
    code, lines = healthy_before
    assert code == 0, "\n".join(lines)
    assert lines_of(lines, "warn", "health") == [
        "warn  health      MachineDeployment metal3/md-slurm-workers (slurmHealth, remediate, maxUnhealthy 1): 1 of 1 "
        "Machine(s) are not working Slurm nodes: md-slurm-workers-x1 (NeverRegistered: provisioned 1200s ago and no "
        "Slurm node registered for it) -- fix: docs/operations.md, 'A Machine is not a working Slurm node'"
    ]
    assert "for mappings[0] slurmHealth" in lines_of(lines, "ok", "slurmrestd")[0]
    assert [line.split(": ", 1)[1] for line in lines_of(healthy_after[1], "ok", "health")] == [
        "none of its 0 Machine(s) is judged unhealthy"
    ]
