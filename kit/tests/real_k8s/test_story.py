"""The story through a real kube-apiserver: the chart's webhooks, as the chart's pods, on CAPM3- and CAPI-shaped
objects.

The webhooks are reached the way a cluster reaches them (the webhook configurations as the chart
rendered them, a Service, TLS checked against the chart-generated CA, the chart-generated client
certificate presented through ``--admission-control-config-file``), and every API call they make
is checked by the real RBAC of the chart's ServiceAccounts.
"""

from __future__ import annotations

import base64
import copy
import json
import time

import pytest
import yaml

from common.names import CAPM3_MANAGER_USERNAME
from testbed.framework.objects import metadata_secret
from testbed.framework.reviews import scale_request, secret_request
from testbed.framework.world import seed_metal3
from testbed.scenarios.stack import MD_NAME, MD_NAMESPACE, MD_START, MIRROR, Stack, apiserver_webhook_calls, send_review

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(300)]

INJECTION, SCALING = "injection.webhook.slime", "scaling.webhook.slime"
JOIN_KEYS = {"slurm_controller_host", "slurm_controller_port", "slurm_conf_server", "slurm_key_base64"}
OPT_IN = {"slurm-controller-namespace": "slurm"}
AS_CAPM3 = f"--as={CAPM3_MANAGER_USERNAME}"  # CAPM3 creates these Secrets as its own ServiceAccount


def stored_metadata(stack: Stack, namespace: str, name: str) -> dict[str, str]:
    secret = stack.api.get("v1", "Secret", namespace, name)
    assert secret is not None, f"Secret {namespace}/{name} was not stored"
    assert "stringData" not in secret
    loaded: dict[str, str] = yaml.safe_load(base64.b64decode(secret["data"]["metaData"]))
    return loaded


def check_join_data(stack: Stack, metadata: dict[str, str]) -> None:
    assert set(metadata) >= JOIN_KEYS, sorted(metadata)
    assert metadata["slurm_controller_host"] == stack.slurm.host_ip
    assert str(metadata["slurm_controller_port"]) == "30817"  # the NodePort Service's nodePort
    assert metadata["slurm_conf_server"] == f"{stack.slurm.host_ip}:30817"
    # Compared, never printed: a mismatch says only that it differs.
    assert base64.b64decode(metadata["slurm_key_base64"]) == stack.slurm.key, (
        "slurm_key_base64 is not the Controller's slurm.key"
    )


