"""Request recording, fault injection, token auth, admission hook and lifecycle."""

from __future__ import annotations

import json
import threading
import time

import pytest
import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kubemu import AdmissionAttributes, AdmissionDenied, Emulator, Fault
from testbed.framework.builders import deployment, machine_deployment, pod, raw


def test_request_records_map_to_rbac_verbs(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    core = client.CoreV1Api(api)
    emu.clear_requests()
    core.create_namespaced_pod(ns, pod("p"))
    core.read_namespaced_pod("p", ns)
    core.list_namespaced_pod(ns)
    core.list_namespaced_pod(ns, watch=True, timeout_seconds=5, _preload_content=False).close()
    core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"a": "b"}}})
    core.replace_namespaced_pod("p", ns, core.read_namespaced_pod("p", ns))
    core.delete_namespaced_pod("p", ns)
    client.CoreV1Api(api).get_api_resources()
    client.AppsV1Api(api).list_deployment_for_all_namespaces()
    records = emu.requests
    assert [r.verb for r in records] == [
        "create",
        "get",
        "list",
        "watch",
        "patch",
        "get",
        "update",
        "delete",
        "get",
        "list",
    ]
    get = records[1]
    assert (
        get.api_group,
        get.version,
        get.resource,
        get.subresource,
        get.namespace,
        get.name,
        get.method,
        get.status_code,
        get.non_resource,
    ) == ("", "v1", "pods", "", ns, "p", "GET", 200, False)
    assert get.path == f"/api/v1/namespaces/{ns}/pods/p" and get.user_agent.startswith("OpenAPI-Generator")
    assert records[3].query.count("watch=true") == 1
    discovery = records[8]
    assert (discovery.non_resource, discovery.resource, discovery.path) == (True, "", "/api/v1/")
    assert (records[9].api_group, records[9].namespace) == ("apps", "")
    assert emu.count_requests(verb="get", resource="pods") == 2
    assert emu.count_requests(verb="create", status_code=201, namespace=ns) == 1
    with pytest.raises(TypeError):
        emu.count_requests(colour="red")


