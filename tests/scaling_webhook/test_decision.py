"""The pure scaling decision: which requests are ours, whether they agree with the cluster, and the answers.

The webhook never writes on admission (docs/scaling.md): a decision says whether the scale is one
kube-apiserver would send now and what the MachineDeployment will do once the mirror is stored.
"""

from __future__ import annotations

from typing import Any

import pytest

from common.admission import encode_review
from scaling_webhook.decision import (
    Accepted,
    DryRun,
    Invalid,
    Observed,
    Recheck,
    Refused,
    decide,
    pause_reason,
    respond,
    scale_target,
    target_replicas,
)
from scaling_webhook.mappings import Mapping, parse_mappings
from testbed.framework.objects import machine_deployment, mirror
from testbed.framework.reviews import scale_request

TABLE = parse_mappings(
    {
        "mappings": "- {mirror: slime/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 2147483647}\n"
        "- {mirror: slime/mirror-c, machineDeployment: metal3/md-c, maxReplicas: 4}\n"
    },
    "slime",
)
MAPPING = TABLE.get("slime", "mirror-a")
CAPPED = TABLE.get("slime", "mirror-c")
assert MAPPING is not None and CAPPED is not None
# As the caches see the cluster: the mirror stored at 1 (scale_request's oldObject), its MachineDeployment.
STORED = Observed(mirror("mirror-a", replicas=1), machine_deployment("md-a", "metal3"))


def request(**changes: Any) -> dict[str, Any]:
    base = scale_request("slime", "mirror-a", 3)
    base.update(changes)
    return base


def with_replicas(value: Any) -> dict[str, Any]:
    base = request()
    base["object"]["spec"]["replicas"] = value
    return base


def without_replicas() -> dict[str, Any]:
    base = request()
    del base["object"]["spec"]["replicas"]
    return base


@pytest.mark.parametrize(
    "req",
    [
        request(operation="CREATE"),
        request(operation="DELETE"),
        request(operation="CONNECT"),
        request(operation=None),
        request(kind={"group": "apps", "version": "v1", "kind": "Deployment"}),
        request(kind="Scale"),
        request(kind=None),
        request(resource={"group": "apps", "version": "v1", "resource": "statefulsets"}),
        request(resource={"group": "", "version": "v1", "resource": "deployments"}),
        request(resource={"group": "extensions", "version": "v1beta1", "resource": "deployments"}),
        request(resource="deployments"),
        request(subResource="status"),
        request(subResource=""),
        {k: v for k, v in request().items() if k != "subResource"},
        request(namespace="other"),
        request(name="mirror-b"),
        request(name=None),
        request(namespace=7),
        {},
    ],
    ids=[
        "create",
        "delete",
        "connect",
        "no-operation",
        "kind-deployment",
        "kind-not-a-map",
        "no-kind",
        "statefulsets",
        "core-group",
        "extensions-group",
        "resource-not-a-map",
        "status-subresource",
        "empty-subresource",
        "no-subresource",
        "other-namespace",
        "unmapped-name",
        "no-name",
        "namespace-not-str",
        "empty",
    ],
)
def test_not_ours(req: dict[str, Any]) -> None:
    assert scale_target(req, TABLE) is None


def test_mapped_scale_is_accepted_and_says_what_follows() -> None:
    assert scale_target(request(), TABLE) == MAPPING
    assert decide(request(), MAPPING, STORED) == Accepted(MAPPING, 3, 3)


@pytest.mark.parametrize("replicas", [0, 1, 250, 2**31 - 1])
def test_replicas_taken_from_the_scale(replicas: int) -> None:
    assert decide(with_replicas(replicas), MAPPING, STORED) == Accepted(MAPPING, replicas, replicas)


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        (with_replicas("3"), "Scale object has no integer spec.replicas"),
        (with_replicas(True), "Scale object has no integer spec.replicas"),
        (with_replicas(2.0), "Scale object has no integer spec.replicas"),
        (with_replicas(None), "Scale object has no integer spec.replicas"),
        (with_replicas(-1), "Scale object has a negative spec.replicas (-1)"),
        (
            with_replicas(2**31),
            "Scale object has spec.replicas 2147483648, more than a Kubernetes replica count may be (2147483647)",
        ),
        (
            with_replicas(2**63),
            "Scale object has spec.replicas 9223372036854775808, more than a Kubernetes replica count may be "
            "(2147483647)",
        ),
        (request(object=None), "Scale object has no integer spec.replicas"),
        (request(object={"spec": "x"}), "Scale object has no integer spec.replicas"),
    ],
    ids=["string", "bool", "float", "null", "negative", "2^31", "2^63", "no-object", "spec-not-a-map"],
)
def test_malformed_scale_is_invalid(req: dict[str, Any], reason: str) -> None:
    assert decide(req, MAPPING, STORED) == Invalid(MAPPING, reason)