def test_the_chart_is_installed_and_routed_to_the_pods(stack: Stack) -> None:
    services = {s["metadata"]["name"]: s["spec"] for s in stack.api.list("v1", "Service", stack.namespace)}
    for component in ("injection", "scaling"):
        spec = services[stack.release.service_name(component)]
        assert (spec["type"], spec["externalName"]) == ("ExternalName", "localhost")
        assert stack.pods[component].ready()
    hooks = stack.cp.kubectl(
        "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-o", "name"
    ).stdout.split()
    assert sorted(hooks) == [
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/slime-injection-webhook",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/slime-scaling-webhook",
    ]
    # The pods run as the chart says: uid 65532, read-only root filesystem (the image's user is the same).
    env = {e["name"] for e in stack.release.deployment("injection")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "SLIME_CLIENT_CA_FILE" in env, (
        "admissionAuth enforced: the webhooks require kube-apiserver's client certificate"
    )


def test_a_new_mapping_adopts_the_machine_deployment_into_the_mirror(stack: Stack) -> None:
    """The chart's mirror starts at the API server's default of 1; the leader sets it to the MachineDeployment's 2."""

    def adopted() -> bool:
        mirror = stack.mirror() or {}
        annotations = mirror.get("metadata", {}).get("annotations") or {}
        return (
            mirror.get("spec", {}).get("replicas") == MD_START
            and annotations.get("slime/machine-deployment") == f"{MD_NAMESPACE}/{MD_NAME}"
        )

    stack.wait_for(adopted, 30, "the mirror to adopt the MachineDeployment's replicas")
    assert stack.md_replicas() == MD_START, "adoption must never change the MachineDeployment"


@pytest.mark.parametrize("field", ["data", "stringData"])
def test_capm3_metadata_secret_stored_with_the_join_data(stack: Stack, field: str) -> None:
    """CAPM3 creates `<machine>-metadata` owned by its Metal3Data; what etcd stores carries the join data."""
    index = 1 if field == "data" else 2
    _, data = seed_metal3(stack.api, template_labels=OPT_IN, index=index)
    secret = metadata_secret(data, machine=f"m3m-{index}")
    if field == "stringData":  # kube-apiserver folds stringData into data before admission
        secret["stringData"] = {"metaData": base64.b64decode(secret.pop("data")["metaData"]).decode()}
    before = apiserver_webhook_calls(stack.cp, INJECTION).get("200", 0)
    stack.api.as_user(CAPM3_MANAGER_USERNAME).create(secret)
    metadata = stored_metadata(stack, secret["metadata"]["namespace"], secret["metadata"]["name"])
    check_join_data(stack, metadata)
    assert metadata["local-hostname"] == f"m3m-{index}", "CAPM3's own keys are kept"
    assert apiserver_webhook_calls(stack.cp, INJECTION).get("200", 0) > before


@pytest.mark.parametrize("mismatch", ["wrong-uid", "other-namespace"])
def test_a_secret_whose_owner_does_not_match_is_refused(stack: Stack, mismatch: str) -> None:
    _, data = seed_metal3(stack.api, template_labels=OPT_IN, index=3 if mismatch == "wrong-uid" else 6)
    secret = metadata_secret(data, machine=f"m3m-{mismatch}")
    if mismatch == "wrong-uid":
        secret["metadata"]["ownerReferences"][0]["uid"] = "00000000-0000-4000-8000-000000000000"
    else:
        stack.cp.kubectl("create", "namespace", "elsewhere", check=False)
        secret["metadata"]["namespace"] = "elsewhere"
    expected = "its owner reference does not name a Metal3Data SliMe can verify"  # one answer for every case
    proc = stack.cp.kubectl("create", AS_CAPM3, "-f", "-", stdin=yaml.safe_dump(secret), check=False)
    assert proc.returncode != 0
    assert f'admission webhook "{INJECTION}" denied the request' in proc.stderr and expected in proc.stderr, proc.stderr
    assert stack.api.get("v1", "Secret", secret["metadata"]["namespace"], secret["metadata"]["name"]) is None


def test_a_denied_injection_surfaces_in_kubectls_error(stack: Stack) -> None:
    """A template opted in to a namespace without slurmctld (its own, which needs no binding): the Secret is
    refused, and kubectl prints why."""
    _, data = seed_metal3(
        stack.api, template="lost-template", template_labels={"slurm-controller-namespace": "metal3"}, index=4
    )
    secret = metadata_secret(data, machine="m3m-lost")
    proc = stack.cp.kubectl("create", AS_CAPM3, "-f", "-", stdin=yaml.safe_dump(secret), check=False)
    assert proc.returncode != 0
    assert (
        f'admission webhook "{INJECTION}" denied the request: cannot inject Slurm join data into Secret '
        "metal3/m3m-lost-metadata" in proc.stderr
    ), proc.stderr


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run=server", "create"])
def test_no_key_for_anyone_but_capm3_and_never_in_a_dry_run(stack: Stack, dry_run: bool) -> None:
    """A tenant who may create Secrets asks for one owned by a real Metal3Data (real uid)."""
    _, data = seed_metal3(stack.api, template_labels=OPT_IN, index=11 if dry_run else 12)
    secret = metadata_secret(data, machine="m3m-probe-dry" if dry_run else "m3m-probe")
    stack.cp.kubectl("create", "namespace", "tenant", check=False)
    # The tenant: a ServiceAccount allowed to create Secrets in the Metal3 namespace, nothing more.
    stack.cp.kubectl("create", "serviceaccount", "ci-robot", "-n", "tenant", check=False)
    stack.cp.kubectl(
        "create", "role", "secrets-writer", "-n", "metal3", "--verb=create,get", "--resource=secrets", check=False
    )
    stack.cp.kubectl(
        "create",
        "rolebinding",
        "ci-robot-secrets",
        "-n",
        "metal3",
        "--role=secrets-writer",
        "--serviceaccount=tenant:ci-robot",
        check=False,
    )
    tenant = "--as=system:serviceaccount:tenant:ci-robot"
    flags = ["--dry-run=server", "-o", "json"] if dry_run else ["-o", "json"]
    proc = stack.cp.kubectl("create", tenant, *flags, "-f", "-", stdin=yaml.safe_dump(secret))
    answered = yaml.safe_load(base64.b64decode(json.loads(proc.stdout)["data"]["metaData"]))
    assert not JOIN_KEYS & set(answered), sorted(answered)
    assert "SliMe added no Slurm join data" in proc.stderr  # the admission warning, as kubectl prints it
    if not dry_run:
        assert not JOIN_KEYS & set(stored_metadata(stack, "metal3", secret["metadata"]["name"]))
        stack.cp.kubectl("delete", "secret", "-n", "metal3", secret["metadata"]["name"])
    # The same, dry run or not, as CAPM3: only the stored create carries the key.
    proc = stack.cp.kubectl("create", AS_CAPM3, *flags, "-f", "-", stdin=yaml.safe_dump(secret))
    answered = yaml.safe_load(base64.b64decode(json.loads(proc.stdout)["data"]["metaData"]))
    if dry_run:
        assert not JOIN_KEYS & set(answered)
    else:
        check_join_data(stack, answered)


def test_kubectl_scale_moves_the_machine_deployment(stack: Stack) -> None:
    test_a_new_mapping_adopts_the_machine_deployment_into_the_mirror(stack)
    before = apiserver_webhook_calls(stack.cp, SCALING).get("200", 0)
    stack.cp.kubectl("-n", stack.namespace, "scale", "deployment", MIRROR, "--replicas=3")
    stack.wait_for(lambda: stack.md_replicas() == 3, 15, "the MachineDeployment to follow the mirror to 3")
    assert apiserver_webhook_calls(stack.cp, SCALING).get("200", 0) > before, (
        "kube-apiserver called the scaling webhook"
    )
    scale = stack.api.get("cluster.x-k8s.io/v1beta2", "machinedeployments", MD_NAMESPACE, f"{MD_NAME}/scale")
    assert scale is not None and scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3


def test_server_side_dry_run_changes_nothing(stack: Stack) -> None:
    stack.wait_for(lambda: stack.md_replicas() == 3, 15, "the MachineDeployment at 3")
    proc = stack.cp.kubectl("-n", stack.namespace, "scale", "deployment", MIRROR, "--replicas=5", "--dry-run=server")
    assert "server dry run" in proc.stdout
    time.sleep(3)
    assert (stack.mirror() or {})["spec"]["replicas"] == 3
    assert stack.md_replicas() == 3


def test_a_hand_edit_of_the_machine_deployment_is_healed(stack: Stack) -> None:
    stack.wait_for(lambda: stack.md_replicas() == 3, 15, "the MachineDeployment at 3")
    stack.api.patch("cluster.x-k8s.io/v1beta2", "MachineDeployment", MD_NAMESPACE, MD_NAME, {"spec": {"replicas": 7}})
    stack.wait_for(lambda: stack.md_replicas() == 3, 15, "the hand edit to be healed back to the mirror's 3")


def test_a_forged_review_sent_to_the_webhook_moves_nothing(stack: Stack) -> None:
    """Straight to the pod, not through the API server: without the client certificate TLS refuses it;
    with it (stolen), a consistent-looking scale is answered but nothing moves, a stale one is refused."""
    import httpx

    stack.wait_for(lambda: stack.md_replicas() == 3, 15, "the MachineDeployment at 3")
    with pytest.raises(httpx.HTTPError):
        send_review(stack, "scaling", scale_request(stack.namespace, MIRROR, 9, old_replicas=3), with_certificate=False)
    forged = send_review(stack, "scaling", scale_request(stack.namespace, MIRROR, 9, old_replicas=3))
    assert "patch" not in forged
    stale = send_review(stack, "scaling", scale_request(stack.namespace, MIRROR, 9, old_replicas=1))
    assert stale["allowed"] is False and stale["status"]["code"] == 409
    time.sleep(3)
    assert stack.md_replicas() == 3 and (stack.mirror() or {})["spec"]["replicas"] == 3, (
        "a review is not a stored scale"
    )


def test_a_forged_injection_review_gets_no_join_data(stack: Stack) -> None:
    _, data = seed_metal3(stack.api, template_labels=OPT_IN, index=5)
    forged = copy.deepcopy(metadata_secret(data, machine="m3m-forged"))
    forged["metadata"]["ownerReferences"][0]["uid"] = "11111111-1111-4111-8111-111111111111"
    answer = send_review(stack, "injection", secret_request(forged))
    assert answer["allowed"] is False and "patch" not in answer
