"""Watch semantics through kubernetes.watch.Watch against the emulator."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ProtocolError

from kubemu import Emulator
from testbed.framework.builders import machine_deployment, pod


def _watch_in_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[queue.Queue, watch.Watch]:
    """Run Watch().stream in a thread; events land in a queue (None when the stream ends)."""
    events: queue.Queue = queue.Queue()
    w = watch.Watch()

    def run() -> None:
        try:
            for event in w.stream(func, *args, **kwargs):
                events.put((event["type"], event["raw_object"]))
        except ProtocolError:
            pass  # Watch.stop() shuts the socket down under the reading thread
        finally:
            events.put(None)

    threading.Thread(target=run, daemon=True).start()
    return events, w


def _next(events: queue.Queue, timeout: float = 2.0) -> tuple[str, str]:
    type_, obj = events.get(timeout=timeout)
    return type_, obj["metadata"]["name"]


def test_watch_sees_existing_then_live_events(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    core = client.CoreV1Api(api)
    emu.create(pod("old", {"app": "s"}), namespace=ns)
    events, w = _watch_in_thread(core.list_namespaced_pod, namespace=ns, label_selector="app=s", timeout_seconds=5)
    assert _next(events) == ("ADDED", "old")
    core.create_namespaced_pod(ns, pod("new", {"app": "s"}))
    core.create_namespaced_pod(ns, pod("unrelated", {"app": "other"}))
    assert _next(events) == ("ADDED", "new")
    core.patch_namespaced_pod("new", ns, {"metadata": {"annotations": {"x": "1"}}})
    type_, obj = events.get(timeout=2)
    assert type_ == "MODIFIED" and obj["metadata"]["annotations"] == {"x": "1"}
    core.delete_namespaced_pod("old", ns)
    assert _next(events) == ("DELETED", "old")
    w.stop()


def test_watch_event_is_prompt(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    events, w = _watch_in_thread(client.CoreV1Api(api).list_namespaced_pod, namespace=ns, timeout_seconds=5)
    time.sleep(0.2)  # let the watch open
    started = time.monotonic()
    emu.create(pod("fast"), namespace=ns)
    assert _next(events) == ("ADDED", "fast")
    assert time.monotonic() - started < 0.05
    w.stop()


def test_selector_leave_and_enter(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    emu.create(pod("p", {"role": "ctl"}), namespace=ns)
    events, w = _watch_in_thread(
        client.CoreV1Api(api).list_namespaced_pod, namespace=ns, label_selector="role=ctl", timeout_seconds=5
    )
    assert _next(events) == ("ADDED", "p")
    emu.patch("v1", "pods", ns, "p", {"metadata": {"labels": {"role": "worker"}}})
    type_, obj = events.get(timeout=2)
    assert (type_, obj["metadata"]["labels"]) == ("DELETED", {"role": "ctl"})
    emu.patch("v1", "pods", ns, "p", {"metadata": {"labels": {"role": "ctl"}}})
    assert _next(events) == ("ADDED", "p")
    w.stop()


def test_resume_from_resource_version_replays_history(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    core = client.CoreV1Api(api)
    listed = core.list_namespaced_pod(ns)
    emu.create(pod("a"), namespace=ns)
    emu.delete("v1", "pods", ns, "a")
    seen = [
        (e["type"], e["raw_object"]["metadata"]["name"])
        for e in watch.Watch().stream(
            core.list_namespaced_pod, namespace=ns, resource_version=listed.metadata.resource_version, timeout_seconds=1
        )
    ]
    assert seen == [("ADDED", "a"), ("DELETED", "a")]


def test_expired_resource_version_is_410() -> None:
    with Emulator(history_size=3) as emu:
        core = client.CoreV1Api(emu.api_client())
        for i in range(5):
            emu.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm{i}"}}, namespace="default")
        with pytest.raises(ApiException) as err:
            list(
                watch.Watch().stream(
                    core.list_namespaced_config_map, namespace="default", resource_version="1", timeout_seconds=1
                )
            )
        assert err.value.status == 410 and "Expired" in err.value.reason


def test_watch_custom_objects_cluster_wide_across_versions(api: client.ApiClient, emu: Emulator, ns: str) -> None:
    co = client.CustomObjectsApi(api)
    events, w = _watch_in_thread(
        co.list_cluster_custom_object, "cluster.x-k8s.io", "v1beta2", "machinedeployments", timeout_seconds=5
    )
    emu.create(machine_deployment("md", version="v1beta1"), namespace=ns)
    type_, obj = events.get(timeout=2)
    assert (type_, obj["metadata"]["name"], obj["apiVersion"]) == ("ADDED", "md", "cluster.x-k8s.io/v1beta2")
    w.stop()


def test_watch_times_out_and_sends_bookmark(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    started = time.monotonic()
    w = watch.Watch()
    seen = [
        e["type"]
        for e in w.stream(core.list_namespaced_pod, namespace=ns, timeout_seconds=1, allow_watch_bookmarks=True)
    ]
    assert 0.9 < time.monotonic() - started < 3
    assert seen == ["BOOKMARK"] and w.resource_version is not None


def test_stop_ends_open_watches() -> None:
    emu = Emulator().start()
    events, _ = _watch_in_thread(
        client.CoreV1Api(emu.api_client()).list_namespaced_pod, namespace="default", timeout_seconds=30
    )
    time.sleep(0.2)
    emu.stop()
    assert events.get(timeout=3) is None