def test_a_scale_to_or_from_zero_arrives_without_replicas_and_is_read_as_zero() -> None:
    # autoscaling/v1 ScaleSpec.Replicas is an int32 with omitempty: kube-apiserver sends a Scale to 0, and the
    # stored Scale of a mirror at 0, as "spec": {} (seen on v1.36.4; before this, every scale from or to 0 was refused).
    assert without_replicas()["object"]["spec"] == {}
    assert decide(without_replicas(), MAPPING, STORED) == Accepted(MAPPING, 0, 0)
    from_zero = scale_request("slime", "mirror-a", 2, old_replicas=0)
    assert from_zero["oldObject"]["spec"] == {}
    at_zero = Observed(mirror("mirror-a", replicas=0), machine_deployment("md-a", "metal3"))
    assert decide(from_zero, MAPPING, at_zero) == Accepted(MAPPING, 2, 2)
    fresh = Observed(at_zero.mirror, at_zero.machine_deployment, fresh=True)
    assert isinstance(
        decide(scale_request("slime", "mirror-a", 2, old_replicas=1), MAPPING, fresh), Refused
    )  # still checked


def test_dry_run() -> None:
    assert decide(request(dryRun=True), MAPPING, STORED) == DryRun(MAPPING, 3)
    assert decide(request(dryRun="true"), MAPPING, STORED) == Accepted(MAPPING, 3, 3)  # only the boolean true


def test_dry_run_with_bad_replicas_is_still_invalid() -> None:
    assert isinstance(decide({**with_replicas(-2), "dryRun": True}, MAPPING, STORED), Invalid)


def test_caches_not_listed_yet_is_a_retry() -> None:
    assert decide(request(), MAPPING, None) == Refused(
        MAPPING, 3, "the webhook has not listed the mirror and MachineDeployment yet", 503
    )


def test_an_old_object_that_is_not_the_stored_mirror_is_checked_again_then_refused() -> None:
    forged = request(oldObject={"spec": {"replicas": 7}})
    assert decide(forged, MAPPING, STORED) == Recheck(MAPPING)
    fresh = Observed(STORED.mirror, STORED.machine_deployment, fresh=True)
    assert decide(forged, MAPPING, fresh) == Refused(
        MAPPING,
        3,
        "the review's oldObject.spec.replicas (7) is not the stored mirror's (1); "
        "kube-apiserver sends the stored object, so this review is stale or forged",
        409,
    )


def test_a_mirror_that_does_not_exist_is_refused() -> None:
    assert decide(request(), MAPPING, Observed(None, STORED.machine_deployment)) == Recheck(MAPPING)
    assert decide(request(), MAPPING, Observed(None, STORED.machine_deployment, fresh=True)) == Refused(
        MAPPING, 3, "mirror Deployment slime/mirror-a does not exist", 404
    )


def test_a_missing_machine_deployment_is_refused() -> None:
    assert decide(request(), MAPPING, Observed(STORED.mirror, None)) == Refused(
        MAPPING, 3, "MachineDeployment metal3/md-a not found", 404
    )


