"""MachineDeploymentScaler against kubemu: version choice, its reads and writes, and the ScaleError of each failure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.kube import local_client
from kubemu import Emulator, Fault
from scaling_webhook.errors import ScaleError
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from testbed.framework.objects import CAPI, SLIME_NAMESPACE, machine_deployment, mirror
from testbed.framework.world import md_replicas

MakeScaler = Callable[[Emulator], MachineDeploymentScaler]


@pytest.fixture
def make_scaler(tmp_path: Path) -> Iterator[MakeScaler]:
    made: list[MachineDeploymentScaler] = []

    def make(emulator: Emulator) -> MachineDeploymentScaler:
        kubeconfig = emulator.write_kubeconfig(tmp_path / f"kubeconfig-{len(made)}")
        scaler = MachineDeploymentScaler(local_client(kubeconfig), timeout=2.0)
        made.append(scaler)
        return scaler

    yield make
    for scaler in made:
        scaler.client.close()


@pytest.fixture
def scaler(emulator: Emulator, make_scaler: MakeScaler) -> MachineDeploymentScaler:
    emulator.create(machine_deployment("md", "metal3", replicas=2))
    emulator.create(mirror("mirror-a", replicas=2))
    return make_scaler(emulator)


def md_patches(emulator: Emulator) -> list[str]:
    return [c.path for c in emulator.requests if c.method == "PATCH" and c.resource == "machinedeployments"]


# --- versions --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("served", "chosen"), [(["v1beta1", "v1beta2"], "v1beta2"), (["v1beta1"], "v1beta1")])
def test_the_newest_supported_version_is_chosen_once(
    emulator_factory: Callable[..., Emulator], make_scaler: MakeScaler, served: list[str], chosen: str
) -> None:
    emulator = emulator_factory(served={CAPI: served})
    scaler = make_scaler(emulator)
    assert scaler.api_version == ""  # nothing discovered before the first call
    assert scaler.resource_path().version == chosen
    assert scaler.api_version == f"{CAPI}/{chosen}"
    discoveries = emulator.count_requests(path=f"/apis/{CAPI}")
    scaler.resource_path()
    assert emulator.count_requests(path=f"/apis/{CAPI}") == discoveries == 1


def test_a_cluster_without_a_supported_capi_version_is_named(
    emulator_factory: Callable[..., Emulator], make_scaler: MakeScaler
) -> None:
    emulator = emulator_factory(served={CAPI: ["v1alpha4"]})  # not a version kubemu knows: none served
    with pytest.raises(ScaleError) as error:
        make_scaler(emulator).set_replicas("metal3", "md", 3)
    assert error.value.code == 404
    assert "serves no supported version of machinedeployments.cluster.x-k8s.io" in error.value.cause
    assert "supported: v1beta2, v1beta1" in error.value.cause


# --- calls -------------------------------------------------------------------------------------------


def test_set_replicas_is_one_merge_patch_on_scale(scaler: MachineDeploymentScaler, emulator: Emulator) -> None:
    scaler.resource_path()
    emulator.clear_requests()
    scaler.set_replicas("metal3", "md", 5)
    (call,) = emulator.requests
    assert (call.method, call.path) == ("PATCH", f"/apis/{CAPI}/v1beta2/namespaces/metal3/machinedeployments/md/scale")
    stored = emulator.get(f"{CAPI}/v1beta2", "MachineDeployment", "metal3", "md")
    assert stored is not None and stored["spec"]["replicas"] == 5


def test_set_replicas_at_a_resource_version_is_refused_once_the_object_moved_on(
    scaler: MachineDeploymentScaler, emulator: Emulator
) -> None:
    def version() -> str:
        stored = emulator.get(f"{CAPI}/v1beta2", "MachineDeployment", "metal3", "md")
        assert stored is not None
        return str(stored["metadata"]["resourceVersion"])

    seen = version()
    emulator.patch(f"{CAPI}/v1beta2", "MachineDeployment", "metal3", "md", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ScaleError) as error:
        scaler.set_replicas("metal3", "md", 5, resource_version=seen)
    assert error.value.code == 409
    assert md_replicas(emulator, "metal3", "md") == 2
    scaler.set_replicas("metal3", "md", 5, resource_version=version())
    assert md_replicas(emulator, "metal3", "md") == 5


def test_a_missing_machine_deployment_is_named_and_not_retried(
    scaler: MachineDeploymentScaler, emulator: Emulator
) -> None:
    scaler.resource_path()
    emulator.clear_requests()
    with pytest.raises(ScaleError) as error:
        scaler.set_replicas("metal3", "gone", 1)
    assert (error.value.code, error.value.cause) == (404, "MachineDeployment metal3/gone not found")
    assert len(md_patches(emulator)) == 1, "an object that does not exist is no reason to rediscover the version"
    assert emulator.count_requests(path=f"/apis/{CAPI}") == 0


@pytest.mark.parametrize(("spec", "expected"), [({"replicas": 4}, 4), ({"replicas": True}, None)])
def test_get_replicas(
    emulator: Emulator, make_scaler: MakeScaler, spec: dict[str, object], expected: int | None
) -> None:
    emulator.create(
        {"apiVersion": f"{CAPI}/v1beta2", "kind": "MachineDeployment", "metadata": {"name": "md", "namespace": "m"}}
        | {"spec": spec}
    )
    assert make_scaler(emulator).get_replicas("m", "md") == expected


def test_get_replicas_of_a_missing_machine_deployment(scaler: MachineDeploymentScaler) -> None:
    with pytest.raises(ScaleError) as error:
        scaler.get_replicas("metal3", "nope")
    assert (error.value.code, error.value.cause) == (404, "MachineDeployment metal3/nope not found")


def test_read_mirror(scaler: MachineDeploymentScaler) -> None:
    found = scaler.read_mirror(SLIME_NAMESPACE, "mirror-a")
    assert found is not None and found["spec"]["replicas"] == 2
    assert scaler.read_mirror(SLIME_NAMESPACE, "nope") is None


def test_adopt_sets_replicas_and_the_mark_at_once_and_unmark_removes_the_mark(
    scaler: MachineDeploymentScaler, emulator: Emulator
) -> None:
    emulator.clear_requests()
    scaler.adopt((SLIME_NAMESPACE, "mirror-a"), 7, "example.org/adopted", "metal3/md")
    stored = emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-a")
    assert stored is not None and stored["spec"]["replicas"] == 7
    assert stored["metadata"]["annotations"] == {"example.org/adopted": "metal3/md"}
    assert [c.method for c in emulator.requests] == ["PATCH"]
    scaler.unmark((SLIME_NAMESPACE, "mirror-a"), "example.org/adopted")
    stored = emulator.get("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-a")
    assert stored is not None and not (stored["metadata"].get("annotations") or {})
    assert stored["spec"]["replicas"] == 7
    scaler.unmark((SLIME_NAMESPACE, "gone"), "example.org/adopted")  # a mirror that is gone: nothing to do


def test_adopting_a_missing_mirror_names_the_deployment(scaler: MachineDeploymentScaler) -> None:
    with pytest.raises(ScaleError) as error:
        scaler.adopt((SLIME_NAMESPACE, "gone"), 1, "example.org/adopted", "metal3/md")
    assert (error.value.code, error.value.cause) == (404, f"Deployment {SLIME_NAMESPACE}/gone not found")


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "begins"),
    [
        (403, 403, "forbidden: "),
        (409, 409, "the API server answered 409 "),
        (500, 503, "the API server answered 500 "),  # a server error may pass: the scaler retries
    ],
)
def test_an_api_error_becomes_a_scale_error_with_its_code(
    scaler: MachineDeploymentScaler, emulator: Emulator, status: int, code: int, begins: str
) -> None:
    scaler.resource_path()
    emulator.add_fault(Fault(method="PATCH", path_regex=r"/scale$", status=status, message="injected"))
    with pytest.raises(ScaleError) as error:
        scaler.set_replicas("metal3", "md", 3)
    assert error.value.code == code
    assert error.value.cause.startswith(begins) and "injected" in error.value.cause


def test_a_dropped_connection_is_a_503(scaler: MachineDeploymentScaler, emulator: Emulator) -> None:
    scaler.resource_path()
    emulator.add_fault(Fault(method="PATCH", path_regex=r"/scale$", close_connection=True))
    with pytest.raises(ScaleError) as error:
        scaler.set_replicas("metal3", "md", 3)
    assert error.value.code == 503
    assert "cannot reach the API server of cluster local" in error.value.cause
