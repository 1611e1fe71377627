"""Object metadata checks, pure: DNS-1123 names, label selector syntax, API groups and owner references."""

from __future__ import annotations

from typing import Any

import pytest

from common.meta import (
    api_group,
    is_dns1123_label,
    is_dns1123_subdomain,
    label_selector_problem,
    owner_name,
    owner_reference,
)


@pytest.mark.parametrize(
    ("value", "label", "subdomain"),
    [
        ("metal3", True, True),
        ("a-1", True, True),
        ("x" * 63, True, True),
        ("x" * 64, False, True),
        ("x" * 253, False, True),
        ("x" * 254, False, False),
        ("md.metal3.example", False, True),
        ("Upper", False, False),
        ("-lead", False, False),
        ("trail-", False, False),
        ("a..b", False, False),
        ("a_b", False, False),
        ("", False, False),
        (None, False, False),
        (7, False, False),
    ],
)
def test_dns1123_names(value: Any, label: bool, subdomain: bool) -> None:
    assert (is_dns1123_label(value), is_dns1123_subdomain(value)) == (label, subdomain)


@pytest.mark.parametrize(
    "selector",
    [
        "app.kubernetes.io/name=slurmctld,app.kubernetes.io/component=controller",
        "app=slurm-ctld",
        "app==x, tier != db",
        "!legacy",
        "present",
        "env in (prod, staging),tier notin (db)",
        "empty=",
    ],
)
def test_valid_label_selectors(selector: str) -> None:
    assert label_selector_problem(selector) is None


@pytest.mark.parametrize(
    ("selector", "part"),
    [
        ("app=a b", "app=a b"),
        ("app=slurm,", ""),
        ("env in prod", "env in prod"),
        ("app=x,Bad_Prefix/name=y", "Bad_Prefix/name=y"),
        ("app=-x", "app=-x"),
        ("env in (a,b", "env in (a,b"),
    ],
)
def test_an_invalid_label_selector_names_the_bad_requirement(selector: str, part: str) -> None:
    assert label_selector_problem(selector) == f"{part!r} is not a valid label selector requirement"


@pytest.mark.parametrize(
    ("api_version", "group"),
    [("v1", ""), ("apps/v1", "apps"), ("cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io"), (None, ""), (3, "")],
)
def test_api_group(api_version: Any, group: str) -> None:
    assert api_group(api_version) == group


GROUP = "infrastructure.cluster.x-k8s.io"


def owners(*refs: Any) -> dict[str, Any]:
    return {"ownerReferences": list(refs)}


def test_the_owner_is_matched_by_kind_and_group_at_any_version() -> None:
    claim = {"apiVersion": f"{GROUP}/v1beta1", "kind": "Metal3DataClaim", "name": "claim-0"}
    data = {"apiVersion": f"{GROUP}/v1beta2", "kind": "Metal3Data", "name": "data-0", "uid": "u"}
    assert owner_reference(owners(claim, data), "Metal3Data", GROUP) == data
    assert owner_name(owners(claim, data), "Metal3Data", GROUP) == "data-0"
    assert owner_name(owners(data), "Metal3Data", "cluster.x-k8s.io") is None  # same kind, another group


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        "metadata",
        {},
        {"ownerReferences": "not-a-list"},
        owners("not-a-dict"),
        owners({"apiVersion": f"{GROUP}/v1beta1", "kind": "Metal3Data", "name": "Not_A_Name"}),
        owners({"apiVersion": f"{GROUP}/v1beta1", "kind": "Metal3Data", "name": 5}),
        owners({"apiVersion": f"{GROUP}/v1beta1", "kind": "Metal3Data"}),
        owners({"apiVersion": "v1", "kind": "Metal3Data", "name": "d"}),
    ],
)
def test_no_owner_from_malformed_metadata(metadata: Any) -> None:
    assert owner_reference(metadata, "Metal3Data", GROUP) is None
    assert owner_name(metadata, "Metal3Data", GROUP) is None


def test_the_first_valid_owner_of_the_kind_wins() -> None:
    bad = {"apiVersion": f"{GROUP}/v1beta1", "kind": "Metal3Data", "name": "BAD"}
    good = {"apiVersion": f"{GROUP}/v1beta1", "kind": "Metal3Data", "name": "good"}
    assert owner_name(owners(bad, good), "Metal3Data", GROUP) == "good"
