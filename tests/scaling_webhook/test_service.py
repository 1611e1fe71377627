"""The scaling webhook for real: TLS, AdmissionReview v1, the kubernetes client and the API emulator.

Mirror scales go through the emulator's API the way KEDA's HPA sends them: the emulator calls the
webhook (``ScaleWebhookRoute``), stores the mirror when it is allowed, and the webhook's leader
moves the MachineDeployment from the stored mirror. Reviews sent straight to the webhook are what
an attacker (or a confused client) can send: they never move anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from kubemu import Emulator, Fault
from testbed.components.services import Scaling
from testbed.framework.objects import CAPI, SLIME_NAMESPACE, config_map, machine_deployment, mirror
from testbed.framework.reviews import scale_request
from testbed.framework.wait import wait_for
from testbed.framework.world import md_events, md_replicas, scale_mirror

MD_SCALE = r"/machinedeployments/[^/]+/scale$"


def assert_allowed(response: dict) -> None:
    assert response["allowed"] is True, response
    assert "patch" not in response and "patchType" not in response


def assert_denied(response: dict, *fragments: str) -> str:
    assert response["allowed"] is False, response
    assert "patch" not in response and "patchType" not in response
    message = response["status"]["message"]
    for fragment in fragments:
        assert fragment in message, message
    return message


def follows(emulator: Emulator, namespace: str, name: str, replicas: int, what: str = "") -> None:
    wait_for(
        lambda: md_replicas(emulator, namespace, name) == replicas,
        5,
        what or f"MachineDeployment {namespace}/{name} at {replicas}",
    )


def mirror_replicas(emulator: Emulator, name: str, namespace: str = SLIME_NAMESPACE) -> int:
    return int(emulator.get("apps/v1", "Deployment", namespace, name)["spec"]["replicas"])


# --- the happy path -------------------------------------------------------------------------------


def test_scale_up_then_down(scaling: Scaling, seeded: Emulator) -> None:
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 5)
    follows(seeded, "metal3", "md-a", 5)
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 0)
    follows(seeded, "metal3", "md-a", 0)
    assert md_replicas(seeded, "metal3-b", "md-b") == 1  # the other mapping is untouched
    assert scaling.metric("slime_scaling_decisions_total", 'outcome="accepted"') == 2
    assert scaling.metric("slime_scaling_writes_total", 'reason="mirror"') == 2
    assert scaling.metric("slime_scaling_patch_seconds_count") == 2


def test_an_admission_makes_no_api_call_and_each_stored_change_one_patch(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    for replicas in (3, 4, 2):
        assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", replicas, old_replicas=2)))
    assert scaling.hot_path_calls() == []  # warm caches: admission reads no API and writes nothing
    assert md_replicas(seeded, "metal3", "md-a") == 2  # reviews alone move nothing
    for replicas in (3, 4, 2):
        scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", replicas)
        follows(seeded, "metal3", "md-a", replicas)
    patches = [
        (c.method, c.api_group, c.resource, c.subresource, c.namespace, c.name)
        for c in scaling.hot_path_calls()
        if c.method != "GET" and c.resource != "deployments"
    ]
    assert patches == [("PATCH", CAPI, "machinedeployments", "scale", "metal3", "md-a")] * 3


def test_patch_is_an_absolute_merge_patch_on_scale(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-b", 7)
    follows(seeded, "metal3-b", "md-b", 7)
    (call,) = scaling.calls(method="PATCH", resource="machinedeployments")
    assert call.path == f"/apis/{CAPI}/v1beta2/namespaces/metal3-b/machinedeployments/md-b/scale"


def test_several_mappings(scaling: Scaling, seeded: Emulator) -> None:
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 6)
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-b", 9)
    follows(seeded, "metal3", "md-a", 6)
    follows(seeded, "metal3-b", "md-b", 9)


def test_dry_run_has_no_side_effect(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 8, dry_run=True, old_replicas=2))
    assert_allowed(response)
    assert "dry run" in response["status"]["message"]
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 8, dry_run=True)  # through the API: nothing is stored
    assert mirror_replicas(seeded, "mirror-a") == 2
    assert md_replicas(seeded, "metal3", "md-a") == 2
    assert scaling.hot_path_calls() == []
    assert scaling.metric("slime_scaling_decisions_total", 'outcome="dry_run"') == 2


@pytest.mark.parametrize(
    "request_",
    [
        scale_request(SLIME_NAMESPACE, "not-a-mirror", 4),
        scale_request("other", "mirror-a", 4),  # same name, another namespace
        {
            **scale_request(SLIME_NAMESPACE, "mirror-a", 4),
            "resource": {"group": "apps", "version": "v1", "resource": "statefulsets"},
        },
        {**scale_request(SLIME_NAMESPACE, "mirror-a", 4), "operation": "CREATE"},
        {**scale_request(SLIME_NAMESPACE, "mirror-a", 4), "subResource": ""},
    ],
    ids=["unmapped", "other-namespace", "statefulset", "create", "no-subresource"],
)
def test_requests_not_ours_are_allowed_with_no_call(scaling: Scaling, seeded: Emulator, request_: dict) -> None:
    seeded.clear_requests()
    response = scaling.review(request_)
    assert response == {"uid": response["uid"], "allowed": True}
    assert seeded.requests == []
    assert md_replicas(seeded, "metal3", "md-a") == 2


def test_malformed_scale_of_a_mapped_mirror_is_denied(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", "3"))
    assert_denied(response, "metal3/md-a", "Scale object has no integer spec.replicas")
    assert response["status"]["code"] == 400
    assert seeded.requests == []


# --- forged reviews: no pool moves ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "old", "code"),
    [
        (0, 2, None),  # consistent with the stored mirror: allowed, yet nothing is stored, so nothing moves
        (0, 9, 409),  # an oldObject that is not the stored mirror
        (2**63, 2, 400),  # beyond any Kubernetes replica count
        (2**31, 2, 400),
    ],
    ids=["to-0-consistent", "to-0-wrong-old-object", "2^63", "2^31"],
)
def test_a_forged_review_never_moves_the_pool(
    scaling: Scaling, seeded: Emulator, replicas: int, old: int, code: int | None
) -> None:
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", replicas, old_replicas=old))
    if code is None:
        assert_allowed(response)
    else:
        assert_denied(response, "metal3/md-a")
        assert response["status"]["code"] == code
    scaling.service.reconcile_once()  # whatever the reconciler does now, it reads the stored mirror
    assert md_replicas(seeded, "metal3", "md-a") == 2
    assert md_replicas(seeded, "metal3-b", "md-b") == 1


def test_a_review_for_a_mirror_that_does_not_exist_is_refused(
    emulator: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    emulator.create(machine_deployment("md", "metal3", replicas=3))
    emulator.create(
        config_map({"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3", "maxReplicas": "100"})
    )
    scaling = scaling_factory(emulator)
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-deployment", 0))
    assert_denied(response, "mirror Deployment slime-system/mirror-deployment does not exist")
    assert response["status"]["code"] == 404
    assert md_replicas(emulator, "metal3", "md") == 3


# --- events -----------------------------------------------------------------------------------------


def test_event_recorded_for_each_change(scaling: Scaling, seeded: Emulator) -> None:
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 4)
    follows(seeded, "metal3", "md-a", 4)
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 3)
    follows(seeded, "metal3", "md-a", 3)
    events = wait_for(
        lambda: (
            len(md_events(seeded, "metal3", "md-a", "ScaledFromMirror")) == 2
            and md_events(seeded, "metal3", "md-a", "ScaledFromMirror")
        ),
        what="two ScaledFromMirror events",
    )
    messages = sorted(e["message"] for e in events)
    assert messages == [
        "Set replicas to 3 from mirror Deployment slime-system/mirror-a",
        "Set replicas to 4 from mirror Deployment slime-system/mirror-a",
    ]
    event = events[0]
    assert event["involvedObject"] == {
        "kind": "MachineDeployment",
        "apiVersion": f"{CAPI}/v1beta2",
        "namespace": "metal3",
        "name": "md-a",
    }
    assert event["type"] == "Normal" and event["count"] == 1
    assert event["source"] == {"component": "slime-scaling-webhook"}
    assert (
        event["reportingComponent"] == "slime-scaling-webhook"
        and event["reportingInstance"]
        and event["action"] == "Scale"
    )
    assert event["metadata"]["name"].startswith("md-a.")
    assert event["eventTime"].endswith("Z") and event["firstTimestamp"] == event["lastTimestamp"]


def test_event_failure_never_stops_the_change(scaling: Scaling, seeded: Emulator) -> None:
    seeded.add_fault(Fault(method="POST", path_regex=r"/events$", status=500))
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 4)
    follows(seeded, "metal3", "md-a", 4)
    assert scaling.service.events.flush()
    assert (scaling.metric("slime_scaling_events_total", 'result="failure"') or 0) >= 1


# --- config forms and reload ------------------------------------------------------------------------


def test_single_mapping_keys_config(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("mirror-deployment", replicas=1))
    emulator.create(machine_deployment("md-slurm-workers", "metal3", replicas=1))
    emulator.create(
        config_map(
            {"machineDeploymentName": "md-slurm-workers", "machineDeploymentNamespace": "metal3", "maxReplicas": "100"}
        )
    )
    scaling_factory(emulator)
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", 4)
    follows(emulator, "metal3", "md-slurm-workers", 4)


def test_single_mapping_keys_and_list_form_combined(
    emulator: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    emulator.create(mirror("mirror-x", namespace="keda", replicas=1))
    emulator.create(mirror("mirror-p", replicas=1))
    emulator.create(machine_deployment("md-x", "metal3", replicas=1))
    emulator.create(machine_deployment("md-p", "metal3", replicas=1))
    emulator.create(
        config_map(
            {
                "machineDeploymentName": "md-x",
                "machineDeploymentNamespace": "metal3",
                "maxReplicas": "100",
                "mirrorDeploymentName": "mirror-x",
                "mirrorDeploymentNamespace": "keda",
                "mappings": "- {mirror: slime-system/mirror-p, machineDeployment: metal3/md-p, maxReplicas: 100}\n",
            }
        )
    )
    scaling = scaling_factory(emulator)
    scale_mirror(emulator, "keda", "mirror-x", 2)
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-p", 3)
    follows(emulator, "metal3", "md-x", 2)
    follows(emulator, "metal3", "md-p", 3)
    assert scaling.metric("slime_scaling_mappings") == 2


def test_config_map_name_flag(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("m1"))
    emulator.create(machine_deployment("md1", "metal3"))
    emulator.create(
        config_map(
            {"mappings": "- {mirror: slime-system/m1, machineDeployment: metal3/md1, maxReplicas: 100}"}, name="custom"
        )
    )
    scaling_factory(emulator, config_map="custom")
    scale_mirror(emulator, SLIME_NAMESPACE, "m1", 3)
    follows(emulator, "metal3", "md1", 3)


def test_live_config_reload(scaling: Scaling, seeded: Emulator) -> None:
    seeded.create(mirror("mirror-c", replicas=1))
    seeded.create(machine_deployment("md-c", "metal3", replicas=4))
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-c", 6)  # not mapped yet: admitted, nothing follows
    assert md_replicas(seeded, "metal3", "md-c") == 4
    cm = seeded.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"] = {"mappings": "- {mirror: slime-system/mirror-c, machineDeployment: metal3/md-c, maxReplicas: 100}"}
    seeded.update(cm)
    wait_for(lambda: scaling.service.source.table.get(SLIME_NAMESPACE, "mirror-c") is not None, what="the new mapping")
    # Mapping adopts: the mirror takes the MachineDeployment's replicas, the pool does not move.
    wait_for(lambda: mirror_replicas(seeded, "mirror-c") == 4, what="the mirror adopted at 4")
    assert md_replicas(seeded, "metal3", "md-c") == 4
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-c", 5)
    follows(seeded, "metal3", "md-c", 5)
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 9)  # no longer mapped
    assert md_replicas(seeded, "metal3", "md-a") == 2


def test_invalid_config_keeps_last_good_mappings(
    scaling: Scaling, seeded: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    assert scaling.metric("slime_scaling_config_valid") == 1
    cm = seeded.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"] = {
        "mappings": "- mirror: slime-system/mirror-a\n  machineDeployment: metal3/md-a\n  maxReplicas: 100\n"
        "  extra: 1\n"
    }
    with caplog.at_level(logging.ERROR, logger="slime.scaling.mappings"):
        seeded.update(cm)
        wait_for(lambda: scaling.metric("slime_scaling_config_valid") == 0, what="config_valid 0")
    assert scaling.metric("slime_scaling_config_errors_total") == 1
    (record,) = [r for r in caplog.records if r.getMessage().startswith("scaling ConfigMap is invalid")]
    assert record.error == "mappings[0]: unknown key(s) extra; allowed: mirror, machineDeployment"  # type: ignore[attr-defined]
    # The last good table still serves both mirrors.
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-b", 5)
    follows(seeded, "metal3-b", "md-b", 5)
    # A fixed ConfigMap is valid again.
    cm = seeded.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"] = {"mappings": "- {mirror: slime-system/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 100}"}
    seeded.update(cm)
    wait_for(lambda: scaling.metric("slime_scaling_config_valid") == 1, what="config_valid 1")
    wait_for(lambda: scaling.service.source.table.get(SLIME_NAMESPACE, "mirror-b") is None, what="mirror-b unmapped")


def test_missing_config_map_is_an_empty_table_and_ready(
    emulator: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    scaling = scaling_factory(emulator)
    assert len(scaling.service.source.table) == 0
    emulator.clear_requests()
    assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-deployment", 3))["allowed"] is True
    assert emulator.requests == []
    emulator.create(mirror("mirror-deployment"))
    emulator.create(machine_deployment("md", "metal3"))
    emulator.create(
        config_map({"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3", "maxReplicas": "100"})
    )
    wait_for(lambda: len(scaling.service.source.table) == 1, what="the created ConfigMap")
    wait_for(lambda: scaling.metric("slime_scaling_writes_total", 'reason="adopt"') == 1, what="the adoption")
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", 3)
    follows(emulator, "metal3", "md", 3)


# --- refusals: the mirror does not move when its MachineDeployment cannot follow -----------------------


def test_machine_deployment_missing_is_denied(scaling: Scaling, seeded: Emulator) -> None:
    seeded.delete(f"{CAPI}/v1beta1", "MachineDeployment", "metal3", "md-a")
    wait_for(
        lambda: (
            scaling.service.objects.machine_deployment(scaling.service.source.table.get(SLIME_NAMESPACE, "mirror-a"))
            is None
        ),  # type: ignore[arg-type]
        what="the watch to see the deletion",
    )
    with pytest.raises(ApiException) as denied:
        scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 3)
    assert denied.value.status == 404
    assert (
        "cannot scale MachineDeployment metal3/md-a to 3 replicas from mirror slime-system/mirror-a: "
        "MachineDeployment metal3/md-a not found" in str(denied.value.body)
    )
    assert mirror_replicas(seeded, "mirror-a") == 2
    assert scaling.metric("slime_scaling_decisions_total", 'outcome="denied"') == 1


def test_admissions_are_answered_from_caches_while_the_api_server_is_gone(scaling: Scaling, seeded: Emulator) -> None:
    seeded.add_fault(Fault(path_regex=r".*", close_connection=True))
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 3, old_replicas=2))
    assert_allowed(response)
    assert response["status"]["message"] == "MachineDeployment metal3/md-a follows the stored mirror to 3"


def test_a_failed_write_is_counted_and_retried(scaling: Scaling, seeded: Emulator) -> None:
    fault = seeded.add_fault(Fault(method="PATCH", path_regex=MD_SCALE, status=500))
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 3)
    wait_for(lambda: (scaling.metric("slime_scaling_reconcile_errors_total") or 0) >= 1, what="the error to be counted")
    assert md_replicas(seeded, "metal3", "md-a") == 2
    fault.remove()
    scaling.service.reconcile_once()
    assert md_replicas(seeded, "metal3", "md-a") == 3


# --- CAPI versions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_cluster_serving_one_capi_version(
    emulator_factory: Callable[..., Emulator], scaling_factory: Callable[..., Scaling], version: str
) -> None:
    emulator = emulator_factory(served={CAPI: [version]})
    emulator.create(mirror("mirror-deployment", replicas=1))
    emulator.create(machine_deployment("md", "metal3", replicas=1, version=version))
    emulator.create(
        config_map({"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3", "maxReplicas": "100"})
    )
    scaling_factory(emulator)
    emulator.clear_requests()
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", 6)
    wait_for(
        lambda: emulator.get(f"{CAPI}/{version}", "MachineDeployment", "metal3", "md")["spec"]["replicas"] == 6,
        what="6",
    )
    (call,) = [c for c in emulator.requests if c.method == "PATCH" and c.resource == "machinedeployments"]
    assert call.path == f"/apis/{CAPI}/{version}/namespaces/metal3/machinedeployments/md/scale"
    events = wait_for(lambda: md_events(emulator, "metal3", "md", "ScaledFromMirror"), what="the event")
    assert events[0]["involvedObject"]["apiVersion"] == f"{CAPI}/{version}"


def test_version_rediscovered_when_path_no_longer_served(scaling: Scaling, seeded: Emulator) -> None:
    """A CAPI downgrade (v1beta2 no longer served): one 404 on the path, rediscover, retry once."""
    assert scaling.service.scaler.api_version == f"{CAPI}/v1beta2"
    seeded.registry._served[CAPI] = ["v1beta1"]
    seeded.clear_requests()
    scale_mirror(seeded, SLIME_NAMESPACE, "mirror-a", 4)
    follows(seeded, "metal3", "md-a", 4)
    assert scaling.service.scaler.api_version == f"{CAPI}/v1beta1"
    calls = [
        (c.method, c.version, c.status_code)
        for c in scaling.hot_path_calls()
        if c.resource == "machinedeployments" or c.non_resource
    ]
    assert calls[:3] == [("PATCH", "v1beta2", 404), ("GET", "", 200), ("PATCH", "v1beta1", 200)]


# --- transport ----------------------------------------------------------------------------------------


def test_health_and_metrics_endpoints(scaling: Scaling) -> None:
    base = scaling.running.metrics_url
    assert httpx.get(f"{base}/healthz").text == "ok"
    assert httpx.get(f"{base}/readyz").json() == {"ready": True}
    text = scaling.metrics_text()
    for name in (
        "slime_scaling_decisions_total",
        "slime_scaling_patch_seconds",
        "slime_scaling_writes_total",
        "slime_scaling_waiting_mappings",
        "slime_scaling_leader",
        "slime_scaling_config_valid",
        "slime_webhook_requests_total",
    ):
        assert name in text


def test_bad_review_is_errored_with_no_call(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    answer = scaling.running.post("/validate", b"{not json")
    assert answer.status_code == 200
    assert answer.json()["response"]["allowed"] is False
    assert seeded.requests == []


def test_not_ready_until_the_config_map_is_listed(emulator: Emulator, pki, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scaling_webhook.app import build
    from scaling_webhook.settings import ScalingSettings
    from testbed.components.serve import serve_in_thread

    fault = emulator.add_fault(Fault(method="GET", path_regex=r"/configmaps$", status=500))
    settings = ScalingSettings(
        cert_file=str(pki.cert_file),
        key_file=str(pki.key_file),
        namespace=SLIME_NAMESPACE,
        KUBECONFIG=emulator.write_kubeconfig(tmp_path / "kc"),
    )  # type: ignore[call-arg]
    running = serve_in_thread(build(settings), pki.ca_file)
    try:
        answer = httpx.get(f"{running.metrics_url}/readyz")
        assert answer.status_code == 503
        assert "ConfigMap slime-system/scaling-webhook-configmap not listed yet" in answer.json()["failed"]["configmap"]
        fault.remove()
        wait_for(lambda: httpx.get(f"{running.metrics_url}/readyz").status_code == 200, what="readiness")
    finally:
        running.stop()
