"""kube-apiserver and etcd killed mid-run (runs after test_story.py, on the same stack); then the RBAC audit.

While the control plane is down the webhooks answer from their caches (an admission needs no API
call); once it is back their watches reconnect on their own, and the next changes converge. The
last test reads kube-apiserver's audit log: every call the chart's ServiceAccounts made, none of
which may have been forbidden. That is "exactly the chart's RBAC": a missing rule shows up
there (and usually as a broken story before it).
"""

from __future__ import annotations

import base64
import time
from collections import Counter

import pytest
import yaml

from common.names import CAPM3_MANAGER_USERNAME
from testbed.framework.objects import metadata_secret
from testbed.framework.reviews import scale_request, secret_request
from testbed.framework.world import seed_metal3
from testbed.scenarios.stack import MD_NAME, MD_NAMESPACE, MIRROR, Stack, send_review

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(300)]
OPT_IN = {"slurm-controller-namespace": "slurm"}


def test_kill_and_restart_the_api_server_and_etcd(stack: Stack) -> None:
    _, data = seed_metal3(stack.api, template_labels=OPT_IN, index=20)
    stack.wait_for(
        lambda: stack.md_replicas() == (stack.mirror() or {}).get("spec", {}).get("replicas"),
        15,
        "mirror and MachineDeployment agree",
    )
    replicas = stack.md_replicas()
    assert replicas is not None
    time.sleep(1)  # the new Metal3Data reaches the injection webhook's cache through its watch
    send_review(
        stack, "scaling", scale_request(stack.namespace, MIRROR, replicas, old_replicas=replicas)
    )  # TLS material read now

    stack.cp.kill("kube-apiserver")
    stack.cp.kill("etcd")
    # Down: the webhooks still answer, from their caches.
    answer = send_review(stack, "injection", secret_request(metadata_secret(data, machine="m3m-outage")))
    assert answer["allowed"] is True and answer.get("patchType") == "JSONPatch", answer.get("status")
    patched = yaml.safe_load(
        base64.b64decode(base64.b64decode(answer["patch"]).decode().split('"value":"', 1)[1].split('"', 1)[0])
    )
    assert patched["slurm_controller_host"] == stack.slurm.host_ip
    scale = send_review(stack, "scaling", scale_request(stack.namespace, MIRROR, replicas, old_replicas=replicas))
    assert scale["allowed"] is True
    for pod in stack.pods.values():
        assert pod.running()

    stack.cp.start_etcd()
    stack.cp.start_apiserver()
    # Up again: the same services, their watches reconnected; the next changes go through and converge.
    stack.cp.kubectl("-n", stack.namespace, "scale", "deployment", MIRROR, f"--replicas={replicas + 1}")
    stack.wait_for(
        lambda: stack.md_replicas() == replicas + 1, 30, "the MachineDeployment to follow the mirror after the restart"
    )
    stack.api.patch(
        "v1", "Pod", "slurm", "slurm-controller-0", {"status": {"hostIP": "192.0.2.99"}}, subresource="status"
    )
    _, after = seed_metal3(stack.api, template_labels=OPT_IN, index=21)
    secret = metadata_secret(after, machine="m3m-after")

    def injected_with_the_new_host() -> bool:
        stack.api.delete("v1", "Secret", secret["metadata"]["namespace"], secret["metadata"]["name"])
        stack.api.as_user(CAPM3_MANAGER_USERNAME).create(secret)
        stored = stack.api.get("v1", "Secret", secret["metadata"]["namespace"], secret["metadata"]["name"]) or {}
        return bool(
            yaml.safe_load(base64.b64decode(stored["data"]["metaData"])).get("slurm_controller_host") == "192.0.2.99"
        )

    stack.wait_for(
        injected_with_the_new_host, 30, "a Secret injected with slurmctld's new hostIP (the pod watch reconnected)"
    )
    stack.api.patch("cluster.x-k8s.io/v1beta2", "MachineDeployment", MD_NAMESPACE, MD_NAME, {"spec": {"replicas": 0}})
    stack.wait_for(
        lambda: stack.md_replicas() == replicas + 1,
        30,
        "a hand edit after the restart healed (the MachineDeployment watch reconnected)",
    )


def test_the_services_never_needed_a_permission_the_chart_does_not_grant(stack: Stack) -> None:
    calls = [
        e
        for e in stack.cp.audit_events()
        if e["user"]["username"].startswith(f"system:serviceaccount:{stack.namespace}:")
    ]
    assert calls, "the audit log has no call by the chart's ServiceAccounts"
    refused = [e for e in calls if e.get("responseStatus", {}).get("code") == 403]
    # While kube-apiserver starts (spawn to /readyz) its RBAC authorizer may not have synced and
    # refuses everything; clients retry. Those refusals say nothing about the chart's rules.
    forbidden = Counter(
        f"{e['user']['username'].rsplit(':', 1)[1]} {e['verb']} {e['requestURI'].split('?', 1)[0]}"
        for e in refused
        if not stack.cp.during_startup(e["requestReceivedTimestamp"])
    )
    assert not forbidden, "calls the chart's RBAC refused:\n" + "\n".join(
        f"{call} ({n}x)" for call, n in sorted(forbidden.items())
    )
    distinct = Counter(
        (
            e["user"]["username"].rsplit(":", 1)[1],
            e["verb"],
            (e.get("objectRef") or {}).get("resource", e["requestURI"]),
        )
        for e in calls
    )
    assert {who for who, _, _ in distinct} == {"slime-injection-webhook", "slime-scaling-webhook"}
