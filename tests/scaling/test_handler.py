"""The pure scaling decision: which requests are ours, what they ask, and the answers."""

from __future__ import annotations

from typing import Any

import pytest

from common.admission import encode_review
from scaling_webhook.handler import DryRun, Invalid, ScaleIntent, respond, scale_intent
from scaling_webhook.mappings import parse_mappings
from testbed.reviews import scale_request

TABLE = parse_mappings({"mappings": "- {mirror: slime/mirror-a, machineDeployment: metal3/md-a}"}, "slime")
MAPPING = TABLE.get("slime", "mirror-a")


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
        "create", "delete", "connect", "no-operation", "kind-deployment", "kind-not-a-map", "no-kind",
        "statefulsets", "core-group", "extensions-group", "resource-not-a-map", "status-subresource",
        "empty-subresource", "no-subresource", "other-namespace", "unmapped-name", "no-name", "namespace-not-str", "empty",
    ],
)
def test_not_ours(req: dict[str, Any]) -> None:
    assert scale_intent(req, TABLE) is None


def test_mapped_scale() -> None:
    assert scale_intent(request(), TABLE) == ScaleIntent(MAPPING, 3)


@pytest.mark.parametrize("replicas", [0, 1, 250])
def test_replicas_taken_from_the_scale(replicas: int) -> None:
    assert scale_intent(with_replicas(replicas), TABLE) == ScaleIntent(MAPPING, replicas)


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        (without_replicas(), "Scale object has no integer spec.replicas"),
        (with_replicas("3"), "Scale object has no integer spec.replicas"),
        (with_replicas(True), "Scale object has no integer spec.replicas"),
        (with_replicas(2.0), "Scale object has no integer spec.replicas"),
        (with_replicas(None), "Scale object has no integer spec.replicas"),
        (with_replicas(-1), "Scale object has a negative spec.replicas (-1)"),
        (request(object=None), "Scale object has no integer spec.replicas"),
        (request(object={"spec": "x"}), "Scale object has no integer spec.replicas"),
    ],
    ids=["missing", "string", "bool", "float", "null", "negative", "no-object", "spec-not-a-map"],
)
def test_malformed_scale_is_invalid(req: dict[str, Any], reason: str) -> None:
    assert scale_intent(req, TABLE) == Invalid(MAPPING, reason)


def test_dry_run() -> None:
    assert scale_intent(request(dryRun=True), TABLE) == DryRun(MAPPING, 3)
    assert scale_intent(request(dryRun="true"), TABLE) == ScaleIntent(MAPPING, 3)  # only the boolean true


def test_dry_run_with_bad_replicas_is_still_invalid() -> None:
    assert isinstance(scale_intent({**with_replicas(-2), "dryRun": True}, TABLE), Invalid)


def test_respond_scaled() -> None:
    response = respond(ScaleIntent(MAPPING, 3))
    assert response.allowed and response.patch is None
    assert response.message == "MachineDeployment metal3/md-a scaled to 3"


def test_respond_dry_run() -> None:
    response = respond(DryRun(MAPPING, 3))
    assert response.allowed and response.patch is None
    assert response.message == "dry run: MachineDeployment metal3/md-a would be scaled to 3 (not applied)"


def test_respond_invalid() -> None:
    response = respond(Invalid(MAPPING, "Scale object has no integer spec.replicas"))
    assert not response.allowed and response.code == 400 and response.reason == "BadRequest"
    assert response.message == (
        "cannot scale MachineDeployment metal3/md-a from mirror slime/mirror-a: Scale object has no integer spec.replicas"
    )


@pytest.mark.parametrize(("code", "reason"), [(503, "ServiceUnavailable"), (404, "NotFound"), (403, "Forbidden"), (400, "Forbidden")])
def test_respond_failure(code: int, reason: str) -> None:
    response = respond(ScaleIntent(MAPPING, 3), "MachineDeployment metal3/md-a not found", code)
    assert not response.allowed and response.code == code and response.reason == reason
    assert response.message == (
        "cannot scale MachineDeployment metal3/md-a to 3 replicas from mirror slime/mirror-a: "
        "MachineDeployment metal3/md-a not found; the mirror keeps its current replicas, retry later"
    )


@pytest.mark.parametrize(
    "decision",
    [ScaleIntent(MAPPING, 1), DryRun(MAPPING, 1), Invalid(MAPPING, "x")],
)
@pytest.mark.parametrize("error", [None, "boom"])
def test_never_a_patch_on_the_wire(decision: Any, error: str | None) -> None:
    body = encode_review("u1", respond(decision, error))
    assert b"patch" not in body
