"""InjectionResolver against kubemu: owner verification from the cache, the memo, the chain's Unresolved reasons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.kube import local_client
from common.names import CLUSTER_OVERRIDE_LABEL, OPT_IN_LABEL
from injection_webhook.decision import JoinInfo, MetaDataSecret, NotOptedIn, Unresolved
from injection_webhook.resolver import InjectionResolver, NeedsWait
from injection_webhook.settings import DEFAULT_CONTROLLER_SELECTOR
from kubemu import Emulator, Fault
from testbed.framework.objects import b64, kubeconfig_secret
from testbed.framework.wait import wait_for
from testbed.framework.world import SlurmCluster, seed_metal3, seed_slinky

from .conftest import MakeResolver

M3 = "infrastructure.cluster.x-k8s.io/v1beta1"


def review_of(data: dict[str, Any], uid: str | None = None) -> MetaDataSecret:
    meta = data["metadata"]
    return MetaDataSecret(meta["namespace"], "m3m-0-metadata", meta["name"], "", meta["uid"] if uid is None else uid)


def resolve(resolver: InjectionResolver, data: dict[str, Any]) -> Any:
    """What a verified review of ``data`` resolves to (waiting for caches, as the app's worker does)."""
    assert resolver.wait_for_metal3_caches() is None
    review = review_of(data)
    check = wait_for(lambda: resolver.check_owner(review).verified, what="the Metal3Data in the cache")

    def template_cached() -> Any:  # the templates' cache may list the just-created template a moment later
        resolution = resolver.resolve(review, check, wait=True)
        missing = isinstance(resolution, Unresolved) and "(template of Metal3Data " in resolution.reason
        return None if missing and resolution.reason.endswith("does not exist") else resolution

    return wait_for(template_cached, what="the Metal3DataTemplate in the cache")


def opted_in(emulator: Emulator, **options: Any) -> tuple[dict[str, Any], SlurmCluster]:
    labels = {OPT_IN_LABEL: "slurm", **options.pop("template_labels", {})}
    _, data = seed_metal3(emulator, template_labels=labels, **options)
    return data, seed_slinky(emulator)


# --- owner verification -----------------------------------------------------------------------------


def test_a_cold_cache_asks_to_wait(emulator: Emulator, tmp_path: Path) -> None:
    resolver = InjectionResolver(local_client(emulator.write_kubeconfig(tmp_path / "kc")), DEFAULT_CONTROLLER_SELECTOR)
    try:
        with pytest.raises(NeedsWait):
            resolver.check_owner(MetaDataSecret("metal3", "s", "d", "", "uid"))
        assert resolver.not_ready_reason() == "Metal3 API discovery pending"
    finally:
        resolver.stop()


def test_waiting_for_the_caches_covers_the_start_up_discovery(emulator: Emulator, tmp_path: Path) -> None:
    emulator.add_fault(Fault(method="GET", path_regex=r"^/apis/infrastructure\.cluster\.x-k8s\.io$", delay_seconds=0.5))
    resolver = InjectionResolver(
        local_client(emulator.write_kubeconfig(tmp_path / "kc")), DEFAULT_CONTROLLER_SELECTOR, sync_timeout=3.0
    )
    resolver.start()
    try:
        assert resolver.wait_for_metal3_caches() is None  # the Metal3 API is served: answered within 3 s
    finally:
        resolver.stop()


def test_the_owner_is_verified_by_name_and_uid(resolver: InjectionResolver, emulator: Emulator) -> None:
    _, data = seed_metal3(emulator)
    assert resolver.wait_for_metal3_caches() is None
    # The templates' cache syncs on its own thread: readiness waits for both.
    wait_for(lambda: resolver.not_ready_reason() is None, what="both Metal3 caches synced")
    assert resolver.metal3_version == "v1beta2"
    record = wait_for(lambda: resolver.check_owner(review_of(data)).verified, what="the Metal3Data in the cache")
    assert record == {"template": "workers-template", "cluster": "bm-cluster", "uid": data["metadata"]["uid"]}
    forged = resolver.check_owner(review_of(data, uid="not-its-uid"))
    assert (forged.verified, forged.absent) == (None, False)
    no_uid = resolver.check_owner(review_of(data, uid=""))
    assert (no_uid.verified, no_uid.absent) == (None, False)


def test_an_unknown_owner_is_absent_until_remembered_and_found_when_it_arrives(
    resolver: InjectionResolver, emulator: Emulator
) -> None:
    assert resolver.wait_for_metal3_caches() is None
    review = MetaDataSecret("metal3", "m3m-0-metadata", "workers-template-0", "", "some-uid")
    assert resolver.check_owner(review).absent
    resolver.remember_absent(review)
    remembered = resolver.check_owner(review)
    assert (remembered.verified, remembered.absent) == (None, False)  # no second wait for the same name
    _, data = seed_metal3(emulator)  # the cache is read first every time: a late arrival is found
    later = review_of(data)
    wait_for(lambda: resolver.check_owner(later).verified, what="the late Metal3Data")


# --- resolution ---------------------------------------------------------------------------------------


def test_an_opted_in_template_resolves_to_the_controller_and_its_key(
    resolver: InjectionResolver, emulator: Emulator
) -> None:
    data, slurm = opted_in(emulator)
    info = resolve(resolver, data)
    assert isinstance(info, JoinInfo)
    assert (info.host, info.port, info.source) == ("192.0.2.10", 6817, "Controller slurm/slurm in cluster local")
    assert info.key_base64 == b64(slurm.key)
    assert info.jwt_key_base64 == ""  # only when the template asks for it


def test_a_warm_resolution_is_memoised_until_a_cache_changes(resolver: InjectionResolver, emulator: Emulator) -> None:
    data, _ = opted_in(emulator)
    resolve(resolver, data)
    review = review_of(data)
    record = resolver.check_owner(review).verified
    assert record is not None
    first = resolver.resolve(review, record)
    assert isinstance(first, JoinInfo)
    assert resolver.resolve(review, record) is first  # the memo, not a second walk
    emulator.patch("v1", "Pod", "slurm", "slurm-controller-0", {"status": {"hostIP": "192.0.2.99"}})
    moved = wait_for(
        lambda: (
            (r := resolver.resolve(review, record)) is not first and isinstance(r, JoinInfo) and r.host == "192.0.2.99"
        ),
        what="the new hostIP after the pod moved",
    )
    assert moved


def test_a_template_without_the_opt_in_label_is_not_opted_in(resolver: InjectionResolver, emulator: Emulator) -> None:
    _, data = seed_metal3(emulator)
    assert isinstance(resolve(resolver, data), NotOptedIn)


def test_a_metal3data_without_a_template_is_named(resolver: InjectionResolver, emulator: Emulator) -> None:
    _, data = seed_metal3(emulator, template_owner=False)
    emulator.patch(M3, "Metal3Data", "metal3", data["metadata"]["name"], {"spec": {"template": None}})
    expected = Unresolved(
        "Metal3Data metal3/workers-template-0 names no Metal3DataTemplate (no owner reference, no spec.template.name)"
    )
    # The cache may still hold the Metal3Data as created (with its template) when the first resolve runs.
    assert wait_for(lambda: resolve(resolver, data) == expected, what="the patched Metal3Data in the cache")


def test_a_pod_outside_a_controllers_statefulset_is_named(resolver: InjectionResolver, emulator: Emulator) -> None:
    data, _ = opted_in(emulator)
    emulator.patch("v1", "Pod", "slurm", "slurm-controller-0", {"metadata": {"ownerReferences": None}})
    result = resolve(resolver, data)
    assert result == Unresolved(
        "pod slurm/slurm-controller-0 is not owned by a StatefulSet of a Slinky Controller "
        "(namespace slurm of cluster local)"
    )


def test_a_key_secret_without_the_key_names_the_key_not_the_value(
    resolver: InjectionResolver, emulator: Emulator
) -> None:
    data, slurm = opted_in(emulator)
    emulator.patch("v1", "Secret", "slurm", "slurm-auth-slurm", {"data": {"slurm.key": None, "other": b64(slurm.key)}})
    result = resolve(resolver, data)
    assert result == Unresolved(
        "Secret slurm/slurm-auth-slurm has no data key 'slurm.key' (slurm key of Controller slurm/slurm; cluster local)"
    )


def test_the_workload_cluster_needs_its_kubeconfig_secret(make_resolver: MakeResolver, emulator: Emulator) -> None:
    data, _ = opted_in(emulator, template_labels={CLUSTER_OVERRIDE_LABEL: "workload"})
    resolver = make_resolver("metal3=workload:slurm")
    assert resolve(resolver, data) == Unresolved(
        "Secret metal3/bm-cluster-kubeconfig (the kubeconfig of Cluster metal3/bm-cluster) does not exist"
    )


def test_without_the_cluster_label_the_management_cluster_runs_slurm(
    resolver: InjectionResolver, emulator: Emulator
) -> None:
    data, _ = opted_in(emulator)  # labelled cluster bm-cluster; its kubeconfig Secret does not decide anything
    emulator.create(kubeconfig_secret("apiVersion: v1\nkind: Config\n"))
    info = resolve(resolver, data)
    assert isinstance(info, JoinInfo) and info.source.endswith("in cluster local")


NOT_CAPI_KUBECONFIG = (
    "Secret metal3/bm-cluster-kubeconfig is not the kubeconfig Cluster API writes for Cluster metal3/bm-cluster "
    "(it needs type cluster.x-k8s.io/secret and label cluster.x-k8s.io/cluster-name=bm-cluster)"
)


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        (
            kubeconfig_secret("x", secret_type="Opaque"),
            NOT_CAPI_KUBECONFIG,
        ),
        (
            kubeconfig_secret("x", cluster_label="other"),
            NOT_CAPI_KUBECONFIG,
        ),
        (
            {**kubeconfig_secret("x"), "data": {"value": "not*base64"}},
            "Secret metal3/bm-cluster-kubeconfig has no valid base64 key 'value'",
        ),
        (
            kubeconfig_secret("- not a map"),
            "kubeconfig for cluster metal3/bm-cluster refused: it is not a kubeconfig document (a YAML map) (only "
            "server, certificate-authority-data and inline credentials are accepted: token, client-certificate-data, "
            "client-key-data) (from Secret metal3/bm-cluster-kubeconfig)",
        ),
    ],
    ids=["not-capi-type", "other-cluster-label", "not-base64", "not-a-map"],
)
def test_an_unusable_workload_kubeconfig_is_named(
    make_resolver: MakeResolver, emulator: Emulator, secret: dict[str, Any], reason: str
) -> None:
    data, _ = opted_in(emulator, template_labels={CLUSTER_OVERRIDE_LABEL: "workload"})
    emulator.create(secret)
    assert resolve(make_resolver("metal3=workload:slurm"), data) == Unresolved(reason)
