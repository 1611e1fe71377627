"""The reconciler, the one writer: adopts new mappings, follows stored mirrors, heals drift at once,
respects pauses and other writers, caps at maxReplicas, and leads alone among replicas."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from kubernetes.client.exceptions import ApiException

from common.names import ADOPTED_ANNOTATION
from kubemu import Emulator, Fault
from testbed.components.services import Scaling
from testbed.framework.objects import CAPI, SLIME_NAMESPACE, config_map, machine_deployment, mirror
from testbed.framework.reviews import scale_request
from testbed.framework.wait import wait_for
from testbed.framework.world import md_events, md_replicas, scale_mirror

SINGLE_CM = {"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3", "maxReplicas": "100"}
MD_REF = "metal3/md"


def set_md(emulator: Emulator, replicas: int, name: str = "md", namespace: str = "metal3") -> None:
    emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", namespace, name, {"spec": {"replicas": replicas}})


def mirror_of(emulator: Emulator, name: str = "mirror-deployment") -> dict:
    return emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, name)


@pytest.fixture
def single(emulator: Emulator) -> Emulator:
    """A mapping that existed before the test: the mirror is already adopted from metal3/md, both at 3."""
    emulator.create(mirror("mirror-deployment", replicas=3, adopted_from=MD_REF))
    emulator.create(machine_deployment("md", "metal3", replicas=3))
    emulator.create(config_map(SINGLE_CM))
    return emulator


# --- adopt, never reset -------------------------------------------------------------------------------


def test_a_new_mapping_adopts_the_pool_and_never_resets_it(
    emulator: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    """``helm install`` over a running pool: the mirror is created with no replicas (the API server
    makes it 1); mapping it must leave the MachineDeployment at 5."""
    emulator.create(machine_deployment("md", "metal3", replicas=5))
    emulator.create(mirror("mirror-deployment", replicas=None))  # as the chart renders it
    assert mirror_of(emulator)["spec"]["replicas"] == 1
    emulator.create(config_map(SINGLE_CM))
    scaling = scaling_factory(emulator)
    wait_for(lambda: mirror_of(emulator)["spec"]["replicas"] == 5, what="the mirror adopted at 5")
    assert md_replicas(emulator, "metal3", "md") == 5
    assert mirror_of(emulator)["metadata"]["annotations"][ADOPTED_ANNOTATION] == MD_REF
    assert scaling.metric("slime_scaling_writes_total", 'reason="adopt"') == 1
    (event,) = wait_for(
        lambda: md_events(emulator, "metal3", "md", "AdoptedByMirror"), what="the AdoptedByMirror event"
    )
    assert "the mirror was set to this MachineDeployment's 5 replicas" in event["message"]
    assert not [c for c in emulator.requests if c.resource == "machinedeployments" and c.method == "PATCH"]
    # From now on the MachineDeployment follows the mirror.
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", 7)
    wait_for(lambda: md_replicas(emulator, "metal3", "md") == 7, what="7")


def test_removing_a_mapping_leaves_the_machine_deployment_and_mapping_again_adopts_again(
    single: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    scaling = scaling_factory(single)
    single.patch(
        "v1",
        "ConfigMap",
        SLIME_NAMESPACE,
        "scaling-webhook-configmap",
        {"data": {"machineDeploymentName": None, "machineDeploymentNamespace": None, "maxReplicas": None}},
    )
    wait_for(
        lambda: ADOPTED_ANNOTATION not in (mirror_of(single)["metadata"].get("annotations") or {}),
        what="the mark removed",
    )
    scale_mirror(single, SLIME_NAMESPACE, "mirror-deployment", 9)  # unmapped: nothing follows
    set_md(single, 4)
    single.patch("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap", {"data": SINGLE_CM})
    wait_for(lambda: mirror_of(single)["spec"]["replicas"] == 4, what="the mirror adopted again, at 4")
    assert md_replicas(single, "metal3", "md") == 4
    assert scaling.metric("slime_scaling_writes_total", 'reason="adopt"') == 1


# --- follow and heal ------------------------------------------------------------------------------------


def test_drift_at_start_is_healed(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("mirror-deployment", replicas=4, adopted_from=MD_REF))
    emulator.create(machine_deployment("md", "metal3", replicas=1))
    emulator.create(config_map(SINGLE_CM))
    scaling = scaling_factory(emulator)
    assert md_replicas(emulator, "metal3", "md") == 4
    assert scaling.metric("slime_scaling_writes_total", 'reason="drift"') == 1
    (event,) = wait_for(lambda: md_events(emulator, "metal3", "md", "DriftCorrected"), what="the DriftCorrected event")
    assert event["message"] == "Set replicas to 4 (was 1) to match mirror Deployment slime-system/mirror-deployment"
    assert event["type"] == "Normal" and event["source"]["component"] == "slime-scaling-webhook"


def test_a_hand_edit_is_healed_on_its_watch_event(single: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    """No resync needed (it is an hour here): the MachineDeployment's watch wakes the reconciler."""
    scaling = scaling_factory(single)
    set_md(single, 7)  # someone (or something with write access) scaled the MachineDeployment directly
    started = time.monotonic()
    wait_for(lambda: md_replicas(single, "metal3", "md") == 3, 5, "the watch-driven heal")
    healed_in = time.monotonic() - started
    assert scaling.metric("slime_scaling_writes_total", 'reason="drift"') == 1
    assert healed_in >= 0  # the figure goes to docs/reliability.md through the reliability suite, not asserted here


