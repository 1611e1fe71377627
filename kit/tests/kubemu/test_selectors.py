"""Label and field selectors on LIST, through the real client, plus parser edge cases."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubemu import Emulator
from kubemu.selectors import LabelSelector, match_labels_to_string
from testbed.framework.builders import pod


@pytest.fixture
def labelled(emu: Emulator, ns: str) -> str:
    emu.create(pod("a", {"app": "slurm", "tier": "ctl"}), namespace=ns)
    emu.create(pod("b", {"app": "slurm", "tier": "worker"}), namespace=ns)
    emu.create(pod("c", {"app": "web"}), namespace=ns)
    emu.create(pod("d"), namespace=ns)
    return ns


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("app=slurm", ["a", "b"]),
        ("app==slurm", ["a", "b"]),
        ("app!=slurm", ["c", "d"]),
        ("tier in (ctl,db)", ["a"]),
        ("tier notin (ctl)", ["b", "c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("app=slurm,tier!=ctl", ["b"]),
        ("app in (slurm, web),!tier", ["c"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
def test_label_selector_operators(api: client.ApiClient, labelled: str, selector: str, expected: list[str]) -> None:
    pods = client.CoreV1Api(api).list_namespaced_pod(labelled, label_selector=selector)
    assert [p.metadata.name for p in pods.items] == expected


@pytest.mark.parametrize("selector", ["app=", "=x", "a in (x", "tier notin", "a b", "app=sl urm", "a,,b"])
def test_malformed_label_selector_is_400(api: client.ApiClient, ns: str, selector: str) -> None:
    if selector == "app=":  # an empty value is valid: it matches an empty label
        assert client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items == []
        return
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector)
    assert (err.value.status, json.loads(err.value.body)["reason"]) == (400, "BadRequest")


def test_field_selectors(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    core = client.CoreV1Api(api)
    emu.create(
        {**pod("run"), "status": {"phase": "Running"}, "spec": {"nodeName": "n1", "containers": []}}, namespace=ns
    )
    emu.create({**pod("pend"), "status": {"phase": "Pending"}}, namespace=ns)

    def names(selector: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(ns, field_selector=selector).items]

    assert names("metadata.name=run") == ["run"]
    assert names("status.phase!=Running") == ["pend"]
    assert names("spec.nodeName==n1,metadata.namespace=" + ns) == ["run"]
    emu.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kc"}, "type": "cluster.x-k8s.io/secret"},
        namespace=ns,
    )
    emu.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other"}, "type": "Opaque"}, namespace=ns)
    secrets = core.list_namespaced_secret(ns, field_selector="type=cluster.x-k8s.io/secret")
    assert [s.metadata.name for s in secrets.items] == ["kc"]


def test_unsupported_field_is_400(api: client.ApiClient, ns: str) -> None:
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespaced_config_map(ns, field_selector="data.x=1")
    body = json.loads(err.value.body)
    assert (err.value.status, body["message"]) == (
        400,
        '"data.x" is not a known field selector: only "metadata.name", "metadata.namespace"',
    )


def test_selector_parser_and_rendering() -> None:
    sel = LabelSelector("example.com/role in (a,b),!gone")
    assert sel.matches({"example.com/role": "b"})
    assert not sel.matches({"example.com/role": "b", "gone": ""})
    assert not sel.matches({})
    rendered = match_labels_to_string(
        {
            "matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [{"key": "t", "operator": "In", "values": ["y", "x"]}],
        }
    )
    assert rendered == "a=1,b=2,t in (x,y)"
    assert LabelSelector(rendered).matches({"a": "1", "b": "2", "t": "x"})
