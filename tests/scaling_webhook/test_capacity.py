"""Capacity-aware scale-up: an increase is capped at the BareMetalHosts that can take it, the rest
follows when hosts appear; a decrease is never capped; a count that cannot be made holds the pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubemu import Emulator
from scaling_webhook.capacity import Capacity, CapacityUnknown, HostSelector, count, host_is_free
from testbed.components.services import Scaling
from testbed.framework.objects import (
    CAPI,
    SLIME_NAMESPACE,
    baremetal_host,
    config_map,
    machine_deployment,
    metal3_machine_template,
    mirror,
    reuse_booking,
)
from testbed.framework.wait import wait_for
from testbed.framework.world import md_events, md_replicas, scale_mirror

NS, MD, CLUSTER = "metal3", "workers", "c1"
POOL = {"pool": "workers"}
REUSE = "infrastructure.cluster.x-k8s.io/node-reuse"


# --- the rule, as pure functions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "free"),
    [
        (baremetal_host("h", NS), True),
        (baremetal_host("h", NS, state="ready"), True),  # BMO's name for "available" before 0.5
        *[
            (baremetal_host("h", NS, state=s), False)
            for s in (
                "registering",
                "inspecting",
                "preparing",
                "provisioning",
                "provisioned",
                "externally provisioned",
                "deprovisioning",
                "powering off before delete",
                "deleting",
                "unmanaged",
                "",
            )
        ],
        (baremetal_host("h", NS, consumer="other-m3m"), False),
        (baremetal_host("h", NS, error="power on failed"), False),
        (baremetal_host("h", NS, annotations={"baremetalhost.metal3.io/paused": ""}), False),
        (baremetal_host("h", NS, annotations={"capm3.metal3.io/unhealthy": ""}), False),
        (baremetal_host("h", NS, annotations={"capi.metal3.io/unhealthy": ""}), False),
        (
            baremetal_host("h", NS, labels={"infrastructure.cluster.x-k8s.io/node-reuse": f"md-{MD}"}),
            True,
        ),  # as CAPM3 names the pool
        (baremetal_host("h", NS, labels={"infrastructure.cluster.x-k8s.io/node-reuse": MD}), False),
        (baremetal_host("h", NS, labels={"infrastructure.cluster.x-k8s.io/node-reuse": "other-pool"}), False),
    ],
)
def test_which_hosts_are_free(host: dict[str, Any], free: bool) -> None:
    assert host_is_free(host, MD) is free


def test_a_host_being_deleted_is_not_free() -> None:
    host = baremetal_host("h", NS)
    host["metadata"]["deletionTimestamp"] = "2026-11-22T10:00:00Z"
    assert not host_is_free(host, MD)


# --- node reuse: CAPM3 v1.13 books a host with the label alone, v1.14 with the label and the Cluster -------


def booked(
    name: str, pool: str | None = MD, cluster: str | None = CLUSTER, state: str = "available", **ref: str
) -> dict[str, Any]:
    """A host CAPM3 keeps for node reuse: the label ``md-<pool>`` (none when ``pool`` is None) and a consumerRef to
    Cluster ``cluster`` as v1.14 sets it (none, as v1.13 leaves it, when ``cluster`` is None; ``ref`` overrides)."""
    consumer = None if cluster is None else {**reuse_booking(cluster, NS), **ref}
    labels = {**POOL, **({REUSE: f"md-{pool}"} if pool is not None else {})}
    return baremetal_host(name, NS, state=state, labels=labels, consumer_ref=consumer)


@pytest.mark.parametrize(
    ("host", "free"),
    [
        (booked("v1.14, this pool's"), True),
        (booked("v1.14, this pool's, Cluster read as v1beta1", apiVersion="cluster.x-k8s.io/v1beta1"), True),
        (booked("v1.13, this pool's", cluster=None), True),
        (booked("v1.14, another pool of the same Cluster", pool="gpu"), False),
        (booked("v1.14, a pool of another Cluster", pool="other", cluster="c2"), False),
        (booked("v1.13, another pool's", pool="gpu", cluster=None), False),
        (booked("this Cluster's consumerRef without the label", pool=None), False),
        (booked("stale: another Cluster's booking with this pool's label", cluster="c2"), False),
        (booked("stale: a Cluster of another group", apiVersion="example.com/v1"), False),
        (booked("stale: this Cluster's name in another namespace", namespace="elsewhere"), False),
        (booked("stale: a Metal3Machine's consumerRef with the label", kind="Metal3Machine"), False),
        (booked("v1.14, this pool's, still deprovisioning", state="deprovisioning"), False),
    ],
    ids=lambda value: value["metadata"]["name"] if isinstance(value, dict) else str(value),
)
def test_which_node_reuse_bookings_are_free_for_this_pool(host: dict[str, Any], free: bool) -> None:
    assert host_is_free(host, MD, CLUSTER) is free


def test_a_control_plane_booking_is_taken() -> None:
    """CAPM3 labels a control plane's host ``cp-<name>``; no MachineDeployment's Machine gets it."""
    host = booked("cp", pool=None)
    host["metadata"]["labels"][REUSE] = f"cp-{MD}"
    assert not host_is_free(host, MD, CLUSTER)


def test_without_the_pools_cluster_a_clusters_booking_is_taken_and_a_label_alone_is_not() -> None:
    assert not host_is_free(booked("v1.14"), MD, None)
    assert host_is_free(booked("v1.13", cluster=None), MD, None)


def test_a_booking_is_free_for_its_pool_and_taken_for_every_other() -> None:
    """One namespace, two Clusters: c1 has pools workers and gpu, c2 has pool other. Every host is
    booked for reuse (v1.14 and v1.13 style) or stale; each pool counts only its own."""
    template = metal3_machine_template(MD, NS, host_selector={"matchLabels": POOL})
    hosts = [
        booked("workers-v114"),
        booked("workers-v113", cluster=None),
        booked("gpu-v114", pool="gpu"),
        booked("other-v114", pool="other", cluster="c2"),
        booked("workers-label-c2-booking", cluster="c2"),  # stale for workers; no pool of c2 has this label
        baremetal_host("free", NS, labels=POOL),
    ]
    assert count(NS, MD, template, hosts, [], cluster=CLUSTER) == Capacity(bound=0, free=3, reuse=2, stale=1)
    assert count(NS, "gpu", template, hosts, [], cluster=CLUSTER) == Capacity(bound=0, free=2, reuse=1, stale=0)
    assert count(NS, "other", template, hosts, [], cluster="c2") == Capacity(bound=0, free=2, reuse=1, stale=0)
    # The same hosts under CAPM3 v1.13 only (no Cluster bookings): the label alone decides.
    v113 = [h for h in hosts if (h["spec"].get("consumerRef") or {}).get("kind") != "Cluster"]
    assert count(NS, MD, template, v113, [], cluster=CLUSTER) == Capacity(bound=0, free=2, reuse=1, stale=0)


def test_a_booked_host_that_is_not_available_or_out_of_the_selector_is_not_free_nor_stale() -> None:
    template = metal3_machine_template(MD, NS, host_selector={"matchLabels": POOL})
    outside = booked("outside")
    outside["metadata"]["labels"]["pool"] = "gpu"
    hosts = [
        outside,
        booked("paused"),
        booked("stale, deprovisioning", cluster="c2", state="deprovisioning"),
    ]
    hosts[1]["metadata"]["annotations"]["baremetalhost.metal3.io/paused"] = ""
    assert count(NS, MD, template, hosts, [], cluster=CLUSTER) == Capacity(bound=0, free=0)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {}, True),
        ({"matchLabels": POOL}, POOL, True),
        ({"matchLabels": POOL}, {"pool": "gpu"}, False),
        (
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["workers", "spare"]}]},
            {"pool": "spare"},
            True,
        ),
        ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["workers"]}]}, {}, False),
        ({"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}]}, {"rack": "r1"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["32"]}]}, {"cores": "64"}, True),
        ({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["32"]}]}, {"cores": "32"}, False),
        ({"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["32"]}]}, {"cores": "many"}, False),
        (
            {"matchLabels": POOL, "matchExpressions": [{"key": "rack", "operator": "In", "values": ["r2"]}]},
            {"pool": "workers", "rack": "r2"},
            True,
        ),
    ],
)
def test_host_selector_as_capm3_reads_it(selector: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    assert HostSelector.of(selector).matches(labels) is matches


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        # CAPM3 lowercases the operator for labels.NewRequirement: "doesnotexist" is not an operator.
        (
            {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]},
            "operator 'DoesNotExist' of 'gpu' is not one CAPM3 accepts",
        ),
        ({"matchExpressions": [{"key": "pool", "operator": "In"}]}, "'pool' In needs values"),
        ({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["x"]}]}, "'cores' Gt needs an integer"),
        ({"matchExpressions": [{"operator": "Exists"}]}, "has no key"),
        ({"matchLabels": ["pool"]}, "matchLabels must be a map"),
    ],
)
def test_a_selector_capm3_cannot_use_is_an_unknown_capacity(selector: dict[str, Any], message: str) -> None:
    with pytest.raises(CapacityUnknown, match=message):
        HostSelector.of(selector)


def machine(name: str, infrastructure: str, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/deployment-name": MD}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-22T10:00:00Z"
    return {
        "apiVersion": f"{CAPI}/v1beta1",
        "kind": "Machine",
        "metadata": metadata,
        "spec": {"infrastructureRef": {"kind": "Metal3Machine", "name": infrastructure}},
    }


def test_the_ceiling_is_hosts_in_use_by_the_pool_plus_free_matching_hosts() -> None:
    template = metal3_machine_template(MD, NS, host_selector={"matchLabels": POOL})
    hosts = [
        baremetal_host("in-use-1", NS, state="provisioned", labels=POOL, consumer="m3m-1"),
        baremetal_host("in-use-2", NS, state="provisioning", labels=POOL, consumer="m3m-2"),
        baremetal_host(
            "leaving", NS, state="provisioned", labels=POOL, consumer="m3m-3"
        ),  # its Machine is being deleted
        baremetal_host("other-pool", NS, state="provisioned", labels=POOL, consumer="someone-else"),
        baremetal_host("free-1", NS, labels=POOL),
        baremetal_host("free-2", NS, labels=POOL),
        baremetal_host("gpu", NS, labels={"pool": "gpu"}),  # free, but not for this pool
        baremetal_host("broken", NS, labels=POOL, error="inspection failed"),
    ]
    machines = [
        machine("m-1", "m3m-1"),
        machine("m-2", "m3m-2"),
        machine("m-3", "m3m-3", deleting=True),
        machine("m-4", "m3m-4"),
    ]
    assert count(NS, MD, template, hosts, machines) == Capacity(bound=2, free=2)
    assert Capacity(bound=2, free=2).ceiling == 4  # m-4 still waits for a host: it takes one of the two free ones


# --- the reconciler ---------------------------------------------------------------------------------------


def capacity_config(capacity_aware: bool = True) -> dict[str, Any]:
    return config_map(
        {
            "mappings": f"- mirror: {SLIME_NAMESPACE}/mirror\n  machineDeployment: {NS}/{MD}\n  maxReplicas: 100\n"
            f"  capacityAware: {'true' if capacity_aware else 'false'}\n"
        }
    )


@pytest.fixture
def pool(emulator: Emulator) -> Emulator:
    """A Metal3 pool at 0, adopted by its mirror, and three free hosts for it (plus one for another pool)."""
    emulator.create(machine_deployment(MD, NS, replicas=0, full=True))
    emulator.create(mirror("mirror", replicas=0, adopted_from=f"{NS}/{MD}"))
    emulator.create(metal3_machine_template(MD, NS, host_selector={"matchLabels": POOL}))
    for index in range(3):
        emulator.create(baremetal_host(f"host-{index}", NS, labels=POOL))
    emulator.create(baremetal_host("gpu-0", NS, labels={"pool": "gpu"}))
    return emulator


def test_three_free_hosts_scale_to_five_gives_three_then_two_hosts_appear_gives_five(
    pool: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    pool.create(capacity_config())
    scaling = scaling_factory(pool)
    scale_mirror(pool, SLIME_NAMESPACE, "mirror", 5)
    wait_for(lambda: md_replicas(pool, NS, MD) == 3, what="the pool raised to the 3 hosts that can take Machines")
    (event,) = wait_for(lambda: md_events(pool, NS, MD, "CapacityLimited"), what="the CapacityLimited event")
    assert event["type"] == "Warning"
    assert event["message"] == (
        f"mirror {SLIME_NAMESPACE}/mirror asks 5; MachineDeployment {NS}/{MD} is held at 3 because 0 host(s) are in "
        "use by this pool and 3 available BareMetalHost(s) match its Metal3MachineTemplate's hostSelector; the rest "
        "follows when hosts become available"
    )
    assert scaling.metric("slime_scaling_capacity_shortfall_replicas") == 2
    assert scaling.metric("slime_scaling_waiting_mappings", 'reason="capacity"') == 1
    # Two hosts finish inspection: their watch events raise the pool, no resync needed.
    for index in (3, 4):
        pool.create(baremetal_host(f"host-{index}", NS, state="inspecting", labels=POOL))
        pool.patch(
            "metal3.io/v1alpha1",
            "BareMetalHost",
            NS,
            f"host-{index}",
            {"status": {"provisioning": {"state": "available"}}},
        )
    wait_for(lambda: md_replicas(pool, NS, MD) == 5, what="the pool raised to 5 once two more hosts are available")
    wait_for(lambda: scaling.metric("slime_scaling_capacity_shortfall_replicas") == 0, what="no shortfall")
    assert scaling.metric("slime_scaling_waiting_mappings", 'reason="capacity"') == 0
    # Each host raises the pool as its watch event arrives: 3, then 4 and 5 (or 5 at once).
    steps = [int(e["message"].split()[3]) for e in md_events(pool, NS, MD, "ScaledFromMirror")]
    assert steps[0] == 3 and steps[-1] == 5 and steps == sorted(set(steps)), steps


def test_hosts_the_pool_already_uses_count_and_a_scale_down_is_never_capped(
    pool: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    # Two Machines of the pool hold hosts 0 and 1 (CAPM3 set their consumerRef): one host is still free.
    pool.patch(f"{CAPI}/v1beta1", "MachineDeployment", NS, MD, {"spec": {"replicas": 2}})
    pool.patch("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror", {"spec": {"replicas": 2}})
    for index in (0, 1):
        pool.create(machine(f"m-{index}", f"m3m-{index}"))
        pool.patch(
            "metal3.io/v1alpha1",
            "BareMetalHost",
            NS,
            f"host-{index}",
            {
                "spec": {
                    "consumerRef": {
                        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                        "kind": "Metal3Machine",
                        "name": f"m3m-{index}",
                        "namespace": NS,
                    }
                },
                "status": {"provisioning": {"state": "provisioned"}},
            },
        )
    pool.create(capacity_config())
    scaling_factory(pool)
    scale_mirror(pool, SLIME_NAMESPACE, "mirror", 6)
    wait_for(lambda: md_replicas(pool, NS, MD) == 3, what="2 in use + 1 free")
    (event,) = wait_for(lambda: md_events(pool, NS, MD, "CapacityLimited"), what="the CapacityLimited event")
    assert "held at 3 because 2 host(s) are in use by this pool and 1 available" in event["message"]
    # Every host gone: a scale-down still goes through at once.
    for index in range(3):
        pool.delete("metal3.io/v1alpha1", "BareMetalHost", NS, f"host-{index}")
    scale_mirror(pool, SLIME_NAMESPACE, "mirror", 1)
    wait_for(lambda: md_replicas(pool, NS, MD) == 1, what="the scale-down")


def test_a_node_reuse_rollout_under_capm3_v1_14_is_not_capped_by_the_pools_own_bookings(
    pool: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    """Two of the pool's old Machines are gone and CAPM3 v1.14 booked their hosts for the pool's node reuse
    (consumerRef: the Cluster the MachineDeployment's spec.clusterName names, label md-workers): with the three
    free hosts, five Machines can be provisioned. A host another pool booked and a stale booking (this pool's label,
    another Cluster's consumerRef) are not counted."""
    for name, cluster, label in (
        ("reused-0", CLUSTER, f"md-{MD}"),
        ("reused-1", CLUSTER, f"md-{MD}"),
        ("gpu-pool", CLUSTER, "md-gpu"),
        ("stale", "c2", f"md-{MD}"),
    ):
        pool.create(baremetal_host(name, NS, labels={**POOL, REUSE: label}, consumer_ref=reuse_booking(cluster, NS)))
    pool.create(capacity_config())
    scaling = scaling_factory(pool)
    scale_mirror(pool, SLIME_NAMESPACE, "mirror", 7)
    wait_for(lambda: md_replicas(pool, NS, MD) == 5, what="3 free hosts + 2 booked for this pool's node reuse")
    (event,) = wait_for(lambda: md_events(pool, NS, MD, "CapacityLimited"), what="the CapacityLimited event")
    assert event["message"] == (
        f"mirror {SLIME_NAMESPACE}/mirror asks 7; MachineDeployment {NS}/{MD} is held at 5 because 0 host(s) are in "
        "use by this pool and 5 available BareMetalHost(s) match its Metal3MachineTemplate's hostSelector (2 of them "
        "booked for this pool's node reuse); 1 more carry this pool's node-reuse label but a consumerRef that is not "
        "its Cluster's, a stale booking not counted; the rest follows when hosts become available"
    )
    assert scaling.metric("slime_scaling_capacity_shortfall_replicas") == 2
    # CAPM3 takes the stale booking's host back for this pool's Cluster: its watch event raises the pool.
    pool.patch(
        "metal3.io/v1alpha1", "BareMetalHost", NS, "stale", {"spec": {"consumerRef": reuse_booking(CLUSTER, NS)}}
    )
    wait_for(lambda: md_replicas(pool, NS, MD) == 6, what="the booking now names this pool's Cluster")


def test_a_capacity_that_cannot_be_counted_holds_the_pool_and_says_why(
    emulator: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    """The Metal3MachineTemplate is missing (a typo in the MachineDeployment, or not created yet)."""
    emulator.create(machine_deployment(MD, NS, replicas=1, full=True))
    emulator.create(mirror("mirror", replicas=1, adopted_from=f"{NS}/{MD}"))
    emulator.create(baremetal_host("host-0", NS))
    emulator.create(baremetal_host("host-1", NS))
    emulator.create(capacity_config())
    scaling = scaling_factory(emulator)
    scale_mirror(emulator, SLIME_NAMESPACE, "mirror", 4)
    (event,) = wait_for(lambda: md_events(emulator, NS, MD, "CapacityLimited"), what="the CapacityLimited event")
    assert event["message"] == (
        f"mirror {SLIME_NAMESPACE}/mirror asks 4; MachineDeployment {NS}/{MD} is held at 1 because the hosts that "
        f"could take them cannot be counted: Metal3MachineTemplate {NS}/{MD} not found; the rest follows when hosts "
        "become available"
    )
    assert md_replicas(emulator, NS, MD) == 1
    assert scaling.metric("slime_scaling_capacity_shortfall_replicas") == 3
    emulator.create(metal3_machine_template(MD, NS))  # no hostSelector: every free host of the namespace
    # The Machine of replica 1 was never created here (no CAPI): it will take one of the two free hosts.
    wait_for(lambda: md_replicas(emulator, NS, MD) == 2, what="the 2 free hosts")


def test_a_mapping_that_did_not_opt_in_is_not_capped_and_watches_no_host(
    pool: Emulator, scaling_factory: Callable[..., Scaling]
) -> None:
    pool.create(capacity_config(capacity_aware=False))
    scaling = scaling_factory(pool)
    scale_mirror(pool, SLIME_NAMESPACE, "mirror", 5)
    wait_for(lambda: md_replicas(pool, NS, MD) == 5, what="5, uncapped")
    assert not scaling.calls(resource="baremetalhosts")
    assert not md_events(pool, NS, MD, "CapacityLimited")