def test_reconcile_once_is_quiet_when_in_step(single: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling = scaling_factory(single)
    single.clear_requests()
    assert scaling.service.reconcile_once() == []
    assert not [c for c in single.requests if c.method in ("PATCH", "PUT", "POST") and c.resource != "leases"]


def test_reconcile_writes_an_absolute_merge_patch(single: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling_factory(single)
    single.clear_requests()
    scale_mirror(single, SLIME_NAMESPACE, "mirror-deployment", 0)
    wait_for(lambda: md_replicas(single, "metal3", "md") == 0, what="0")
    patches = [c for c in single.requests if c.method == "PATCH" and c.resource == "machinedeployments"]
    assert [(c.resource, c.subresource, c.path) for c in patches] == [
        ("machinedeployments", "scale", f"/apis/{CAPI}/v1beta2/namespaces/metal3/machinedeployments/md/scale")
    ]


def test_missing_mirror_never_scales_to_zero(
    emulator: Emulator, scaling_factory: Callable[..., Scaling], caplog: pytest.LogCaptureFixture
) -> None:
    emulator.create(machine_deployment("md", "metal3", replicas=5))
    emulator.create(config_map(SINGLE_CM))
    with caplog.at_level(logging.WARNING, logger="slime.scaling.reconciler"):
        scaling = scaling_factory(emulator)
        assert scaling.service.reconcile_once() == []
    assert md_replicas(emulator, "metal3", "md") == 5
    assert any(
        r.getMessage()
        == "mirror Deployment slime-system/mirror-deployment not found; the MachineDeployment is left as it is"
        for r in caplog.records
    )
    assert scaling.metric("slime_scaling_waiting_mappings", 'reason="missing"') == 1
    assert not [c for c in emulator.requests if c.method == "PATCH"]


def test_missing_machine_deployment_waits_without_a_write(
    emulator: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    emulator.create(mirror("mirror-deployment", replicas=2))
    emulator.create(config_map(SINGLE_CM))
    scaling = scaling_factory(emulator)
    assert scaling.service.reconcile_once() == []
    assert scaling.metric("slime_scaling_waiting_mappings", 'reason="missing"') == 1
    assert not [c for c in emulator.requests if c.method == "PATCH"]
    emulator.create(machine_deployment("md", "metal3", replicas=6))  # it appears: the pool is adopted
    wait_for(lambda: mirror_of(emulator)["spec"]["replicas"] == 6, what="adoption once the MachineDeployment exists")


def test_api_errors_are_counted_and_retried_next_pass(
    single: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    scaling = scaling_factory(single)
    single.add_fault(Fault(method="PATCH", path_regex=r"/scale$", status=500, times=1))
    set_md(single, 9)
    wait_for(lambda: scaling.metric("slime_scaling_reconcile_errors_total") == 1, what="the failed write counted")
    wait_for(lambda: md_replicas(single, "metal3", "md") == 3, what="the retry (the next watch event or pass)")


def test_mapping_change_triggers_a_pass(single: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling_factory(single)
    single.create(mirror("mirror-new", replicas=6, adopted_from="metal3/md-new"))
    single.create(machine_deployment("md-new", "metal3", replicas=1))
    cm = single.get("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap")
    cm["data"]["mappings"] = "- {mirror: slime-system/mirror-new, machineDeployment: metal3/md-new, maxReplicas: 100}"
    single.update(cm)
    wait_for(lambda: md_replicas(single, "metal3", "md-new") == 6, what="the new mapping reconciled")


def test_periodic_resync(single: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    scaling = scaling_factory(single, resync_seconds=0.2)
    passes = scaling.service.reconciler.passes
    wait_for(lambda: scaling.service.reconciler.passes >= passes + 3, what="three resync passes")


# --- caps, pauses and other writers ---------------------------------------------------------------------


def test_max_replicas_caps_the_machine_deployment(emulator: Emulator, scaling_factory: Callable[..., Scaling]) -> None:
    emulator.create(mirror("mirror-a", replicas=2, adopted_from="metal3/md-a"))
    emulator.create(machine_deployment("md-a", "metal3", replicas=2))
    emulator.create(
        config_map({"mappings": "- {mirror: slime-system/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 4}"})
    )
    scaling = scaling_factory(emulator)
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-a", 9)
    wait_for(lambda: md_replicas(emulator, "metal3", "md-a") == 4, what="capped at 4")
    (event,) = wait_for(
        lambda: md_events(emulator, "metal3", "md-a", "ReplicasCapped"), what="the ReplicasCapped event"
    )
    assert event["type"] == "Warning" and "capped at maxReplicas 4" in event["message"]
    assert scaling.metric("slime_scaling_waiting_mappings", 'reason="capped"') == 1
    assert scaling.metric("slime_scaling_capped_admissions_total") == 1
    time.sleep(0.2)
    assert md_replicas(emulator, "metal3", "md-a") == 4


@pytest.mark.parametrize("where", ["md-spec", "md-annotation", "cluster-spec", "cluster-annotation"])
def test_a_pause_is_respected_and_the_change_applied_when_lifted(
    emulator: Emulator, scaling_factory: Callable[..., Scaling], where: str
) -> None:
    emulator.create(mirror("mirror-deployment", replicas=3, adopted_from=MD_REF))
    emulator.create(machine_deployment("md", "metal3", replicas=3))
    emulator.create(
        {
            "apiVersion": f"{CAPI}/v1beta1",
            "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "metal3"},
            "spec": {},
        }
    )
    emulator.create(config_map(SINGLE_CM))
    kind, field = where.split("-")
    target = ("MachineDeployment", "md") if kind == "md" else ("Cluster", "c1")
    pause = (
        {"spec": {"paused": True}}
        if field == "spec"
        else {"metadata": {"annotations": {"cluster.x-k8s.io/paused": "true"}}}
    )
    unpause = (
        {"spec": {"paused": False}}
        if field == "spec"
        else {"metadata": {"annotations": {"cluster.x-k8s.io/paused": None}}}
    )
    emulator.patch(f"{CAPI}/v1beta1", target[0], "metal3", target[1], pause)
    scaling = scaling_factory(emulator)
    response = scaling.review(scale_request(SLIME_NAMESPACE, "mirror-deployment", 6, old_replicas=3))
    assert response["allowed"] is True and "it waits:" in response["status"]["message"]
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", 6)
    wait_for(lambda: md_events(emulator, "metal3", "md", "WaitingForUnpause"), what="the WaitingForUnpause event")
    assert scaling.metric("slime_scaling_waiting_mappings", 'reason="paused"') == 1
    scaling.service.reconcile_once()
    assert md_replicas(emulator, "metal3", "md") == 3
    assert not [
        c
        for c in emulator.requests
        if c.method == "PATCH" and c.resource == "machinedeployments" and c.subresource == "scale"
    ]
    emulator.patch(f"{CAPI}/v1beta1", target[0], "metal3", target[1], unpause)
    wait_for(lambda: md_replicas(emulator, "metal3", "md") == 6, what="the change applied once the pause is lifted")


def test_a_cluster_autoscaler_node_group_is_never_written(
    emulator: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    emulator.create(mirror("mirror-deployment", replicas=3, adopted_from=MD_REF))
    md = machine_deployment("md", "metal3", replicas=3)
    md["metadata"]["annotations"] = {
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "10",
    }
    emulator.create(md)
    emulator.create(config_map(SINGLE_CM))
    scaling = scaling_factory(emulator)
    with pytest.raises(ApiException) as refused:
        scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", 6)
    assert refused.value.status == 409 and "is a cluster-autoscaler node group" in str(refused.value.body)
    emulator.patch(
        "apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-deployment", {"spec": {"replicas": 6}}
    )  # stored anyway (webhook down)
    (event,) = wait_for(lambda: md_events(emulator, "metal3", "md", "ClusterAutoscalerManaged"), what="the Warning")
    assert event["type"] == "Warning"
    assert scaling.metric("slime_scaling_waiting_mappings", 'reason="autoscaler"') == 1
    assert md_replicas(emulator, "metal3", "md") == 3


# --- one writer among replicas --------------------------------------------------------------------------


def test_only_the_lease_holder_writes_and_another_takes_over(
    emulator: Emulator, scaling_factory: Callable[..., Scaling], scale_routes: dict
) -> None:
    emulator.create(mirror("mirror-deployment", replicas=1, adopted_from=MD_REF))
    emulator.create(machine_deployment("md", "metal3", replicas=1))
    emulator.create(config_map(SINGLE_CM))
    lease = {
        "lease_duration_seconds": 3,
        "lease_renew_deadline_seconds": 2,
        "lease_retry_seconds": 0.5,
    }  # a quick takeover
    replicas = [scaling_factory(emulator, **lease), scaling_factory(emulator, **lease)]
    wait_for(lambda: sum(s.service.leader.is_leader for s in replicas) == 1, what="one leader")  # type: ignore[union-attr]
    for value in (2, 5, 3):  # admissions reach both replicas in turn
        scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", value)
        wait_for(lambda v=value: md_replicas(emulator, "metal3", "md") == v, what=f"{value}")
    leader, follower = sorted(replicas, key=lambda s: not s.service.leader.is_leader)  # type: ignore[union-attr]
    assert leader.metric("slime_scaling_writes_total", 'reason="mirror"') == 3
    assert follower.metric("slime_scaling_writes_total", 'reason="mirror"') == 0
    assert (leader.metric("slime_scaling_leader"), follower.metric("slime_scaling_leader")) == (1, 0)
    lease = emulator.get("coordination.k8s.io/v1", "Lease", SLIME_NAMESPACE, "slime-scaling-webhook")
    assert lease["spec"]["holderIdentity"] == leader.service.leader.identity  # type: ignore[union-attr]
    scale_routes[id(emulator)].remove(leader)
    leader.running.stop()  # gives the Lease up on the way out
    wait_for(lambda: follower.service.leader.is_leader, 10, "the follower to take over")  # type: ignore[union-attr]
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror-deployment", 8)
    wait_for(lambda: md_replicas(emulator, "metal3", "md") == 8, what="the new leader to write")
