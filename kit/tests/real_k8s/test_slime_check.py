"""``slime-check`` on a real install: green as installed, each check broken once with its line, and ``helm test``.

The module's own stack (:func:`testbed.scenarios.stack.start_stack`: kube-apiserver v1.36.4, the chart
installed with ``helm``, both webhooks as the chart's pods with the client certificate enforced)
plus what an operator's management cluster has: CAPM3's Deployment (labelled as clusterctl
labels it), an opted-in Metal3DataTemplate with a Metal3Data, Slinky's Controller, slurmctld and
its NodePort. slime-check runs as the operator runs it: the console script with the admin
kubeconfig. Each test breaks one thing the way it breaks in a cluster, checks the line, and
puts it back. The last runs ``helm test``: Helm creates the chart's test Pod, the tier plays the
kubelet (the Pod's container run from the product image with its ServiceAccount's token, its exit
reported as the Pod's phase), and the Pod's RBAC is the chart's, checked by the real authorizer.

The slurmrestd check talks to the fake slurmrestd (conformance-tested against real slurmrestd
24.11 in the real-Slurm tier); this tier has no Slurm.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs.devcerts import create_ca
from common.names import ACTIVE_CONTROLLER_LABEL, CONF_SERVER_ANNOTATION, OPT_IN_LABEL
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import SLIME_NAMESPACE, capm3_deployment
from testbed.framework.world import seed_metal3
from testbed.scenarios.stack import Stack, start_stack

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(300)]

NS = SLIME_NAMESPACE
TEMPLATE = "slurm-workers"
ADMISSION = "admissionregistration.k8s.io/v1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("slime-check"))
    try:
        api = stack.api
        seed_metal3(
            api,
            "metal3",
            "bm-cluster",
            TEMPLATE,
            {OPT_IN_LABEL: "slurm", "cluster.x-k8s.io/cluster-name": "bm-cluster"},
        )
        api.create(capm3_deployment())
        mark_webhook_pods_ready(stack)
        stack.wait_for(lambda: (stack.mirror() or {}).get("spec", {}).get("replicas") == 2, 60, "the mirror's adoption")
        yield stack
    finally:
        stack.stop_webhooks()
        stack.cp.stop()


def mark_webhook_pods_ready(stack: Stack) -> None:
    """The kubelet's report for the pods kube-controller-manager made for the webhook Deployments: the tier
    runs one of each (podman), so each Deployment's pods are reported Running and Ready, and its status
    (the Deployment controller's) reads 1/1 as in a cluster."""
    for component in ("injection", "scaling"):
        name = stack.release.deployment(component)["metadata"]["name"]
        selector = f"app.kubernetes.io/component={component}-webhook"
        stack.wait_for(lambda s=selector: bool(_pods(stack, s)), 60, f"kube-controller-manager to create {name}'s pod")
        for pod in _pods(stack, selector):
            status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            stack.api.patch("v1", "Pod", NS, pod["metadata"]["name"], {"status": status}, "status")
        stack.wait_for(lambda n=name: _ready(stack, n), 60, f"Deployment {name} to count its ready pod")


def _pods(stack: Stack, selector: str) -> list[dict[str, Any]]:
    return stack.api.list("v1", "Pod", NS, label_selector=selector)


def _ready(stack: Stack, name: str) -> bool:
    deployment = stack.api.get("apps/v1", "Deployment", NS, name) or {}
    return int((deployment.get("status") or {}).get("readyReplicas") or 0) >= 1


def slime_check(stack: Stack, *args: str) -> tuple[int, list[str]]:
    """The console script, as an operator runs it with the admin kubeconfig."""
    command = shutil.which("slime-check", path=str(Path(sys.executable).parent)) or "slime-check"
    proc = subprocess.run(
        [command, "--kubeconfig", str(stack.cp.kubeconfig), "--namespace", NS, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    EVIDENCE.add_text("slime-check (real_k8s)", proc.stdout + proc.stderr)
    assert proc.stderr == "", proc.stderr
    return proc.returncode, proc.stdout.splitlines()


def lines_of(lines: list[str], status: str, check: str) -> list[str]:
    return [line for line in lines if line.split()[:2] == [status, check]]


def kept(stack: Stack, api_version: str, kind: str, namespace: str, name: str) -> Callable[[], None]:
    """Remember an object; the returned callable puts it back as it was (re-created when it was deleted)."""
    saved = stack.api.get(api_version, kind, namespace, name)
    assert saved is not None, f"{kind} {namespace}/{name} not found"
    keep = ("name", "namespace", "labels", "annotations", "ownerReferences")

    def restore() -> None:
        body = {k: v for k, v in saved.items() if k != "status"}
        body["metadata"] = {k: v for k, v in saved["metadata"].items() if k in keep}
        current = stack.api.get(api_version, kind, namespace, name)
        if current is None:
            stack.api.create(body)
            return
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        stack.cp.kubectl("replace", "-f", "-", stdin=json.dumps(body))

    return restore


def test_a_fresh_install_passes_every_check(stack: Stack) -> None:
    code, lines = slime_check(stack)
    assert code == 0, "\n".join(lines)
    assert not [line for line in lines if line.startswith(("FAIL", "warn"))], "\n".join(lines)
    for check, fragment in (
        ("release", "injection-webhook Deployment slime-system/slime-injection-webhook"),
        ("api", "Slinky: controllers.slinky.slurm.net served at v1beta1"),
        ("slinky", "its only slurmctld pod slurm/slurm-controller-0 is Running on 192.0.2.10"),
        ("key", "the injection webhook's ServiceAccount may list and watch it"),
        ("conf-server", "a node provisioned now gets slurm_conf_server 192.0.2.10:30817"),
        ("capm3", "runs as system:serviceaccount:capm3-system:capm3-manager, which injection.allowedRequesters lists"),
        ("mapping", "mirror slime-system/mirror-a -> MachineDeployment metal3/md-a: mirror 2, MachineDeployment 2"),
        (
            "webhook",
            "MutatingWebhookConfiguration slime-injection-webhook: its caBundle verifies the certificate served at "
            "localhost:",
        ),
        ("webhook", "ValidatingWebhookConfiguration slime-scaling-webhook: its caBundle verifies"),
        ("admission", "injection-webhook: the API server called it"),
        ("admission", "scaling-webhook: the API server called it"),
    ):
        assert any(fragment in line for line in lines_of(lines, "ok", check)), f"{check}: {fragment}\n" + "\n".join(
            lines
        )


def test_an_api_that_is_not_served(stack: Stack) -> None:
    crd = "controllers.slinky.slurm.net"
    stack.cp.kubectl(
        "patch",
        "crd",
        crd,
        "--type=json",
        "-p",
        json.dumps([{"op": "replace", "path": "/spec/versions/0/served", "value": False}]),
    )
    try:
        stack.wait_for(
            lambda: "slinky.slurm.net" not in stack.cp.kubectl("api-versions").stdout,
            30,
            "slinky.slurm.net to leave discovery",
        )
        code, lines = slime_check(stack)
    finally:
        stack.cp.kubectl(
            "patch",
            "crd",
            crd,
            "--type=json",
            "-p",
            json.dumps([{"op": "replace", "path": "/spec/versions/0/served", "value": True}]),
        )
        stack.wait_for(
            lambda: "slinky.slurm.net/v1beta1" in stack.cp.kubectl("api-versions").stdout, 30, "slinky.slurm.net back"
        )
    assert code == 1
    assert (
        "FAIL  api         Slinky (controllers.slinky.slurm.net, needed by injection): slinky.slurm.net is not served "
        "by this cluster -- fix: install Slinky's slurm-operator with its CRDs where slurmctld runs"
    ) in lines


def _patch_env(stack: Stack, component: str, name: str, value: str) -> Callable[[], None]:
    deployment = stack.release.deployment(component)["metadata"]["name"]
    restore = kept(stack, "apps/v1", "Deployment", NS, deployment)
    stack.cp.kubectl("-n", NS, "set", "env", f"deployment/{deployment}", f"{name}={value}")
    return restore


def test_a_selector_that_matches_no_slurmctld(stack: Stack) -> None:
    restore = _patch_env(stack, "injection", "SLIME_CONTROLLER_SELECTOR", "app.kubernetes.io/name=slurm-ctld")
    try:
        code, lines = slime_check(stack)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "slinky")
    assert "no slurmctld pod matches app.kubernetes.io/name=slurm-ctld in namespace slurm of cluster local" in line


def test_slinky_high_availability_the_active_slurmctld_or_none(stack: Stack) -> None:
    """Slinky >= 1.3 runs a standby slurmctld: the line names the pod the webhook would choose (the one
    labelled active), and fails as the webhook denies while no pod (a failover) is labelled."""
    primary = stack.api.get("v1", "Pod", "slurm", "slurm-controller-0")
    assert primary is not None
    keep = ("labels", "ownerReferences", "namespace")
    standby = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **{k: v for k, v in primary["metadata"].items() if k in keep},
            "name": "slurm-controller-1",
        },
        "spec": {**primary["spec"], "nodeName": "k8s-node-2"},
        "status": {"phase": "Running", "hostIP": "192.0.2.11", "podIP": "10.244.1.18"},
    }
    stack.api.create(standby)
    try:
        failover, failover_lines = slime_check(stack)
        stack.api.patch(
            "v1", "Pod", "slurm", "slurm-controller-1", {"metadata": {"labels": {ACTIVE_CONTROLLER_LABEL: "true"}}}
        )
        code, lines = slime_check(stack)
    finally:
        stack.cp.kubectl("-n", "slurm", "delete", "pod", "slurm-controller-1", "--grace-period=0", "--force")
    assert failover == 1
    (line,) = lines_of(failover_lines, "FAIL", "slinky")
    assert (
        "Controller slurm/slurm runs several slurmctld pods (slurm-controller-0, slurm-controller-1) and none is "
        f"labelled {ACTIVE_CONTROLLER_LABEL}=true (a failover in progress?): nodes provisioned now would be denied"
    ) in line
    assert code == 0, "\n".join(lines)
    (line,) = lines_of(lines, "ok", "slinky")
    assert (
        f"of 2 slurmctld pods, the active ({ACTIVE_CONTROLLER_LABEL}=true) slurmctld pod slurm/slurm-controller-1 "
        "is Running on 192.0.2.11"
    ) in line
    (line,) = lines_of(lines, "ok", "conf-server")
    assert "a node provisioned now gets slurm_conf_server 192.0.2.11:30817" in line
    assert (
        "/etc/hosts maps slurm-controller-0.slurm-controller-internal.slurm, slurm-controller-0, "
        "slurm-controller-1.slurm-controller-internal.slurm, slurm-controller-1, slurm-controller.slurm to 192.0.2.11"
    ) in line


