"""Events: the core v1 body, and the EventRecorder posting to kubemu off the caller's thread, never raising."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from common.events import QUEUE_SIZE, EventRecorder, ObjectEvent, event_body, machine_deployment_event
from common.kube import KubeClient, local_client
from kubemu import Emulator, Fault

NOW = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


@pytest.fixture
def kube(emulator: Emulator, tmp_path: Path) -> Iterator[KubeClient]:
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "metal3"}})
    client = local_client(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    yield client
    client.close()


def test_event_body_is_a_new_style_core_event() -> None:
    event = ObjectEvent("Metal3Data", "infrastructure.cluster.x-k8s.io/v1beta1", "metal3", "d-0", "Withheld", "why")
    body = event_body(event, "slime-injection-webhook", "pod-1", NOW)
    assert body["metadata"]["name"].startswith("d-0.") and body["metadata"]["namespace"] == "metal3"
    assert body["involvedObject"] == {
        "kind": "Metal3Data",
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "namespace": "metal3",
        "name": "d-0",
    }
    assert (body["reason"], body["message"], body["type"], body["action"]) == ("Withheld", "why", "Normal", "Withheld")
    assert (body["reportingComponent"], body["reportingInstance"], body["source"]) == (
        "slime-injection-webhook",
        "pod-1",
        {"component": "slime-injection-webhook"},
    )
    assert (body["firstTimestamp"], body["eventTime"], body["count"]) == (
        "2026-03-04T05:06:07Z",
        "2026-03-04T05:06:07.890123Z",
        1,
    )


def test_event_body_carries_a_known_uid_and_two_events_get_two_names() -> None:
    event = ObjectEvent("Metal3Data", "v", "ns", "d", "R", "m", uid="1234")
    first, second = event_body(event, "c", "i", NOW), event_body(event, "c", "i", NOW)
    assert first["involvedObject"]["uid"] == "1234"
    assert first["metadata"]["name"] != second["metadata"]["name"]


def test_machine_deployment_event() -> None:
    normal = machine_deployment_event(("metal3", "md"), "cluster.x-k8s.io/v1beta2", "ScaledFromMirror", "to 3")
    assert normal == ObjectEvent(
        "MachineDeployment", "cluster.x-k8s.io/v1beta2", "metal3", "md", "ScaledFromMirror", "to 3", "Normal", "Scale"
    )
    assert machine_deployment_event(("metal3", "md"), "v", "R", "m", warning=True).type == "Warning"


def test_a_recorded_event_is_posted_and_reported(kube: KubeClient, emulator: Emulator) -> None:
    results: list[bool] = []
    recorder = EventRecorder(kube, "slime-scaling-webhook", on_result=results.append).start()
    try:
        recorder.record(machine_deployment_event(("metal3", "md"), "cluster.x-k8s.io/v1beta2", "Scaled", "to 3"))
        assert recorder.flush()
    finally:
        recorder.stop()
    (stored,) = emulator.list("v1", "Event", "metal3")
    assert (stored["reason"], stored["message"], stored["involvedObject"]["name"]) == ("Scaled", "to 3", "md")
    assert stored["reportingComponent"] == "slime-scaling-webhook"
    assert results == [True]


def test_a_refused_event_is_counted_never_raised(kube: KubeClient, emulator: Emulator) -> None:
    emulator.add_fault(Fault(method="POST", path_regex="/events$", status=403, message="no events"))
    results: list[bool] = []
    recorder = EventRecorder(kube, "c", on_result=results.append).start()
    try:
        recorder.record(ObjectEvent("MachineDeployment", "v", "metal3", "md", "R", "m"))
        assert recorder.flush()
    finally:
        recorder.stop()
    assert results == [False]
    assert emulator.list("v1", "Event", "metal3") == []


def test_a_full_queue_drops_without_blocking(kube: KubeClient) -> None:
    results: list[bool] = []
    recorder = EventRecorder(kube, "c", on_result=results.append)  # not started: nothing drains the queue
    event = ObjectEvent("MachineDeployment", "v", "metal3", "md", "R", "m")
    for _ in range(QUEUE_SIZE + 2):
        recorder.record(event)
    assert results == [False, False]
    assert not recorder.flush(timeout=0)
