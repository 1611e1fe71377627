"""Informers against kubemu: paged list, the watch, selectors, transforms, errors, and the shared InformerSet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.cache import LIST_PAGE_SIZE, Informer, InformerSet, object_key, strip_noise
from common.kube import KubeClient, local_client
from kubemu import Emulator, Fault
from testbed.framework.wait import wait_for

NS = "default"
CONFIG_MAPS = f"/api/v1/namespaces/{NS}/configmaps"


@pytest.fixture
def kube(emulator: Emulator, tmp_path: Path) -> Iterator[KubeClient]:
    client = local_client(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    yield client
    client.close()


@pytest.fixture
def informers(kube: KubeClient) -> Iterator[list[Informer]]:
    """Informers a test starts; all stopped after it."""
    started: list[Informer] = []
    yield started
    for informer in started:
        informer.stop()


def config_map(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "data": data,
    }


def start(informers: list[Informer], informer: Informer) -> Informer:
    informers.append(informer.start())
    return informer


def test_strip_noise_drops_managed_fields_and_the_last_applied_configuration() -> None:
    obj = {
        "metadata": {
            "name": "a",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "me"},
        },
        "spec": {"x": 1},
    }
    assert strip_noise(obj) == {"metadata": {"name": "a", "annotations": {"keep": "me"}}, "spec": {"x": 1}}
    assert strip_noise({}) == {}


def test_object_key_of_namespaced_and_cluster_objects() -> None:
    assert object_key({"metadata": {"namespace": "ns", "name": "a"}}) == ("ns", "a")
    assert object_key({"metadata": {"name": "node-1"}}) == ("", "node-1")
    assert object_key({}) == ("", "")


def test_lists_then_follows_adds_changes_and_deletes(
    kube: KubeClient, emulator: Emulator, informers: list[Informer]
) -> None:
    emulator.create(config_map("a", v="1"))
    changes: list[int] = []
    informer = Informer(kube, CONFIG_MAPS, description="config maps")
    informer.add_listener(lambda: changes.append(len(informer)))
    start(informers, informer)
    assert informer.wait_synced(5.0)
    assert informer.get(NS, "a")["data"] == {"v": "1"}  # type: ignore[index]
    assert changes, "the listener hears the list"
    emulator.create(config_map("b"))
    emulator.patch("v1", "ConfigMap", NS, "a", {"data": {"v": "2"}})
    emulator.delete("v1", "ConfigMap", NS, "b")
    wait_for(lambda: (informer.get(NS, "a") or {}).get("data") == {"v": "2"}, what="the change of a")
    wait_for(lambda: informer.get(NS, "b") is None and len(informer) == 1, what="b to come and go")
    assert len(changes) >= 4, f"the listener hears each event: {changes}"


def test_a_large_collection_is_listed_in_pages(kube: KubeClient, emulator: Emulator, informers: list[Informer]) -> None:
    for i in range(LIST_PAGE_SIZE + 1):
        emulator.create(config_map(f"cm-{i:04d}"))
    emulator.clear_requests()
    informer = start(informers, Informer(kube, CONFIG_MAPS))
    assert informer.wait_synced(10.0)
    assert len(informer) == LIST_PAGE_SIZE + 1
    lists = [r.query for r in emulator.requests if r.verb == "list"]
    assert len(lists) == 2 and f"limit={LIST_PAGE_SIZE}" in lists[0] and "continue=" in lists[1]


def test_selectors_narrow_and_the_transform_trims(
    kube: KubeClient, emulator: Emulator, informers: list[Informer]
) -> None:
    emulator.create(config_map("mine", labels={"app": "x"}, v="1"))
    emulator.create(config_map("other", labels={"app": "y"}, v="1"))

    def names_only(obj: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]}}

    labelled = start(informers, Informer(kube, CONFIG_MAPS, label_selector="app=x", transform=names_only))
    named = start(informers, Informer(kube, CONFIG_MAPS, field_selector="metadata.name=other"))
    assert labelled.wait_synced(5.0) and named.wait_synced(5.0)
    assert labelled.items() == [{"metadata": {"name": "mine", "namespace": NS}}]
    assert [o["metadata"]["name"] for o in named.items()] == ["other"]
    emulator.create(config_map("mine-too", labels={"app": "x"}, v="1"))
    wait_for(lambda: labelled.get(NS, "mine-too") == {"metadata": {"name": "mine-too", "namespace": NS}}, what="watch")
    assert named.get(NS, "mine-too") is None


def test_a_failing_list_is_not_synced_names_the_error_and_recovers(
    kube: KubeClient, emulator: Emulator, informers: list[Informer]
) -> None:
    emulator.create(config_map("a"))
    fault = emulator.add_fault(Fault(verb="list", path_regex="/configmaps$", status=403, message="no list for you"))
    informer = start(informers, Informer(kube, CONFIG_MAPS, description="config maps"))
    wait_for(lambda: informer.last_error, what="the error")
    assert not informer.synced and len(informer) == 0
    assert informer.last_error.startswith("403 Forbidden: ") and "no list for you" in informer.last_error
    fault.remove()
    assert informer.wait_synced(10.0)
    assert informer.last_error == "" and informer.get(NS, "a") is not None


def test_a_listener_that_raises_does_not_stop_the_cache(
    kube: KubeClient, emulator: Emulator, informers: list[Informer]
) -> None:
    informer = Informer(kube, CONFIG_MAPS)

    def broken() -> None:
        raise RuntimeError("listener bug")

    informer.add_listener(broken)
    start(informers, informer)
    assert informer.wait_synced(5.0)
    emulator.create(config_map("later"))
    wait_for(lambda: informer.get(NS, "later"), what="the watch to go on")


def test_an_informer_set_shares_by_path_and_selectors_and_reports_changes(kube: KubeClient, emulator: Emulator) -> None:
    changes: list[None] = []
    informer_set = InformerSet(kube, on_change=lambda: changes.append(None))
    try:
        first = informer_set.informer(CONFIG_MAPS)
        assert informer_set.informer(CONFIG_MAPS) is first
        narrowed = informer_set.informer(CONFIG_MAPS, label_selector="app=x")
        assert narrowed is not first and informer_set.all() == [first, narrowed]
        assert first.wait_synced(5.0)
        before = len(changes)
        emulator.create(config_map("c"))
        wait_for(lambda: len(changes) > before, what="on_change after an event")
    finally:
        informer_set.stop()
