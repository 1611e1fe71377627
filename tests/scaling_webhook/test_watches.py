"""MappedObjects against kubemu: the watches a mapping table opens and closes, what they hold, capacity errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from common.kube import local_client
from common.names import DEPLOYMENT_NAME_LABEL
from kubemu import Emulator
from scaling_webhook.capacity import CapacityUnknown
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import MappingTable, parse_mappings
from scaling_webhook.watches import MappedObjects
from testbed.framework.objects import CAPI, machine_deployment, mirror
from testbed.framework.wait import wait_for

MakeObjects = Callable[[Emulator], MappedObjects]
CLUSTER = {"apiVersion": f"{CAPI}/v1beta1", "kind": "Cluster", "metadata": {"name": "c1", "namespace": "metal3"}}


def table(extra: str = "") -> MappingTable:
    return parse_mappings(
        {"mappings": f"- {{mirror: slime-system/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 100{extra}}}"},
        "slime-system",
    )


@pytest.fixture
def changes() -> list[None]:
    return []


@pytest.fixture
def make_objects(tmp_path: Path, changes: list[None]) -> Iterator[MakeObjects]:
    made: list[MappedObjects] = []

    def make(emulator: Emulator) -> MappedObjects:
        client = local_client(emulator.write_kubeconfig(tmp_path / f"kubeconfig-{len(made)}"))
        objects = MappedObjects(client, MachineDeploymentScaler(client, timeout=2.0), lambda: changes.append(None))
        made.append(objects)
        return objects

    yield make
    for objects in made:
        objects.stop()
        objects.client.close()


@pytest.fixture
def seeded(emulator: Emulator) -> Emulator:
    emulator.create(mirror("mirror-a", replicas=2))
    emulator.create(machine_deployment("md-a", "metal3", replicas=2, cluster="c1", full=True))
    emulator.create(CLUSTER)
    return emulator


def test_follow_watches_the_mirror_the_machine_deployment_and_its_cluster_by_name(
    seeded: Emulator, make_objects: MakeObjects
) -> None:
    objects = make_objects(seeded)
    mappings = table()
    (mapping,) = mappings
    seeded.clear_requests()
    objects.follow(mappings, timeout=5.0)
    assert objects.synced(mapping)
    assert objects.mirror(mapping)["spec"]["replicas"] == 2  # type: ignore[index]
    assert objects.machine_deployment(mapping)["metadata"]["name"] == "md-a"  # type: ignore[index]
    assert objects.cluster_ref(mapping) == ("metal3", "c1")
    assert objects.cluster(mapping)["metadata"]["name"] == "c1"  # type: ignore[index]
    lists = sorted((r.resource, r.query) for r in seeded.requests if r.verb == "list")
    assert [resource for resource, _ in lists] == ["clusters", "deployments", "machinedeployments"]
    assert all("fieldSelector=metadata.name" in query for _, query in lists), lists
    assert not [r for r in seeded.requests if r.resource == "machines"], "no Machines without safeScaleIn/capacity"


def test_a_change_wakes_the_listener_and_wait_changed_sees_it(
    seeded: Emulator, make_objects: MakeObjects, changes: list[None]
) -> None:
    objects = make_objects(seeded)
    (mapping,) = mappings = table()
    objects.follow(mappings, timeout=5.0)
    before = objects.machine_deployment(mapping)["metadata"]["resourceVersion"]  # type: ignore[index]
    heard = len(changes)
    seeded.patch(f"{CAPI}/v1beta1", "MachineDeployment", "metal3", "md-a", {"spec": {"replicas": 5}})
    objects.wait_changed("machinedeployment", mapping.machine_deployment, before, timeout=5.0)
    assert objects.machine_deployment(mapping)["spec"]["replicas"] == 5  # type: ignore[index]
    wait_for(lambda: len(changes) > heard, what="on_change")


def test_a_mapping_no_longer_in_the_table_is_no_longer_watched(seeded: Emulator, make_objects: MakeObjects) -> None:
    objects = make_objects(seeded)
    (mapping,) = mappings = table()
    objects.follow(mappings, timeout=5.0)
    objects.follow(MappingTable(), timeout=5.0)
    assert (objects.mirror(mapping), objects.machine_deployment(mapping), objects.synced(mapping)) == (
        None,
        None,
        False,
    )


def test_a_safe_scale_in_mapping_also_watches_its_machines(seeded: Emulator, make_objects: MakeObjects) -> None:
    objects = make_objects(seeded)
    seeded.clear_requests()
    objects.follow(table(", safeScaleIn: {slurmrestd: 'http://127.0.0.1:1', jwtSecret: slurm/jwt}"), timeout=5.0)
    (machines,) = [r for r in seeded.requests if r.resource == "machines" and r.verb == "list"]
    assert parse_qs(machines.query)["labelSelector"] == [f"{DEPLOYMENT_NAME_LABEL}=md-a"]


def test_without_capi_the_mirror_is_still_watched_and_the_error_kept(
    emulator_factory: Callable[..., Emulator], make_objects: MakeObjects
) -> None:
    emulator = emulator_factory(served={CAPI: ["v1alpha4"]})  # no version kubemu knows: CAPI not served
    emulator.create(mirror("mirror-a", replicas=2))
    objects = make_objects(emulator)
    (mapping,) = mappings = table()
    objects.follow(mappings, timeout=5.0)
    assert objects.mirror(mapping) is not None
    assert not objects.synced(mapping)
    assert "serves no supported version of machinedeployments.cluster.x-k8s.io" in objects.last_error


def test_capacity_names_what_it_lacks(seeded: Emulator, make_objects: MakeObjects) -> None:
    objects = make_objects(seeded)
    (mapping,) = mappings = table(", capacityAware: true")
    objects.follow(mappings, timeout=5.0)
    with pytest.raises(CapacityUnknown, match="^Metal3MachineTemplate metal3/md-a not found$"):
        objects.capacity(mapping)
    seeded.delete(f"{CAPI}/v1beta1", "MachineDeployment", "metal3", "md-a")
    wait_for(lambda: objects.machine_deployment(mapping) is None, what="the deletion in the cache")
    with pytest.raises(CapacityUnknown, match="^MachineDeployment metal3/md-a not found$"):
        objects.capacity(mapping)
