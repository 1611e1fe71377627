"""Evaluate the rendered matchConditions with CEL on sample AdmissionReview requests."""

from __future__ import annotations

import copy

import pytest

from demo.cel import MatchConditionError, evaluate_match_conditions
from testbed.framework.chart import NAMESPACE, one


def _secret_request(owner_refs=None, data=None, operation="CREATE"):
    obj = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "infrastructure.cluster.x-k8s.io/secret",
        "metadata": {"name": "m3m-0-metadata", "namespace": "metal3"},
    }
    if owner_refs is not None:
        obj["metadata"]["ownerReferences"] = owner_refs
    if data is not None:
        obj["data"] = data
    return {
        "uid": "u1",
        "kind": {"group": "", "version": "v1", "kind": "Secret"},
        "resource": {"group": "", "version": "v1", "resource": "secrets"},
        "operation": operation,
        "namespace": "metal3",
        "name": "m3m-0-metadata",
        "object": obj,
        "oldObject": copy.deepcopy(obj) if operation == "UPDATE" else None,
    }


def _owner(kind="Metal3Data", api_version="infrastructure.cluster.x-k8s.io/v1beta1"):
    return {"apiVersion": api_version, "kind": kind, "name": "tpl-0", "uid": "abc", "controller": True}


META = {"metaData": "cHJvdmlkZXJpZDogbWV0YWwzL2JtaC9tM20K"}


@pytest.fixture(scope="module")
def mutating(render):
    return one(render(), "MutatingWebhookConfiguration")["webhooks"][0]["matchConditions"]


@pytest.mark.parametrize(
    "request_",
    [
        _secret_request([_owner()], META),
        _secret_request([_owner(api_version="infrastructure.cluster.x-k8s.io/v1beta2")], META),
        _secret_request([_owner("Metal3DataClaim"), _owner()], {**META, "other": "eA=="}),
        _secret_request([_owner()], META, operation="UPDATE"),
    ],
    ids=["v1beta1", "v1beta2", "second-owner", "update"],
)
def test_metal3_metadata_secret_matches(mutating, request_):
    assert evaluate_match_conditions(mutating, request_) is True


@pytest.mark.parametrize(
    "request_",
    [
        _secret_request(None, META),
        _secret_request([], META),
        _secret_request([_owner("Metal3Machine")], META),
        _secret_request([_owner("Deployment", "apps/v1")], META),
        _secret_request([_owner(api_version="example.com/v1")], META),
        _secret_request([_owner(api_version="infrastructure.cluster.x-k8s.io.evil.com/v1")], META),
        _secret_request([_owner()], None),
        _secret_request([_owner()], {"value": "eA=="}),
    ],
    ids=[
        "no-owners",
        "empty-owners",
        "other-kind",
        "deployment-owner",
        "other-group",
        "lookalike-group",
        "no-data",
        "no-metaData-key",
    ],
)
def test_other_secrets_do_not_match(mutating, request_):
    assert evaluate_match_conditions(mutating, request_) is False


def _scale_request():
    return {
        "uid": "u2",
        "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "subResource": "scale",
        "operation": "UPDATE",
        "namespace": NAMESPACE,
        "name": "mirror-a",
        "object": {"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 3}},
    }


# The scaling webhook's match (rules, namespaceSelector and its condition together): test_scaling_match.py.


def test_evaluation_error_raises_unless_another_condition_is_false():
    conds = [
        {"name": "boom", "expression": "request.nosuch == 1"},
        {"name": "scale", "expression": "request.kind.kind == 'Scale'"},
    ]
    with pytest.raises(MatchConditionError, match="boom"):
        evaluate_match_conditions(conds, _scale_request())
    req = _scale_request()
    req["kind"]["kind"] = "Deployment"
    assert evaluate_match_conditions(conds, req) is False  # a false condition wins over an error
    with pytest.raises(MatchConditionError, match="not bool"):
        evaluate_match_conditions([{"name": "int", "expression": "1"}], req)