def test_a_key_secret_that_is_gone(stack: Stack) -> None:
    name = stack.slurm.key_secret or "slurm-auth-slurm"
    restore = kept(stack, "v1", "Secret", "slurm", name)
    stack.api.delete("v1", "Secret", "slurm", name)
    try:
        code, lines = slime_check(stack)
    finally:
        restore()
    assert code == 1
    assert lines_of(lines, "FAIL", "key") == [
        f"FAIL  key         Secret slurm/{name} key slurm.key (slurm key, slurmKeyRef of Controller slurm/slurm, "
        "cluster local) does not exist -- fix: create it, or correct Controller.spec.slurmKeyRef"
    ]


def test_a_policy_nodes_could_not_be_given(stack: Stack) -> None:
    group = "infrastructure.cluster.x-k8s.io/v1beta1"
    stack.api.patch(
        group,
        "Metal3DataTemplate",
        "metal3",
        TEMPLATE,
        {"metadata": {"annotations": {CONF_SERVER_ANNOTATION: "service"}}},
    )
    try:
        code, lines = slime_check(stack)
    finally:
        stack.api.patch(
            group,
            "Metal3DataTemplate",
            "metal3",
            TEMPLATE,
            {"metadata": {"annotations": {CONF_SERVER_ANNOTATION: None}}},
        )
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "conf-server")
    assert (
        "Metal3DataTemplate metal3/slurm-workers (policy service): nodes provisioned now would be denied: NodePort "
        "Service slurm/" in line
    )
    assert "needs stable node addresses to point nodes at, and none are configured" in line


