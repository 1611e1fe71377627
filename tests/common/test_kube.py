"""KubeClient and its helpers: version order, paths, errors from kubemu, discovery cache, and kubeconfig loading."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from common.kube import (
    KubeClient,
    KubeConfigError,
    KubeError,
    ResourcePath,
    client_from_kubeconfig,
    local_client,
    version_priority,
)
from kubemu import Emulator, Fault

CAPI = "cluster.x-k8s.io"


@pytest.fixture
def kube(emulator: Emulator, tmp_path: Path) -> Iterator[KubeClient]:
    client = local_client(emulator.write_kubeconfig(tmp_path / "kubeconfig"), user_agent="slime-kube-test")
    yield client
    client.close()


def test_version_priority_is_kubernetes_order() -> None:
    versions = ["v1alpha1", "v1beta2", "v1", "v2beta1", "v1beta1", "v2", "v10alpha1"]
    assert sorted(versions, key=version_priority, reverse=True) == [
        "v2",
        "v1",
        "v2beta1",
        "v1beta2",
        "v1beta1",
        "v10alpha1",
        "v1alpha1",
    ]


def test_resource_paths_of_core_and_group_resources() -> None:
    secrets = ResourcePath("", "v1", "secrets")
    assert secrets.collection() == "/api/v1/secrets"
    assert secrets.item("ns", "a b") == "/api/v1/namespaces/ns/secrets/a%20b"
    mds = ResourcePath(CAPI, "v1beta2", "machinedeployments")
    assert mds.collection("metal3") == f"/apis/{CAPI}/v1beta2/namespaces/metal3/machinedeployments"
    assert mds.item("metal3", "md", "scale") == f"/apis/{CAPI}/v1beta2/namespaces/metal3/machinedeployments/md/scale"


def test_kube_error_prefers_the_status_body() -> None:
    error = KubeError.from_status(403, "Forbidden", b'{"kind":"Status","reason":"Forbidden","message":"no, not you"}')
    assert (error.status, error.reason, error.message, str(error)) == (
        403,
        "Forbidden",
        "no, not you",
        "403 Forbidden: no, not you",
    )
    plain = KubeError.from_status(502, "Bad Gateway", b"<html>proxy</html>")
    assert (plain.reason, plain.message) == ("Bad Gateway", "Bad Gateway")
    assert str(KubeError(0, "Unreachable", "cannot reach it")) == "cannot reach it"


def test_request_returns_json_and_raises_the_servers_words(kube: KubeClient, emulator: Emulator) -> None:
    namespace = kube.request("GET", "/api/v1/namespaces/default")
    assert namespace["metadata"]["name"] == "default"
    assert emulator.requests[-1].user_agent.startswith("slime-kube-test")
    with pytest.raises(KubeError) as error:
        kube.request("GET", "/api/v1/namespaces/default/secrets/nope")
    assert (error.value.status, error.value.reason) == (404, "NotFound")
    assert error.value.message == 'secrets "nope" not found'


def test_an_unreachable_server_is_status_0_naming_the_cluster(
    emulator_factory: Callable[..., Emulator], tmp_path: Path
) -> None:
    gone = emulator_factory()
    kube = local_client(gone.write_kubeconfig(tmp_path / "kubeconfig"))
    gone.stop()
    with pytest.raises(KubeError) as error:
        kube.request("GET", "/api/v1/namespaces", timeout=2.0)
    assert (error.value.status, error.value.reason) == (0, "Unreachable")
    assert error.value.message.startswith("cannot reach the API server of cluster local: ")


def test_discovery_is_cached_until_forgotten(kube: KubeClient, emulator: Emulator) -> None:
    emulator.clear_requests()
    assert kube.served_versions(CAPI) == ["v1beta2", "v1beta1"]
    assert kube.served_versions(CAPI) == ["v1beta2", "v1beta1"]
    assert emulator.count_requests(path=f"/apis/{CAPI}") == 1
    kube.forget_discovery(CAPI)
    kube.served_versions(CAPI)
    assert emulator.count_requests(path=f"/apis/{CAPI}") == 2
    assert kube.served_versions("example.org") == []  # an absent group is no error


def test_resource_picks_the_newest_supported_and_names_a_mismatch(kube: KubeClient) -> None:
    assert kube.resource(CAPI, "machines", ("v1beta1",)) == ResourcePath(CAPI, "v1beta1", "machines")
    assert kube.resource(CAPI, "machines", ("v1beta1", "v1beta2")).version == "v1beta2"
    with pytest.raises(KubeError) as error:
        kube.resource(CAPI, "machines", ("v1alpha4",))
    assert error.value.status == 404
    assert error.value.message == (
        "cluster local serves no supported version of machines.cluster.x-k8s.io "
        "(served: v1beta2, v1beta1; supported: v1alpha4)"
    )
    with pytest.raises(KubeError, match=r"\(served: none; supported: v1\)"):
        kube.resource("example.org", "things", ("v1",))


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file or directory"),
        ("- a\n- list\n", "is not a kubeconfig (its YAML is not a map)"),
        ("{unclosed: [", "while parsing a flow node"),  # the YAML error's first line, not the content
    ],
)
def test_an_unusable_kubeconfig_file_is_named(tmp_path: Path, content: str | None, reason: str) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KubeConfigError) as error:
        local_client(str(path))
    assert str(error.value).startswith(f"kubeconfig {path} is not usable: ")
    assert reason in str(error.value)


def test_a_workload_kubeconfig_from_bytes_works(emulator_factory: Callable[..., Emulator]) -> None:
    workload = emulator_factory(workload=True, token="workload-token")  # https, as Cluster API writes it
    client = client_from_kubeconfig(yaml.safe_dump(workload.kubeconfig()).encode(), "metal3/bm-cluster")
    try:
        assert (client.name, client.trusted) == ("metal3/bm-cluster", False)
        assert client.request("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default"
    finally:
        client.close()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"- not a map", "refused: it is not a kubeconfig document (a YAML map)"),
        (b"{apiVersion: v1, clusters: 7}", "refused: clusters is not a list"),
        (b"\xff\xfe", "refused: it is not a kubeconfig document"),
        (b"a: [unclosed", "is not YAML"),
    ],
)
def test_an_unusable_workload_kubeconfig_names_the_cluster_not_the_content(data: bytes, reason: str) -> None:
    with pytest.raises(KubeError) as error:
        client_from_kubeconfig(data, "metal3/bm-cluster")
    assert (error.value.status, error.value.reason) == (0, "InvalidKubeconfig")
    assert error.value.message.startswith(f"kubeconfig for cluster metal3/bm-cluster {reason}")
    assert "not a map" not in error.value.message


def test_an_untrusted_clusters_errors_carry_its_status_only(emulator_factory: Callable[..., Emulator]) -> None:
    workload = emulator_factory(workload=True)
    workload.add_fault(Fault(path_regex="/namespaces/default$", status=403, message="EVIL: send your token to evil"))
    client = client_from_kubeconfig(yaml.safe_dump(workload.kubeconfig()).encode(), "metal3/bm-cluster")
    try:
        with pytest.raises(KubeError) as error:
            client.request("GET", "/api/v1/namespaces/default")
    finally:
        client.close()
    assert (error.value.status, error.value.reason) == (403, "Forbidden")
    assert str(error.value) == "403 Forbidden: the API server of cluster metal3/bm-cluster answered 403 Forbidden"
