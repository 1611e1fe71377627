"""The scaling webhook for real: TLS, AdmissionReview v1, the kubernetes client and the API emulator."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import httpx
import pytest

from kubemu import Emulator, Fault
from testbed.reviews import scale_request
from testbed.services import Scaling
from testbed.wait import wait_for
from testbed.world import CAPI, SLIME_NAMESPACE, config_map, machine_deployment, md_events, md_replicas, mirror

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


# --- the happy path -------------------------------------------------------------------------------


def test_scale_up_then_down(scaling: Scaling, seeded: Emulator) -> None:
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 5)))
    assert md_replicas(seeded, "metal3", "md-a") == 5
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 0, old_replicas=5)))
    assert md_replicas(seeded, "metal3", "md-a") == 0
    assert md_replicas(seeded, "metal3-b", "md-b") == 1  # the other mapping is untouched
    assert scaling.metric("slime_scaling_decisions_total", 'outcome="scaled"') == 2
    assert scaling.metric("slime_scaling_patch_seconds_count") == 2


def test_exactly_one_api_call_per_mapped_admission(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    for replicas in (3, 4, 2):
        assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", replicas)))
    calls = scaling.hot_path_calls()
    assert [(c.method, c.api_group, c.resource, c.subresource, c.namespace, c.name) for c in calls] == [
        ("PATCH", CAPI, "machinedeployments", "scale", "metal3", "md-a")
    ] * 3
    assert all(c.status_code == 200 for c in calls)
    assert not [c for c in calls if c.method == "GET"]


def test_patch_is_an_absolute_merge_patch_on_scale(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-b", 7)))
    (call,) = scaling.calls(method="PATCH")
    assert call.path == f"/apis/{CAPI}/v1beta2/namespaces/metal3-b/machinedeployments/md-b/scale"
    assert md_replicas(seeded, "metal3-b", "md-b") == 7


def test_several_mappings(scaling: Scaling, seeded: Emulator) -> None:
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 6)))
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-b", 9)))
    assert (md_replicas(seeded, "metal3", "md-a"), md_replicas(seeded, "metal3-b", "md-b")) == (6, 9)


def test_dry_run_has_no_side_effect(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 8, dry_run=True))
    assert_allowed(response)
    assert "dry run" in response["status"]["message"]
    assert md_replicas(seeded, "metal3", "md-a") == 2
    assert scaling.hot_path_calls() == []
    scaling.service.events.flush()
    assert scaling.calls(resource="events") == []
    assert scaling.metric("slime_scaling_decisions_total", 'outcome="dry_run"') == 1


@pytest.mark.parametrize(
    "request_",
    [
        scale_request(SLIME_NAMESPACE, "not-a-mirror", 4),
        scale_request("other", "mirror-a", 4),  # same name, another namespace
        {**scale_request(SLIME_NAMESPACE, "mirror-a", 4), "resource": {"group": "apps", "version": "v1", "resource": "statefulsets"}},
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


# --- events -----------------------------------------------------------------------------------------


def test_event_recorded_for_each_change(scaling: Scaling, seeded: Emulator) -> None:
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 4)))
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 3)))
    events = wait_for(lambda: len(md_events(seeded, "metal3", "md-a", "ScaledFromMirror")) == 2 and md_events(seeded, "metal3", "md-a"),
                      what="two ScaledFromMirror events")
    messages = sorted(e["message"] for e in events)
    assert messages == [
        "Set replicas to 3 from mirror Deployment slime/mirror-a",
        "Set replicas to 4 from mirror Deployment slime/mirror-a",
    ]
    event = events[0]
    assert event["involvedObject"] == {"kind": "MachineDeployment", "apiVersion": f"{CAPI}/v1beta2", "namespace": "metal3", "name": "md-a"}
    assert event["type"] == "Normal" and event["count"] == 1
    assert event["source"] == {"component": "slime-scaling-webhook"}
    assert event["reportingComponent"] == "slime-scaling-webhook" and event["reportingInstance"] and event["action"] == "Scale"
    assert event["metadata"]["name"].startswith("md-a.")
    assert event["eventTime"].endswith("Z") and event["firstTimestamp"] == event["lastTimestamp"]


def test_event_failure_never_fails_the_admission(scaling: Scaling, seeded: Emulator) -> None:
    seeded.add_fault(Fault(method="POST", path_regex=r"/events$", status=500))
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 4)))
    assert md_replicas(seeded, "metal3", "md-a") == 4
    assert scaling.service.events.flush()
    assert scaling.metric("slime_scaling_events_total", 'result="failure"') == 1


# --- config forms and reload ------------------------------------------------------------------------


def test_thesis_form_config(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("mirror-deployment", replicas=1))
    emulator.create(machine_deployment("md-slurm-workers", "metal3", replicas=1))
    emulator.create(config_map({"machineDeploymentName": "md-slurm-workers", "machineDeploymentNamespace": "metal3"}))
    scaling = scaling_factory(emulator)
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-deployment", 4)))
    assert md_replicas(emulator, "metal3", "md-slurm-workers") == 4


def test_thesis_and_list_forms_combined(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("mirror-x", namespace="keda", replicas=1))
    emulator.create(mirror("mirror-p", replicas=1))
    emulator.create(machine_deployment("md-x", "metal3", replicas=1))
    emulator.create(machine_deployment("md-p", "metal3", replicas=1))
    emulator.create(config_map({
        "machineDeploymentName": "md-x", "machineDeploymentNamespace": "metal3",
        "mirrorDeploymentName": "mirror-x", "mirrorDeploymentNamespace": "keda",
        "mappings": "- {mirror: slime/mirror-p, machineDeployment: metal3/md-p}\n",
    }))
    scaling = scaling_factory(emulator)
    assert_allowed(scaling.review(scale_request("keda", "mirror-x", 2)))
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-p", 3)))
    assert (md_replicas(emulator, "metal3", "md-x"), md_replicas(emulator, "metal3", "md-p")) == (2, 3)
    assert scaling.metric("slime_scaling_mappings") == 2


def test_config_map_name_flag(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("m1"))
    emulator.create(machine_deployment("md1", "metal3"))
    emulator.create(config_map({"mappings": "- {mirror: slime/m1, machineDeployment: metal3/md1}"}, name="custom"))
    scaling = scaling_factory(emulator, config_map="custom")
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "m1", 3)))
    assert md_replicas(emulator, "metal3", "md1") == 3


def test_live_config_reload(scaling: Scaling, seeded: Emulator) -> None:
    seeded.create(mirror("mirror-c", replicas=1))
    seeded.create(machine_deployment("md-c", "metal3", replicas=1))
    seeded.clear_requests()
    assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-c", 4))["allowed"] is True
    assert seeded.requests == [] and md_replicas(seeded, "metal3", "md-c") == 1
    cm = seeded.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"] = {"mappings": "- {mirror: slime/mirror-c, machineDeployment: metal3/md-c}"}
    passes = scaling.service.reconciler.passes
    seeded.update(cm)
    wait_for(lambda: scaling.service.source.table.get(SLIME_NAMESPACE, "mirror-c") is not None, what="the new mapping")
    wait_for(lambda: scaling.service.reconciler.passes > passes, what="the reconcile pass a mapping change triggers")
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-c", 4)))
    assert md_replicas(seeded, "metal3", "md-c") == 4
    assert scaling.service.events.flush()
    seeded.clear_requests()
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 9))  # no longer mapped
    assert response["allowed"] is True and seeded.requests == []
    assert md_replicas(seeded, "metal3", "md-a") == 2


def test_invalid_config_keeps_last_good_mappings(
    scaling: Scaling, seeded: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    assert scaling.metric("slime_scaling_config_valid") == 1
    cm = seeded.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"] = {"mappings": "- mirror: slime/mirror-a\n  machineDeployment: metal3/md-a\n  extra: 1\n"}
    with caplog.at_level(logging.ERROR, logger="slime.scaling.mappings"):
        seeded.update(cm)
        wait_for(lambda: scaling.metric("slime_scaling_config_valid") == 0, what="config_valid 0")
    assert scaling.metric("slime_scaling_config_errors_total") == 1
    (record,) = [r for r in caplog.records if r.getMessage().startswith("scaling ConfigMap is invalid")]
    assert record.error == "mappings[0]: unknown key(s) extra; allowed: mirror, machineDeployment"  # type: ignore[attr-defined]
    # The last good table still serves both mirrors.
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-b", 5)))
    assert md_replicas(seeded, "metal3-b", "md-b") == 5
    # A fixed ConfigMap is valid again.
    cm = seeded.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"] = {"mappings": "- {mirror: slime/mirror-a, machineDeployment: metal3/md-a}"}
    seeded.update(cm)
    wait_for(lambda: scaling.metric("slime_scaling_config_valid") == 1, what="config_valid 1")
    wait_for(lambda: scaling.service.source.table.get(SLIME_NAMESPACE, "mirror-b") is None, what="mirror-b unmapped")


def test_missing_config_map_is_an_empty_table_and_ready(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling = scaling_factory(emulator)
    assert len(scaling.service.source.table) == 0
    emulator.clear_requests()
    assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-deployment", 3))["allowed"] is True
    assert emulator.requests == []
    emulator.create(mirror("mirror-deployment"))
    emulator.create(machine_deployment("md", "metal3"))
    emulator.create(config_map({"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3"}))
    wait_for(lambda: len(scaling.service.source.table) == 1, what="the created ConfigMap")
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-deployment", 3)))
    assert md_replicas(emulator, "metal3", "md") == 3


# --- failures: deny, naming the MachineDeployment and the cause -------------------------------------


def test_machine_deployment_missing_is_denied(scaling: Scaling, seeded: Emulator) -> None:
    seeded.delete(f"{CAPI}/v1beta1", "MachineDeployment", "metal3", "md-a")
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 3))
    assert_denied(response, "cannot scale MachineDeployment metal3/md-a to 3 replicas from mirror slime/mirror-a",
                  "MachineDeployment metal3/md-a not found")
    assert response["status"]["code"] == 404
    assert scaling.metric("slime_scaling_decisions_total", 'outcome="denied"') == 1


@pytest.mark.parametrize(
    ("status", "code", "fragment"),
    [
        (500, 503, "the API server answered 500"),
        (403, 403, "forbidden: injected fault (403)"),
        (409, 409, "the API server answered 409"),
    ],
)
def test_api_error_is_denied_with_cause(scaling: Scaling, seeded: Emulator, status: int, code: int, fragment: str) -> None:
    seeded.add_fault(Fault(method="PATCH", path_regex=MD_SCALE, status=status))
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 3))
    assert_denied(response, "MachineDeployment metal3/md-a", fragment)
    assert response["status"]["code"] == code
    assert md_replicas(seeded, "metal3", "md-a") == 2


def test_slow_api_is_denied_within_budget(scaling: Scaling, seeded: Emulator) -> None:
    seeded.add_fault(Fault(method="PATCH", path_regex=MD_SCALE, status=500, delay_seconds=3.0))
    started = time.monotonic()
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 3))
    elapsed = time.monotonic() - started
    assert_denied(response, "MachineDeployment metal3/md-a", "the API server did not answer within 1s")
    assert response["status"]["code"] == 503
    assert elapsed < 1.5, elapsed


def test_api_unreachable_is_denied(scaling: Scaling, seeded: Emulator) -> None:
    seeded.add_fault(Fault(method="PATCH", path_regex=MD_SCALE, close_connection=True))
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 3))
    assert_denied(response, "MachineDeployment metal3/md-a")
    assert response["status"]["code"] == 503


# --- CAPI versions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_cluster_serving_one_capi_version(
    emulator_factory: Callable[..., Emulator], scaling_factory: Callable[..., Scaling], version: str
) -> None:
    emulator = emulator_factory(served={CAPI: [version]})
    emulator.create(mirror("mirror-deployment", replicas=1))
    emulator.create(machine_deployment("md", "metal3", replicas=1, version=version))
    emulator.create(config_map({"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3"}))
    scaling = scaling_factory(emulator)
    emulator.clear_requests()
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-deployment", 6)))
    (call,) = [c for c in emulator.requests if c.resource != "events"]
    assert call.path == f"/apis/{CAPI}/{version}/namespaces/metal3/machinedeployments/md/scale"
    assert emulator.get(f"{CAPI}/{version}", "MachineDeployment", "metal3", "md")["spec"]["replicas"] == 6
    events = wait_for(lambda: md_events(emulator, "metal3", "md", "ScaledFromMirror"), what="the event")
    assert events[0]["involvedObject"]["apiVersion"] == f"{CAPI}/{version}"


def test_version_rediscovered_when_path_no_longer_served(scaling: Scaling, seeded: Emulator) -> None:
    """A CAPI downgrade (v1beta2 no longer served): one 404 on the path, rediscover, retry once."""
    assert scaling.service.scaler.api_version == f"{CAPI}/v1beta2"
    seeded.registry._served[CAPI] = ["v1beta1"]
    seeded.clear_requests()
    assert_allowed(scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 4)))
    assert md_replicas(seeded, "metal3", "md-a") == 4
    assert scaling.service.scaler.api_version == f"{CAPI}/v1beta1"
    calls = [(c.method, c.version, c.status_code) for c in scaling.hot_path_calls()]
    assert calls == [("PATCH", "v1beta2", 404), ("GET", "", 200), ("PATCH", "v1beta1", 200)]


# --- transport ----------------------------------------------------------------------------------------


def test_health_and_metrics_endpoints(scaling: Scaling) -> None:
    base = scaling.running.metrics_url
    assert httpx.get(f"{base}/healthz").text == "ok"
    assert httpx.get(f"{base}/readyz").json() == {"ready": True}
    text = scaling.metrics_text()
    for name in ("slime_scaling_decisions_total", "slime_scaling_patch_seconds", "slime_scaling_drift_corrections_total",
                 "slime_scaling_config_valid", "slime_webhook_requests_total"):
        assert name in text


def test_bad_review_is_errored_with_no_call(scaling: Scaling, seeded: Emulator) -> None:
    seeded.clear_requests()
    answer = scaling.running.post("/validate", b"{not json")
    assert answer.status_code == 200
    assert answer.json()["response"]["allowed"] is False
    assert seeded.requests == []


# --- end to end: the emulator calls the webhook on a mirror /scale, as kube-apiserver would ------------


def test_end_to_end_keda_scales_mirror(emulator_factory: Callable[..., Emulator], scaling_factory: Callable[..., Scaling]) -> None:
    from kubemu import AdmissionAttributes, AdmissionDenied

    holder: dict[str, Scaling] = {}

    def hook(attrs: AdmissionAttributes) -> None:
        if attrs.subresource != "scale" or "svc" not in holder:
            return None
        request = {
            "kind": attrs.kind, "resource": {"group": attrs.group, "version": attrs.version, "resource": attrs.resource},
            "subResource": attrs.subresource, "namespace": attrs.namespace, "name": attrs.name,
            "operation": attrs.operation, "object": attrs.object, "oldObject": attrs.old_object, "dryRun": attrs.dry_run,
        }
        response = holder["svc"].review(request)
        if not response["allowed"]:
            raise AdmissionDenied(response["status"]["message"], response["status"]["code"])
        return None

    emulator = emulator_factory(admission=hook)
    emulator.create(mirror("mirror-deployment", replicas=1))
    emulator.create(machine_deployment("md", "metal3", replicas=1))
    emulator.create(config_map({"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3"}))
    holder["svc"] = scaling_factory(emulator)
    api = emulator.api_client()
    try:
        from tests.kubemu.helpers import raw

        raw(api, "PATCH", f"/apis/apps/v1/namespaces/{SLIME_NAMESPACE}/deployments/mirror-deployment/scale",
            body={"spec": {"replicas": 4}}, content_type="application/merge-patch+json")
        assert md_replicas(emulator, "metal3", "md") == 4
        assert emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-deployment")["spec"]["replicas"] == 4
        # A dry run through the API server changes nothing.
        raw(api, "PATCH", f"/apis/apps/v1/namespaces/{SLIME_NAMESPACE}/deployments/mirror-deployment/scale",
            body={"spec": {"replicas": 9}}, content_type="application/merge-patch+json", query=[("dryRun", "All")])
        assert md_replicas(emulator, "metal3", "md") == 4
        # The MachineDeployment gone: the mirror scale is refused, so the mirror does not drift.
        emulator.delete(f"{CAPI}/v1beta1", "MachineDeployment", "metal3", "md")
        with pytest.raises(Exception) as denied:
            raw(api, "PATCH", f"/apis/apps/v1/namespaces/{SLIME_NAMESPACE}/deployments/mirror-deployment/scale",
                body={"spec": {"replicas": 2}}, content_type="application/merge-patch+json")
        assert "MachineDeployment metal3/md not found" in json.loads(denied.value.body)["message"]  # type: ignore[attr-defined]
        assert emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-deployment")["spec"]["replicas"] == 4
    finally:
        api.close()


def test_not_ready_until_the_config_map_is_listed(emulator: Emulator, pki, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scaling_webhook.main import build
    from scaling_webhook.settings import ScalingSettings
    from testbed.serve import serve_in_thread

    fault = emulator.add_fault(Fault(method="GET", path_regex=r"/configmaps$", status=500))
    settings = ScalingSettings(cert_file=str(pki.cert_file), key_file=str(pki.key_file), namespace=SLIME_NAMESPACE,
                               KUBECONFIG=emulator.write_kubeconfig(tmp_path / "kc"))  # type: ignore[call-arg]
    running = serve_in_thread(build(settings), pki.ca_file)
    try:
        answer = httpx.get(f"{running.metrics_url}/readyz")
        assert answer.status_code == 503
        assert "ConfigMap slime/scaling-webhook-configmap not listed yet" in answer.json()["failed"]["configmap"]
        fault.remove()
        wait_for(lambda: httpx.get(f"{running.metrics_url}/readyz").status_code == 200, what="readiness")
    finally:
        running.stop()