def test_a_cluster_autoscaler_node_group_is_refused() -> None:
    md = machine_deployment("md-a", "metal3")
    md["metadata"]["annotations"] = {"cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "10"}
    decision = decide(request(), MAPPING, Observed(STORED.mirror, md))
    assert isinstance(decision, Refused) and decision.code == 409
    assert (
        "is a cluster-autoscaler node group (cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size)"
        in decision.reason
    )


def test_above_max_replicas_is_accepted_and_capped() -> None:
    observed = Observed(mirror("mirror-c", replicas=1), machine_deployment("md-c", "metal3"))
    decision = decide(scale_request("slime", "mirror-c", 9), CAPPED, observed)
    assert decision == Accepted(CAPPED, 9, 4) and decision.capped
    response = respond(decision)
    assert response.allowed and response.message == (
        "MachineDeployment metal3/md-c follows the stored mirror to 4, capped at maxReplicas 4 (the mirror asks 9)"
    )
    assert response.warnings == ("MachineDeployment metal3/md-c is capped at maxReplicas 4 (the mirror asks 9)",)
    assert target_replicas(CAPPED, 3) == 3 and target_replicas(MAPPING, 9) == 9


@pytest.mark.parametrize(
    ("md_changes", "cluster", "reason"),
    [
        ({"spec": {"paused": True}}, None, "MachineDeployment metal3/md-a has spec.paused"),
        (
            {"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}},
            None,
            "MachineDeployment metal3/md-a has the cluster.x-k8s.io/paused annotation",
        ),
        ({}, {"metadata": {"name": "c1"}, "spec": {"paused": True}}, "Cluster metal3/c1 has spec.paused"),
        (
            {},
            {"metadata": {"name": "c1", "annotations": {"cluster.x-k8s.io/paused": "true"}}, "spec": {}},
            "Cluster metal3/c1 has the cluster.x-k8s.io/paused annotation",
        ),
        ({}, {"metadata": {"name": "c1"}, "spec": {"paused": False}}, ""),
    ],
)
def test_pauses_are_read_from_the_machine_deployment_and_its_cluster(
    md_changes: dict[str, Any], cluster: dict[str, Any] | None, reason: str
) -> None:
    md = machine_deployment("md-a", "metal3")
    for key, value in md_changes.items():
        md[key] = {**md[key], **value}
    assert pause_reason(MAPPING, md, cluster) == reason
    decision = decide(request(), MAPPING, Observed(STORED.mirror, md, cluster))
    assert decision == Accepted(MAPPING, 3, 3, reason)
    if reason:
        assert respond(decision).message.endswith(f"; it waits: {reason}")


def test_respond_accepted() -> None:
    response = respond(Accepted(MAPPING, 3, 3))
    assert response.allowed and response.patch is None and response.warnings == ()
    assert response.message == "MachineDeployment metal3/md-a follows the stored mirror to 3"


def test_respond_dry_run() -> None:
    response = respond(DryRun(MAPPING, 3))
    assert response.allowed and response.patch is None
    assert response.message == "dry run: MachineDeployment metal3/md-a would follow the mirror to 3 (not applied)"
    assert response.warnings == (
        "SliMe: dry run: MachineDeployment metal3/md-a would follow the mirror to 3 (not applied)",
    )


def test_respond_invalid() -> None:
    response = respond(Invalid(MAPPING, "Scale object has no integer spec.replicas"))
    assert not response.allowed and response.code == 400 and response.reason == "BadRequest"
    assert response.message == (
        "cannot scale MachineDeployment metal3/md-a from mirror slime/mirror-a: Scale object has no integer "
        "spec.replicas"
    )


@pytest.mark.parametrize(
    ("code", "reason"), [(503, "ServiceUnavailable"), (404, "NotFound"), (409, "Conflict"), (400, "BadRequest")]
)
def test_respond_refused(code: int, reason: str) -> None:
    response = respond(Refused(MAPPING, 3, "MachineDeployment metal3/md-a not found", code))
    assert not response.allowed and response.code == code and response.reason == reason
    assert response.message == (
        "cannot scale MachineDeployment metal3/md-a to 3 replicas from mirror slime/mirror-a: "
        "MachineDeployment metal3/md-a not found; the mirror keeps its current replicas"
    )


def test_a_recheck_is_never_answered() -> None:
    with pytest.raises(ValueError):
        respond(Recheck(MAPPING))


@pytest.mark.parametrize(
    "decision",
    [
        Accepted(MAPPING, 1, 1),
        Accepted(CAPPED, 9, 4, "paused"),
        DryRun(MAPPING, 1),
        Invalid(MAPPING, "x"),
        Refused(MAPPING, 1, "x", 409),
    ],
)
def test_never_a_patch_on_the_wire(decision: Any) -> None:
    body = encode_review("u1", respond(decision))
    assert b"patch" not in body


def test_mapping_type() -> None:
    assert isinstance(MAPPING, Mapping)
