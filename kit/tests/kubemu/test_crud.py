"""CRUD, patches, optimistic concurrency and finalizers through the real kubernetes client."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubemu import Emulator
from testbed.framework.builders import deployment, machine_deployment, pod, raw


def _status(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_create_sets_metadata_and_get_list_return_it(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    created = core.create_namespaced_pod(ns, pod("p1", {"app": "x"}))
    assert created.metadata.namespace == ns
    assert created.metadata.uid and created.metadata.generation == 1
    assert created.metadata.creation_timestamp is not None
    second = core.create_namespaced_pod(ns, pod("p2"))
    assert int(second.metadata.resource_version) > int(created.metadata.resource_version)

    assert core.read_namespaced_pod("p1", ns).metadata.uid == created.metadata.uid
    listed = core.list_namespaced_pod(ns)
    assert [p.metadata.name for p in listed.items] == ["p1", "p2"]
    assert listed.metadata.resource_version == second.metadata.resource_version
    everywhere = core.list_pod_for_all_namespaces()
    assert {"p1", "p2"} <= {p.metadata.name for p in everywhere.items if p.metadata.namespace == ns}


def test_get_missing_is_404_status(api: client.ApiClient, ns: str) -> None:
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api).read_namespaced_pod("nope", ns)
    assert err.value.status == 404
    body = _status(err.value)
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "NotFound", 404)
    assert body["message"] == 'pods "nope" not found'


def test_generate_name(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}
    first, second = core.create_namespaced_pod(ns, body), core.create_namespaced_pod(ns, body)
    assert first.metadata.name.startswith("worker-") and len(first.metadata.name) == len("worker-") + 5
    assert first.metadata.name != second.metadata.name


def test_already_exists_and_namespace_mismatch(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}})
    assert (err.value.status, _status(err.value)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "cm2", "namespace": "elsewhere"}})
    assert (err.value.status, _status(err.value)["reason"]) == (400, "BadRequest")


def test_dry_run_create_does_not_store(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    core = client.CoreV1Api(api)
    result = core.create_namespaced_config_map(ns, {"metadata": {"name": "dry"}}, dry_run="All")
    assert result.metadata.name == "dry"
    assert emu.get("v1", "ConfigMap", ns, "dry") is None


def test_put_with_stale_resource_version_conflicts(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"v": "1"}})
    cm.data = {"v": "2"}
    updated = core.replace_namespaced_config_map("cm", ns, cm)
    assert updated.data == {"v": "2"}
    assert int(updated.metadata.resource_version) > int(cm.metadata.resource_version)
    cm.data = {"v": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("cm", ns, cm)
    assert (err.value.status, _status(err.value)["reason"]) == (409, "Conflict")
    assert core.read_namespaced_config_map("cm", ns).data == {"v": "2"}


def test_generation_bumps_on_spec_change_only(api: client.ApiClient, ns: str) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("d"))
    relabelled = apps.patch_namespaced_deployment("d", ns, {"metadata": {"labels": {"x": "y"}}})
    assert relabelled.metadata.generation == 1
    rescaled = apps.patch_namespaced_deployment("d", ns, {"spec": {"replicas": 4}})
    assert rescaled.metadata.generation == 2 and rescaled.spec.replicas == 4


def test_noop_patch_keeps_resource_version(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    same = core.patch_namespaced_config_map("cm", ns, {"data": {"a": "1"}})
    assert same.metadata.resource_version == cm.metadata.resource_version


def test_json_merge_and_strategic_patches(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "cm", "labels": {"keep": "1", "drop": "1"}}, "data": {"a": "1"}}
    )
    path = f"/api/v1/namespaces/{ns}/configmaps/cm"
    code, obj = raw(api, "PATCH", path, [{"op": "add", "path": "/data/b", "value": "2"}], "application/json-patch+json")
    assert code == 200 and obj["data"] == {"a": "1", "b": "2"}
    code, obj = raw(
        api, "PATCH", path, {"metadata": {"labels": {"drop": None}}, "data": {"a": "9"}}, "application/merge-patch+json"
    )
    assert obj["metadata"]["labels"] == {"keep": "1"} and obj["data"] == {"a": "9", "b": "2"}
    # the typed client sends a dict body as a strategic merge patch
    patched = core.patch_namespaced_config_map("cm", ns, {"data": {"c": "3"}})
    assert patched.data == {"a": "9", "b": "2", "c": "3"}


def test_json_patch_failed_test_op_is_422(api: client.ApiClient, ns: str) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    with pytest.raises(ApiException) as err:
        raw(
            api,
            "PATCH",
            f"/api/v1/namespaces/{ns}/configmaps/cm",
            [{"op": "test", "path": "/data/a", "value": "2"}, {"op": "replace", "path": "/data/a", "value": "3"}],
            "application/json-patch+json",
        )
    assert (err.value.status, _status(err.value)["reason"]) == (422, "Invalid")


def test_unsupported_patch_types_are_415(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.create({**machine_deployment("md"), "metadata": {"name": "md", "namespace": ns}})
    path = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{ns}/machinedeployments/md"
    for content_type in ("application/apply-patch+yaml", "application/strategic-merge-patch+json"):
        with pytest.raises(ApiException) as err:
            raw(api, "PATCH", path, {"spec": {"replicas": 2}}, content_type)
        assert (err.value.status, _status(err.value)["reason"]) == (415, "UnsupportedMediaType"), content_type
    assert emu.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", ns, "md")["spec"]["replicas"] == 1


def test_status_subresource_separates_spec_and_status(api: client.ApiClient, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    args = ("cluster.x-k8s.io", "v1beta2", ns, "machinedeployments")
    co.create_namespaced_custom_object(
        *args, {**machine_deployment("md", version="v1beta2"), "status": {"replicas": 7}}
    )
    md = co.get_namespaced_custom_object(*args, "md")
    assert "status" not in md  # status is reset on create
    co.patch_namespaced_custom_object_status(*args, "md", {"status": {"replicas": 2}, "spec": {"replicas": 9}})
    co.patch_namespaced_custom_object(*args, "md", {"status": {"replicas": 5}})
    md = co.get_namespaced_custom_object(*args, "md")
    assert md["status"] == {"replicas": 2} and md["spec"]["replicas"] == 1


def test_finalizers_delay_deletion(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cm", "finalizers": ["example.com/hold"]}})
    core.delete_namespaced_config_map("cm", ns)
    held = core.read_namespaced_config_map("cm", ns)
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("cm", ns, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("cm", ns)
    assert err.value.status == 404
    core.create_namespaced_config_map(ns, {"metadata": {"name": "plain"}})
    core.delete_namespaced_config_map("plain", ns)
    assert emu.get("v1", "configmaps", ns, "plain") is None


def test_direct_store_access_round_trip(emu: Emulator, ns: str) -> None:
    created = emu.create({**pod("p", {"a": "b"}), "status": {"phase": "Running"}}, namespace=ns)
    assert created["status"] == {"phase": "Running"}  # direct seeding keeps status
    patched = emu.patch("v1", "pods", ns, "p", {"status": {"phase": "Failed"}})
    assert patched["status"]["phase"] == "Failed"
    assert [p["metadata"]["name"] for p in emu.list("v1", "Pod", ns, label_selector="a=b")] == ["p"]
    assert emu.delete("v1", "Pod", ns, "p")["metadata"]["name"] == "p"
    assert emu.get("v1", "Pod", ns, "p") is None and emu.delete("v1", "Pod", ns, "p") is None


def test_list_pages_with_limit_and_continue(emu: Emulator, api: client.ApiClient, ns: str) -> None:
    for i in range(5):
        emu.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}", "namespace": ns}})
    core = client.CoreV1Api(api)
    first = core.list_namespaced_config_map(ns, limit=2)
    assert [c.metadata.name for c in first.items] == ["cm-0", "cm-1"]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue
    second = core.list_namespaced_config_map(ns, limit=2, _continue=first.metadata._continue)
    third = core.list_namespaced_config_map(ns, limit=2, _continue=second.metadata._continue)
    assert [c.metadata.name for c in second.items + third.items] == ["cm-2", "cm-3", "cm-4"]
    assert third.metadata._continue is None and third.metadata.resource_version == first.metadata.resource_version


def test_pages_keep_to_the_namespace_and_the_selector(emu: Emulator, api: client.ApiClient, ns: str) -> None:
    """A page starts past the last key served and stops at the limit; other namespaces and unmatched objects are
    neither served nor counted as remaining."""
    other = f"{ns}-other"
    emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    for i in range(6):
        for namespace in (ns, other):
            labels = {"pool": "a" if i % 2 == 0 else "b"}
            meta = {"name": f"cm-{i}", "namespace": namespace, "labels": labels}
            emu.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})
    core = client.CoreV1Api(api)

    def pages(**query: object) -> tuple[list[str], list[int | None]]:
        names: list[str] = []
        remaining: list[int | None] = []
        token = None
        while True:
            page = core.list_namespaced_config_map(ns, limit=2, _continue=token, **query)
            names += [c.metadata.name for c in page.items]
            remaining.append(page.metadata.remaining_item_count)
            token = page.metadata._continue
            if not token:
                return names, remaining

    assert pages() == ([f"cm-{i}" for i in range(6)], [4, 2, None])
    assert pages(label_selector="pool=a") == (["cm-0", "cm-2", "cm-4"], [1, None])
