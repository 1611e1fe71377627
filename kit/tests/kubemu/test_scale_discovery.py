"""/scale subresource, served-version control and discovery."""

from __future__ import annotations

import json

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubemu import Emulator
from testbed.framework.builders import deployment, machine_deployment, raw

CAPI = ("cluster.x-k8s.io",)


def test_deployment_scale_get_and_patch(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    apps = client.AppsV1Api(api)
    created = apps.create_namespaced_deployment(ns, deployment("d", replicas=2))
    scale = apps.read_namespaced_deployment_scale("d", ns)
    assert (scale.spec.replicas, scale.status.replicas, scale.status.selector) == (2, 0, "app=d")
    assert scale.metadata.uid == created.metadata.uid
    assert scale.metadata.resource_version == created.metadata.resource_version
    patched = apps.patch_namespaced_deployment_scale("d", ns, {"spec": {"replicas": 5}})
    assert patched.spec.replicas == 5
    parent = emu.get("apps/v1", "deployments", ns, "d")
    assert parent["spec"]["replicas"] == 5 and parent["metadata"]["generation"] == 2
    assert patched.metadata.resource_version == parent["metadata"]["resourceVersion"]


def test_machine_deployment_scale_via_custom_objects_api(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.create({**machine_deployment("md", replicas=1), "status": {"replicas": 1, "selector": "md=md"}}, namespace=ns)
    co = client.CustomObjectsApi(api)
    scale = co.get_namespaced_custom_object_scale("cluster.x-k8s.io", "v1beta1", ns, "machinedeployments", "md")
    assert scale["apiVersion"] == "autoscaling/v1" and scale["kind"] == "Scale"
    assert scale["spec"] == {"replicas": 1} and scale["status"] == {"replicas": 1, "selector": "md=md"}
    patched = co.patch_namespaced_custom_object_scale(
        "cluster.x-k8s.io", "v1beta2", ns, "machinedeployments", "md", {"spec": {"replicas": 4}}
    )
    assert patched["spec"]["replicas"] == 4
    assert emu.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", ns, "md")["spec"]["replicas"] == 4


def test_scale_via_raw_merge_patch_emits_modified_on_parent(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.create(machine_deployment("md"), namespace=ns)
    rv = emu.store.resource_version
    path = f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{ns}/machinedeployments/md/scale"
    code, scale = raw(api, "PATCH", path, {"spec": {"replicas": 3}}, "application/merge-patch+json")
    assert code == 200 and scale["spec"]["replicas"] == 3
    events = [
        (e["type"], e["raw_object"]["spec"]["replicas"])
        for e in watch.Watch().stream(
            client.CustomObjectsApi(api).list_namespaced_custom_object,
            "cluster.x-k8s.io",
            "v1beta2",
            ns,
            "machinedeployments",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert events == [("MODIFIED", 3)]


def test_a_scale_at_zero_has_no_spec_replicas(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    # As kube-apiserver (test_conformance.py): ScaleSpec.Replicas is an int32 with omitempty; a merge patch
    # with replicas null removes the key, which decodes as 0.
    emu.create(machine_deployment("md", replicas=2), namespace=ns)
    path = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{ns}/machinedeployments/md/scale"
    code, scale = raw(api, "PATCH", path, {"spec": {"replicas": None}}, "application/merge-patch+json")
    assert (code, scale["spec"]) == (200, {})
    assert emu.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", ns, "md")["spec"]["replicas"] == 0


@pytest.mark.parametrize("replicas", [-1, "3", 1.5])
def test_invalid_replicas_is_422(api: client.ApiClient, emu: Emulator, ns: str, replicas: object) -> None:
    emu.create(machine_deployment("md", replicas=2), namespace=ns)
    path = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{ns}/machinedeployments/md/scale"
    with pytest.raises(ApiException) as err:
        raw(api, "PATCH", path, {"spec": {"replicas": replicas}}, "application/merge-patch+json")
    assert (err.value.status, json.loads(err.value.body)["reason"]) == (422, "Invalid")
    assert emu.get("cluster.x-k8s.io/v1beta1", "machinedeployments", ns, "md")["spec"]["replicas"] == 2


def test_scale_put_with_stale_resource_version_conflicts(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("d"))
    scale = apps.read_namespaced_deployment_scale("d", ns)
    apps.patch_namespaced_deployment("d", ns, {"metadata": {"labels": {"bump": "1"}}})
    scale.spec.replicas = 9
    with pytest.raises(ApiException) as err:
        apps.replace_namespaced_deployment_scale("d", ns, scale)
    assert err.value.status == 409
    fresh = apps.read_namespaced_deployment_scale("d", ns)
    fresh.spec.replicas = 9
    assert apps.replace_namespaced_deployment_scale("d", ns, fresh).spec.replicas == 9


def test_served_versions_control_paths_and_discovery() -> None:
    served = {"infrastructure.cluster.x-k8s.io": ["v1beta1"], "cluster.x-k8s.io": ["v1beta2"]}
    with Emulator(served=served) as emu:
        api = emu.api_client()
        emu.create(machine_deployment("md", version="v1beta1"), namespace="default")
        co = client.CustomObjectsApi(api)
        md = co.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "default", "machinedeployments", "md")
        assert md["apiVersion"] == "cluster.x-k8s.io/v1beta2"
        with pytest.raises(ApiException) as err:
            co.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta1", "default", "machinedeployments", "md")
        assert err.value.status == 404 and json.loads(err.value.body)["reason"] == "NotFound"

        _, group = raw(api, "GET", "/apis/cluster.x-k8s.io")
        assert [v["version"] for v in group["versions"]] == ["v1beta2"]
        _, infra = raw(api, "GET", "/apis/infrastructure.cluster.x-k8s.io")
        assert infra["preferredVersion"] == {
            "groupVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "version": "v1beta1",
        }
        with pytest.raises(ApiException) as err:
            raw(api, "GET", "/apis/infrastructure.cluster.x-k8s.io/v1beta2")
        assert err.value.status == 404
        groups = client.ApisApi(api).get_api_versions().groups
        capi = next(g for g in groups if g.name == "cluster.x-k8s.io")
        assert [v.version for v in capi.versions] == ["v1beta2"]


def test_discovery_documents(api: client.ApiClient) -> None:
    _, group = raw(api, "GET", "/apis/slinky.slurm.net")
    assert [v["version"] for v in group["versions"]] == ["v1beta1", "v1alpha1"]
    assert group["preferredVersion"]["version"] == "v1beta1"
    _, capi = raw(api, "GET", "/apis/cluster.x-k8s.io")
    assert capi["preferredVersion"]["version"] == "v1beta2"
    resources = client.CustomObjectsApi(api).get_api_resources("cluster.x-k8s.io", "v1beta1").resources
    by_name = {r.name: r for r in resources}
    assert by_name["machinedeployments/scale"].kind == "Scale"
    assert by_name["machinedeployments/scale"].group == "autoscaling"
    assert by_name["machinedeployments"].namespaced and "watch" in by_name["machinedeployments"].verbs
    assert "machines/scale" not in by_name and "machines/status" in by_name
    core = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert core["namespaces"].namespaced is False and core["secrets"].kind == "Secret"
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    assert client.VersionApi(api).get_code().major == "1"
    with pytest.raises(ApiException) as err:
        raw(api, "GET", "/apis/nope.example.com")
    assert (err.value.status, json.loads(err.value.body)["kind"]) == (404, "Status")