def test_scale_patch_is_recorded_as_subresource(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.create(machine_deployment("md"), namespace=ns)
    emu.clear_requests()
    client.CustomObjectsApi(api).patch_namespaced_custom_object_scale(
        "cluster.x-k8s.io", "v1beta1", ns, "machinedeployments", "md", {"spec": {"replicas": 2}}
    )
    assert (
        emu.count_requests(
            verb="patch", api_group="cluster.x-k8s.io", resource="machinedeployments", subresource="scale", name="md"
        )
        == 1
    )


@pytest.mark.parametrize("status, reason", [(500, "InternalError"), (403, "Forbidden"), (409, "Conflict")])
def test_status_faults(api: client.ApiClient, emu: Emulator, ns: str, status: int, reason: str) -> None:
    emu.create(pod("p"), namespace=ns)
    handle = emu.add_fault(Fault(method="GET", path_regex=r"/pods/p$", status=status, message="boom"))
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("p", ns)
    body = json.loads(err.value.body)
    assert (err.value.status, body["reason"], body["message"], body["code"]) == (status, reason, "boom", status)
    assert core.list_namespaced_pod(ns).items  # other paths unaffected
    handle.remove()
    assert core.read_namespaced_pod("p", ns).metadata.name == "p"


def test_fault_times_and_verb_filter(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.add_fault(Fault(verb="list", status=503, times=1))
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map(ns)
    assert err.value.status == 503
    assert core.list_namespaced_config_map(ns).items == []  # the fault is used up


def test_delay_fault_beyond_client_timeout(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.add_fault(Fault(path_regex="/configmaps", delay_seconds=1.0))
    core = client.CoreV1Api(api)
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError) as err:
        core.list_namespaced_config_map(ns, _request_timeout=0.2)
    assert isinstance(err.value.reason, urllib3.exceptions.ReadTimeoutError)
    assert time.monotonic() - started < 1.0
    emu.clear_faults()
    started = time.monotonic()
    core.list_namespaced_config_map(ns)  # the loop was not blocked by the pending delay
    assert time.monotonic() - started < 0.5


def test_close_connection_fault(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.add_fault(Fault(path_regex="/secrets", close_connection=True))
    with pytest.raises(urllib3.exceptions.HTTPError):
        raw(api, "GET", f"/api/v1/namespaces/{ns}/secrets")
    dropped = [r for r in emu.requests if r.resource == "secrets" and r.namespace == ns]
    assert dropped and all(r.status_code == 0 for r in dropped)
    emu.clear_faults()
    assert raw(api, "GET", f"/api/v1/namespaces/{ns}/secrets")[0] == 200


def test_token_auth(tmp_path) -> None:
    with Emulator(token="abc") as emu:
        anonymous = client.ApiClient(client.Configuration(host=emu.url))
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(anonymous).list_namespace()
        assert (err.value.status, json.loads(err.value.body)["reason"]) == (401, "Unauthorized")
        path = emu.write_kubeconfig(tmp_path / "kubeconfig", namespace="kube-system")
        authed = config.new_client_from_config(config_file=path)
        assert "default" in {n.metadata.name for n in client.CoreV1Api(authed).list_namespace().items}
        assert emu.count_requests(status_code=401) == 1 and emu.count_requests(status_code=200) == 1


def test_admission_hook_mutates_and_denies() -> None:
    seen: list[AdmissionAttributes] = []

    def hook(attrs: AdmissionAttributes) -> dict | None:
        seen.append(attrs)
        if attrs.subresource == "scale" and attrs.object["spec"]["replicas"] > 10:
            raise AdmissionDenied('admission webhook "scaling.slime.dev" denied the request: too many', code=403)
        if attrs.operation == "CREATE" and attrs.resource == "pods":
            attrs.object["metadata"].setdefault("labels", {})["injected"] = "yes"
            return attrs.object
        return None

    with Emulator(admission=hook) as emu:
        api = emu.api_client()
        created = client.CoreV1Api(api).create_namespaced_pod("default", pod("p"))
        assert created.metadata.labels == {"injected": "yes"}
        apps = client.AppsV1Api(api)
        apps.create_namespaced_deployment("default", deployment("d", replicas=1))
        assert apps.patch_namespaced_deployment_scale("d", "default", {"spec": {"replicas": 3}}).spec.replicas == 3
        with pytest.raises(ApiException) as err:
            apps.patch_namespaced_deployment_scale("d", "default", {"spec": {"replicas": 11}})
        body = json.loads(err.value.body)
        assert (err.value.status, body["reason"]) == (403, "Forbidden")
        assert body["message"] == 'admission webhook "scaling.slime.dev" denied the request: too many'
        assert emu.get("apps/v1", "deployments", "default", "d")["spec"]["replicas"] == 3
        apps.patch_namespaced_deployment_scale("d", "default", {"spec": {"replicas": 4}}, dry_run="All")
        assert emu.get("apps/v1", "deployments", "default", "d")["spec"]["replicas"] == 3

    scale = [a for a in seen if a.subresource == "scale"]
    assert [
        (
            a.operation,
            a.resource,
            a.kind["kind"],
            a.object["spec"]["replicas"],
            a.old_object["spec"]["replicas"],
            a.dry_run,
        )
        for a in scale
    ] == [
        ("UPDATE", "deployments", "Scale", 3, 1, False),
        ("UPDATE", "deployments", "Scale", 11, 3, False),
        ("UPDATE", "deployments", "Scale", 4, 3, True),
    ]
    admin = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}
    assert seen[0].user_info == admin and seen[0].group == "" and seen[0].version == "v1"


def test_admission_names_the_impersonated_user_as_kube_apiserver_does() -> None:
    """``Impersonate-User``/``-Group`` become the review's userInfo; a ServiceAccount gets its groups."""
    seen: list[AdmissionAttributes] = []

    with Emulator(admission=lambda attrs: seen.append(attrs)) as emu:
        api = emu.api_client()
        api.set_default_header("Impersonate-User", "system:serviceaccount:capm3-system:capm3-manager")
        client.CoreV1Api(api).create_namespaced_config_map("default", {"metadata": {"name": "as-capm3"}})
        tenant = emu.api_client()
        tenant.set_default_header("Impersonate-User", "alice")
        tenant.set_default_header("Impersonate-Group", "tenants")
        client.CoreV1Api(tenant).create_namespaced_config_map("default", {"metadata": {"name": "as-alice"}})
    assert [a.user_info for a in seen] == [
        {
            "username": "system:serviceaccount:capm3-system:capm3-manager",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:capm3-system", "system:authenticated"],
        },
        {"username": "alice", "groups": ["tenants", "system:authenticated"]},
    ]


def test_slow_admission_hook_does_not_block_other_requests() -> None:
    release = threading.Event()

    def hook(attrs: AdmissionAttributes) -> None:
        release.wait(5)

    with Emulator(admission=hook) as emu:
        core = client.CoreV1Api(emu.api_client())
        writer = threading.Thread(
            target=core.create_namespaced_config_map, args=("default", {"metadata": {"name": "slow"}})
        )
        writer.start()
        time.sleep(0.1)
        started = time.monotonic()
        assert core.list_namespaced_config_map("default").items == []
        assert time.monotonic() - started < 0.5
        release.set()
        writer.join(5)
        assert emu.get("v1", "configmaps", "default", "slow") is not None


def test_two_emulators_and_restart_on_same_port() -> None:
    with Emulator() as mgmt, Emulator(served={"cluster.x-k8s.io": ["v1beta1"]}) as workload:
        assert mgmt.port != workload.port
        mgmt.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "only-mgmt"}}, namespace="default")
        assert client.CoreV1Api(workload.api_client()).list_namespaced_config_map("default").items == []
        core = client.CoreV1Api(mgmt.api_client())
        port = mgmt.port
        started = time.monotonic()
        mgmt.stop()
        assert time.monotonic() - started < 1.0
        with pytest.raises(urllib3.exceptions.MaxRetryError) as err:
            core.list_namespaced_config_map("default", _request_timeout=1)
        assert "refused" in str(err.value.reason).lower()
        with Emulator(port=port):  # the port is free again for a brand-new emulator
            assert core.list_namespaced_config_map("default").items == []
        mgmt.start()
        assert mgmt.port == port
        assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["only-mgmt"]


def test_stop_drops_delayed_requests_promptly() -> None:
    emu = Emulator().start()
    core = client.CoreV1Api(emu.api_client())
    emu.add_fault(Fault(delay_seconds=10))
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            core.list_namespace(_request_timeout=15)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.2)
    started = time.monotonic()
    emu.stop()
    caller.join(5)
    assert time.monotonic() - started < 1.0
    assert len(outcome) == 1 and isinstance(outcome[0], urllib3.exceptions.HTTPError)
