"""The reconciler: heals drift at start, on mapping change and on resync; safe with two replicas."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kubemu import AdmissionAttributes, AdmissionDenied, Emulator, Fault
from testbed.services import Scaling
from testbed.wait import wait_for
from testbed.world import CAPI, SLIME_NAMESPACE, config_map, machine_deployment, md_events, md_replicas, mirror
from tests.kubemu.helpers import raw

THESIS_CM = {"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3"}


def set_md(emulator: Emulator, replicas: int, name: str = "md", namespace: str = "metal3") -> None:
    emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", namespace, name, {"spec": {"replicas": replicas}})


def set_mirror(emulator: Emulator, replicas: int, name: str = "mirror-deployment") -> None:
    emulator.patch("apps/v1", "Deployment", SLIME_NAMESPACE, name, {"spec": {"replicas": replicas}})


@pytest.fixture
def thesis(emulator: Emulator) -> Emulator:
    emulator.create(mirror("mirror-deployment", replicas=3))
    emulator.create(machine_deployment("md", "metal3", replicas=3))
    emulator.create(config_map(THESIS_CM))
    return emulator


def test_drift_at_start_is_healed(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("mirror-deployment", replicas=4))
    emulator.create(machine_deployment("md", "metal3", replicas=1))
    emulator.create(config_map(THESIS_CM))
    scaling = scaling_factory(emulator)
    assert md_replicas(emulator, "metal3", "md") == 4
    assert scaling.metric("slime_scaling_drift_corrections_total") == 1
    (event,) = wait_for(lambda: md_events(emulator, "metal3", "md", "DriftCorrected"), what="the DriftCorrected event")
    assert event["message"] == "Set replicas to 4 (was 1) to match mirror Deployment slime/mirror-deployment"
    assert event["type"] == "Normal" and event["source"]["component"] == "slime-scaling-webhook"


def test_reconcile_once_heals_drift_and_records_event(thesis: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling = scaling_factory(thesis)
    assert scaling.service.reconcile_once() == []  # in step: nothing to do
    set_md(thesis, 7)  # someone scaled the MachineDeployment directly
    (drift,) = scaling.service.reconcile_once()
    assert (drift.mirror_replicas, drift.machine_deployment_replicas) == (3, 7)
    assert md_replicas(thesis, "metal3", "md") == 3
    assert scaling.metric("slime_scaling_drift_corrections_total") == 1
    wait_for(lambda: md_events(thesis, "metal3", "md", "DriftCorrected"), what="the event")
    thesis.clear_requests()
    assert scaling.service.reconcile_once() == []
    assert not [c for c in thesis.requests if c.method == "PATCH"]


def test_reconcile_writes_an_absolute_merge_patch(thesis: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling = scaling_factory(thesis)
    set_mirror(thesis, 0)
    thesis.clear_requests()
    scaling.service.reconcile_once()
    patches = [c for c in thesis.requests if c.method == "PATCH"]
    assert [(c.resource, c.subresource, c.path) for c in patches] == [
        ("machinedeployments", "scale", f"/apis/{CAPI}/v1beta2/namespaces/metal3/machinedeployments/md/scale")
    ]
    assert md_replicas(thesis, "metal3", "md") == 0


def test_missing_mirror_never_scales_to_zero(
    emulator: Emulator, scaling_factory: Callable[..., Scaling], caplog: pytest.LogCaptureFixture
) -> None:
    emulator.create(machine_deployment("md", "metal3", replicas=5))
    emulator.create(config_map(THESIS_CM))
    with caplog.at_level(logging.WARNING, logger="slime.scaling.reconciler"):
        scaling = scaling_factory(emulator)
        assert scaling.service.reconcile_once() == []
    assert md_replicas(emulator, "metal3", "md") == 5
    assert any(r.getMessage().startswith("mirror Deployment not found") for r in caplog.records)
    assert not [c for c in emulator.requests if c.method == "PATCH"]


def test_missing_machine_deployment_is_an_error_not_a_crash(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("mirror-deployment", replicas=2))
    emulator.create(config_map(THESIS_CM))
    scaling = scaling_factory(emulator)
    assert scaling.service.reconcile_once() == []
    assert (scaling.metric("slime_scaling_reconcile_errors_total") or 0) >= 1


def test_api_errors_are_counted_and_retried_next_pass(thesis: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling = scaling_factory(thesis)
    set_md(thesis, 9)
    thesis.add_fault(Fault(method="PATCH", path_regex=r"/scale$", status=500, times=1))
    assert scaling.service.reconcile_once() == []
    assert md_replicas(thesis, "metal3", "md") == 9
    assert scaling.metric("slime_scaling_reconcile_errors_total") == 1
    assert len(scaling.service.reconcile_once()) == 1
    assert md_replicas(thesis, "metal3", "md") == 3


def test_mapping_change_triggers_a_pass(thesis: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling_factory(thesis)
    thesis.create(mirror("mirror-new", replicas=6))
    thesis.create(machine_deployment("md-new", "metal3", replicas=1))
    cm = thesis.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"]["mappings"] = "- {mirror: slime/mirror-new, machineDeployment: metal3/md-new}"
    thesis.update(cm)
    wait_for(lambda: md_replicas(thesis, "metal3", "md-new") == 6, what="the new mapping reconciled")


def test_periodic_resync(thesis: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling_factory(thesis, resync_seconds=0.2)
    set_md(thesis, 11)
    wait_for(lambda: md_replicas(thesis, "metal3", "md") == 3, what="the resync to heal the drift")


def test_drift_is_left_alone_when_the_mirror_moves_meanwhile(thesis: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    """The admission path set the MachineDeployment before the mirror was persisted: do not undo it."""
    scaling = scaling_factory(thesis, settle_seconds=0.3)
    set_md(thesis, 5)  # as the webhook does when it admits a scale of the mirror to 5
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(scaling.service.reconcile_once()))
    worker.start()
    time.sleep(0.1)  # the reconciler has seen mirror=3 and md=5, and is settling
    set_mirror(thesis, 5)  # the API server persists the mirror scale
    worker.join(5)
    assert result == [[]]
    assert md_replicas(thesis, "metal3", "md") == 5


def test_two_replicas_converge(emulator_factory: Callable[..., Emulator], scaling_factory: Callable[..., Scaling]) -> None:
    """Two webhook replicas behind one Service, interleaved admissions and reconciles: MD ends equal to the mirror."""
    replicas: list[Scaling] = []
    turn = itertools.count()

    def hook(attrs: AdmissionAttributes) -> None:
        if attrs.subresource != "scale" or attrs.resource != "deployments" or len(replicas) < 2:
            return None
        target = replicas[next(turn) % 2]  # the Service spreads requests over both pods
        request = {
            "kind": attrs.kind, "resource": {"group": attrs.group, "version": attrs.version, "resource": attrs.resource},
            "subResource": "scale", "namespace": attrs.namespace, "name": attrs.name, "operation": attrs.operation,
            "object": attrs.object, "oldObject": attrs.old_object, "dryRun": attrs.dry_run,
        }
        response = target.review(request)
        if not response["allowed"]:
            raise AdmissionDenied(response["status"]["message"], response["status"]["code"])
        return None

    emulator = emulator_factory(admission=hook)
    emulator.create(mirror("mirror-deployment", replicas=1))
    emulator.create(machine_deployment("md", "metal3", replicas=1))
    emulator.create(config_map(THESIS_CM))
    replicas.extend([scaling_factory(emulator, settle_seconds=0.01), scaling_factory(emulator, settle_seconds=0.01)])
    api = emulator.api_client()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reconcile_forever(scaling: Scaling) -> None:
        try:
            while not stop.is_set():
                scaling.service.reconcile_once()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    loops = [threading.Thread(target=reconcile_forever, args=(s,)) for s in replicas]
    for loop in loops:
        loop.start()
    try:
        for value in (3, 7, 2, 9, 0, 4, 6, 1, 5, 8, 5, 2):
            raw(api, "PATCH", f"/apis/apps/v1/namespaces/{SLIME_NAMESPACE}/deployments/mirror-deployment/scale",
                body={"spec": {"replicas": value}}, content_type="application/merge-patch+json")
    finally:
        stop.set()
        for loop in loops:
            loop.join(10)
        api.close()
    assert errors == []
    assert all(s.service.reconciler.passes > 1 for s in replicas)
    for scaling in replicas:  # one quiet pass each, as the next resync would do
        scaling.service.reconcile_once()
    assert emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-deployment")["spec"]["replicas"] == 2
    assert md_replicas(emulator, "metal3", "md") == 2