def test_capm3_running_as_another_identity(stack: Stack) -> None:
    restore = kept(stack, "apps/v1", "Deployment", "capm3-system", "capm3-controller-manager")
    stack.api.patch(
        "apps/v1",
        "Deployment",
        "capm3-system",
        "capm3-controller-manager",
        {"spec": {"template": {"spec": {"serviceAccountName": "manager"}}}},
    )
    try:
        code, lines = slime_check(stack)
    finally:
        restore()
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "capm3")
    assert "runs as system:serviceaccount:capm3-system:manager, which injection.allowedRequesters" in line
    assert "--set 'injection.allowedRequesters={system:serviceaccount:capm3-system:manager}'" in line


def test_a_machine_deployment_with_another_writer(stack: Stack) -> None:
    group = "cluster.x-k8s.io/v1beta2"
    note = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
    stack.api.patch(group, "MachineDeployment", "metal3", "md-a", {"metadata": {"annotations": {note: "5"}}})
    try:
        code, lines = slime_check(stack)
    finally:
        stack.api.patch(group, "MachineDeployment", "metal3", "md-a", {"metadata": {"annotations": {note: None}}})
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "mapping")
    assert (
        "the MachineDeployment is a cluster-autoscaler node group "
        "(cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size)" in line
    )


def test_a_ca_bundle_that_does_not_verify(stack: Stack, tmp_path: Path) -> None:
    name = stack.release.deployment("injection")["metadata"]["name"]
    config = stack.api.get(ADMISSION, "mutatingwebhookconfigurations", "", name)
    assert config is not None
    bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
    other = base64.b64encode(create_ca(tmp_path / "other").pem).decode()
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": other}]
    stack.cp.kubectl("patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))
    try:
        code, lines = slime_check(stack)
    finally:
        patch[0]["value"] = bundle
        stack.cp.kubectl("patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "webhook")
    assert (
        f"MutatingWebhookConfiguration {name}: the caBundle does not verify the certificate served at localhost:"
        in line
    )
    # The API server sees it too: the dry run fails calling the webhook, with the x509 error.
    (admission,) = lines_of(lines, "FAIL", "admission")
    assert "failed calling webhook" in admission and "x509" in admission


def test_a_webhook_that_does_not_match_its_objects(stack: Stack) -> None:
    name = stack.release.deployment("injection")["metadata"]["name"]
    config = stack.api.get(ADMISSION, "mutatingwebhookconfigurations", "", name)
    assert config is not None
    exempt = config["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"]
    patch = [
        {
            "op": "replace",
            "path": "/webhooks/0/namespaceSelector/matchExpressions/0/values",
            "value": [*exempt, "metal3"],
        }
    ]
    stack.cp.kubectl("patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))
    try:
        code, lines = slime_check(stack)
    finally:
        patch[0]["value"] = exempt
        stack.cp.kubectl("patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))
    assert code == 1
    (line,) = lines_of(lines, "FAIL", "admission")
    assert (
        "injection-webhook: the API server admitted a server-side dry run of a metaData Secret in metal3 without "
        "calling the webhook" in line
    )


def _node_demand(stack: Stack, slurmrestd: str) -> Callable[[], None]:
    name = stack.release.values["scaling"].get("configMapName", "scaling-webhook-configmap")
    restore = kept(stack, "v1", "ConfigMap", NS, name)
    configmap = stack.api.get("v1", "ConfigMap", NS, name)
    assert configmap is not None
    mappings = yaml.safe_load(configmap["data"]["mappings"])
    mappings[0]["nodeDemand"] = {
        "partition": "batch",
        "slurmrestd": slurmrestd,
        "jwtSecret": "slurm/slurm-auth-jwths256",
    }
    stack.api.patch("v1", "ConfigMap", NS, name, {"data": {"mappings": yaml.safe_dump(mappings)}})
    return restore


def test_slurmrestd_with_the_jwt_and_refusing_it(stack: Stack) -> None:
    secret = stack.api.get("v1", "Secret", "slurm", "slurm-auth-jwths256")
    assert secret is not None
    right = FakeSlurmrestd(base64.b64decode(secret["data"]["jwt_hs256.key"]))
    wrong = FakeSlurmrestd(b"w" * 32)
    restore = _node_demand(stack, "http://slurm-restapi.slurm:6820")
    try:
        good, good_lines = slime_check(stack, "--slurmrestd", f"http://slurm-restapi.slurm:6820={right.url}")
        bad, bad_lines = slime_check(stack, "--slurmrestd", f"http://slurm-restapi.slurm:6820={wrong.url}")
    finally:
        restore()
        right.stop()
        wrong.stop()
    (line,) = lines_of(good_lines, "ok", "slurmrestd")
    assert "with a JWT signed by Secret slurm/slurm-auth-jwths256 as user slurm; data parser v0.0.45" in line
    assert good == 0, "\n".join(good_lines)
    assert bad == 1
    (line,) = lines_of(bad_lines, "FAIL", "slurmrestd")
    assert "refused the JWT (511) twice" in line


def test_a_release_that_is_not_there(stack: Stack) -> None:
    code, lines = slime_check(stack, "--release", "slurm")
    assert code == 1 and lines_of(lines, "FAIL", "release")


def test_helm_test_runs_slime_check_in_the_cluster_with_the_charts_rbac(stack: Stack) -> None:
    code, output, completed = stack.release.test(stack.run_hook)
    EVIDENCE.add_text("helm test (real_k8s)", output + completed.logs)
    assert completed.exit_code == 0, completed.logs
    assert code == 0, output
    assert "Phase:          Succeeded" in output
    lines = completed.logs.splitlines()
    # No Secret is readable by the hook's ServiceAccount: the webhook's rights are asked of the API server instead.
    (key,) = lines_of(lines, "ok", "key")
    assert "not readable by this identity; the injection webhook's ServiceAccount may list and watch it" in key
    assert len(lines_of(lines, "ok", "webhook")) == 2, completed.logs
    skipped = lines_of(lines, "skip", "admission")
    assert len(skipped) == 2 and all("(helm test's ServiceAccount may not, on purpose)" in s for s in skipped)
    assert lines_of(lines, "ok", "capm3") and lines_of(lines, "ok", "mapping") and lines_of(lines, "ok", "conf-server")
