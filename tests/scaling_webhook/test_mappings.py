"""Parsing the scaling ConfigMap: both forms, their combination, defaults and every error."""

from __future__ import annotations

import pytest

from scaling_webhook.mappings import Mapping, MappingError, MappingTable, parse_mappings


def pairs(table: MappingTable) -> set[tuple[str, str]]:
    return {(m.mirror_ref, m.machine_deployment_ref) for m in table}


def test_empty_and_missing_data() -> None:
    assert len(parse_mappings(None, "slime")) == 0
    assert len(parse_mappings({}, "slime")) == 0
    assert len(parse_mappings({"mappings": ""}, "slime")) == 0
    assert len(parse_mappings({"unrelated": "x"}, "slime")) == 0


def test_single_mapping_keys_with_defaults() -> None:
    table = parse_mappings(
        {"machineDeploymentName": "md-slurm-workers", "machineDeploymentNamespace": "metal3", "maxReplicas": "100"},
        "slime",
    )
    assert pairs(table) == {("slime/mirror-deployment", "metal3/md-slurm-workers")}
    mapping = table.get("slime", "mirror-deployment")
    assert isinstance(mapping, Mapping) and mapping.source == "the single-mapping keys" and dict(mapping.options) == {}


def test_single_mapping_keys_explicit_mirror() -> None:
    table = parse_mappings(
        {
            "machineDeploymentName": "md",
            "machineDeploymentNamespace": "metal3",
            "maxReplicas": "100",
            "mirrorDeploymentName": "m",
            "mirrorDeploymentNamespace": "keda",
        },
        "slime",
    )
    assert pairs(table) == {("keda/m", "metal3/md")}


def test_list_form() -> None:
    text = """
- mirror: slime/mirror-partition-a
  machineDeployment: metal3/md-partition-a
  maxReplicas: 10
- mirror: slime/mirror-partition-b
  machineDeployment: metal3-b/md-partition-b
  capacityAware: true
"""
    table = parse_mappings({"mappings": text}, "ignored")
    assert pairs(table) == {
        ("slime/mirror-partition-a", "metal3/md-partition-a"),
        ("slime/mirror-partition-b", "metal3-b/md-partition-b"),
    }
    assert table.get("slime", "mirror-partition-b").source == "mappings[1]"  # type: ignore[union-attr]


def test_interfaces_example_combined() -> None:
    data = {
        "machineDeploymentName": "md-slurm-workers",
        "machineDeploymentNamespace": "metal3",
        "maxReplicas": "100",
        "mirrorDeploymentName": "mirror-deployment",
        "mirrorDeploymentNamespace": "slime",
        "mappings": "- mirror: slime/mirror-partition-a\n  machineDeployment: metal3/md-partition-a\n"
        "  maxReplicas: 100\n"
        "- mirror: slime/mirror-partition-b\n  machineDeployment: metal3-b/md-partition-b\n  maxReplicas: 100\n",
    }
    assert len(parse_mappings(data, "slime")) == 3


def test_two_mirrors_may_not_drive_one_machine_deployment() -> None:
    """One MachineDeployment, one writer: two mirrors onto one would make it flap between their values."""
    with pytest.raises(MappingError) as error:
        parse_mappings(
            {
                "mappings": "- {mirror: a/m1, machineDeployment: x/md, maxReplicas: 100}\n"
                "- {mirror: a/m2, machineDeployment: x/md, maxReplicas: 100}"
            },
            "s",
        )
    assert str(error.value) == (
        "mappings[0] and mappings[1] both target MachineDeployment x/md (from mirrors a/m1 and a/m2); "
        "one MachineDeployment must have one writer"
    )


def test_single_mapping_keys_and_a_list_item_onto_one_machine_deployment_are_refused() -> None:
    with pytest.raises(
        MappingError, match="^the single-mapping keys and mappings\\[0\\] both target MachineDeployment metal3/md "
    ):
        parse_mappings(
            {**SINGLE, "mappings": "- {mirror: slime/other, machineDeployment: metal3/md, maxReplicas: 100}"}, "slime"
        )


def test_max_replicas() -> None:
    table = parse_mappings(
        {
            "mappings": (
                "- {mirror: a/m, machineDeployment: x/md, maxReplicas: 12}\n"
                "- {mirror: a/n, machineDeployment: x/o, capacityAware: true}"
            )
        },
        "s",
    )
    assert [(m.max_replicas, m.capacity_aware) for m in table] == [(12, False), (None, True)]


UNCAPPED = (
    "maxReplicas is required unless capacityAware caps the pool: a mirror anyone can scale would otherwise ask "
    "for up to 2147483647 Machines"
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"mappings": "- {mirror: a/m, machineDeployment: x/md}"},
            f"mappings[0] (mirror a/m): {UNCAPPED}",
        ),
        (
            {"mappings": "- {mirror: a/m, machineDeployment: x/md, capacityAware: false}"},
            f"mappings[0] (mirror a/m): {UNCAPPED}",
        ),
        (
            {"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3"},
            f"the single-mapping keys (mirror s/mirror-deployment): {UNCAPPED}",
        ),
    ],
    ids=["list-item", "capacity-aware-false", "single-mapping-keys"],
)
def test_a_pool_is_never_uncapped(data: dict[str, str], message: str) -> None:
    with pytest.raises(MappingError) as error:
        parse_mappings(data, "s")
    assert str(error.value) == message


def test_the_single_mapping_keys_take_a_max_replicas_as_text() -> None:
    (mapping,) = parse_mappings({**SINGLE, "maxReplicas": " 6 "}, "s")
    assert mapping.max_replicas == 6
    for bad in ("six", "-1", "2147483648"):
        with pytest.raises(MappingError, match="^maxReplicas: must be an integer from 0 to 2147483647"):
            parse_mappings({**SINGLE, "maxReplicas": bad}, "s")
    with pytest.raises(MappingError, match="^maxReplicas: belongs to the single-mapping keys"):
        parse_mappings(
            {"maxReplicas": "6", "mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: 1}"}, "s"
        )


def test_table_is_immutable_and_comparable() -> None:
    one = parse_mappings({"mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: 100}"}, "s")
    two = parse_mappings({"mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: 100}"}, "s")
    assert one == two and hash(one) == hash(two)
    with pytest.raises(TypeError):
        one._by_mirror[("a", "n")] = None  # type: ignore[index]


SINGLE = {"machineDeploymentName": "md", "machineDeploymentNamespace": "metal3", "maxReplicas": "100"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"machineDeploymentName": "md"}, "machineDeploymentNamespace: missing (needed with machineDeploymentName)"),
        ({"mirrorDeploymentName": "m"}, "machineDeploymentName: missing (needed with mirrorDeploymentName)"),
        ({**SINGLE, "machineDeploymentName": ""}, "machineDeploymentName: must be a non-empty string"),
        (
            {**SINGLE, "machineDeploymentName": "MD_1"},
            "machineDeploymentName: name 'MD_1' is not a valid DNS-1123 subdomain",
        ),
        (
            {**SINGLE, "machineDeploymentNamespace": "a.b", "maxReplicas": "100"},
            "machineDeploymentNamespace: namespace 'a.b' is not a valid DNS-1123 label",
        ),
        (
            {**SINGLE, "mirrorDeploymentNamespace": "-x"},
            "mirrorDeploymentNamespace: namespace '-x' is not a valid DNS-1123 label",
        ),
        (
            {**SINGLE, "mirrorDeploymentName": "a" * 254},
            f"mirrorDeploymentName: name '{'a' * 254}' is not a valid DNS-1123 subdomain",
        ),
        (
            {"mappings": "- mirror: [unclosed"},
            "mappings: invalid YAML at line 2, column 1: did not find expected ',' or ']'",
        ),
        ({"mappings": "a: 1"}, "mappings: must be a YAML list, got dict"),
        ({"mappings": "- just-a-string"}, "mappings[0]: must be a map with keys mirror, machineDeployment"),
        ({"mappings": "- {mirror: a/m}"}, "mappings[0]: missing key machineDeployment"),
        ({"mappings": "- {machineDeployment: a/md, maxReplicas: 100}"}, "mappings[0]: missing key mirror"),
        (
            {"mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: 100, replicas: 3, Extra: 1}"},
            "mappings[0]: unknown key(s) Extra, replicas; allowed: mirror, machineDeployment",
        ),
        (
            {"mappings": "- {mirror: m, machineDeployment: x/md, maxReplicas: 100}"},
            "mappings[0].mirror: 'm' is not of the form <namespace>/<name>",
        ),
        (
            {"mappings": "- {mirror: a/b/c, machineDeployment: x/md, maxReplicas: 100}"},
            "mappings[0].mirror: 'a/b/c' is not of the form <namespace>/<name>",
        ),
        (
            {"mappings": "- {mirror: /m, machineDeployment: x/md, maxReplicas: 100}"},
            "mappings[0].mirror: '/m' is not of the form <namespace>/<name>",
        ),
        (
            {"mappings": "- {mirror: a/m, machineDeployment: 3, maxReplicas: 100}"},
            "mappings[0].machineDeployment: expected a string <namespace>/<name>, got int",
        ),
        (
            {"mappings": "- {mirror: a/m, machineDeployment: X/md, maxReplicas: 100}"},
            "mappings[0].machineDeployment: namespace 'X' is not a valid DNS-1123 label",
        ),
        (
            {
                "mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: 100}\n"
                "- {mirror: a/m, machineDeployment: y/md, maxReplicas: 100}"
            },
            "mappings[1]: mirror a/m is already mapped by mappings[0] (to MachineDeployment x/md); "
            "a mirror may drive only one MachineDeployment",
        ),
        (
            {**SINGLE, "mappings": "- {mirror: slime/mirror-deployment, machineDeployment: x/md, maxReplicas: 100}"},
            "mappings[0]: mirror slime/mirror-deployment is already mapped by the single-mapping keys "
            "(to MachineDeployment metal3/md); a mirror may drive only one MachineDeployment",
        ),
        (
            {"mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: -1}"},
            "mappings[0].maxReplicas: must be an integer from 0 to 2147483647, got -1",
        ),
        (
            {"mappings": f"- {{mirror: a/m, machineDeployment: x/md, maxReplicas: {2**31}}}"},
            "mappings[0].maxReplicas: must be an integer from 0 to 2147483647, got 2147483648",
        ),
        (
            {"mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: '5'}"},
            "mappings[0].maxReplicas: must be an integer from 0 to 2147483647, got '5'",
        ),
        (
            {"mappings": "- {mirror: a/m, machineDeployment: x/md, maxReplicas: true}"},
            "mappings[0].maxReplicas: must be an integer from 0 to 2147483647, got True",
        ),
    ],
    ids=[
        "single-no-namespace",
        "single-mirror-only",
        "single-empty",
        "single-bad-name",
        "single-bad-namespace",
        "single-bad-mirror-namespace",
        "single-name-too-long",
        "yaml-error",
        "not-a-list",
        "item-not-a-map",
        "missing-md",
        "missing-mirror",
        "unknown-keys",
        "no-slash",
        "two-slashes",
        "empty-namespace",
        "ref-not-string",
        "ref-uppercase",
        "duplicate-in-list",
        "duplicate-across-forms",
        "max-negative",
        "max-too-big",
        "max-string",
        "max-bool",
    ],
)
def test_errors(data: dict[str, str], message: str) -> None:
    with pytest.raises(MappingError) as error:
        parse_mappings(data, "slime")
    assert str(error.value) == message


# --- capacityAware and nodeDemand ------------------------------------------------------------------

SAFE = "safeScaleIn: {slurmrestd: 'http://slurm-restapi.slurm:6820', jwtSecret: slurm/jwt}"


def test_capacity_aware_and_node_demand_options() -> None:
    table = parse_mappings(
        {
            "mappings": (
                "- {mirror: a/m, machineDeployment: x/md, maxReplicas: 100, capacityAware: true, "
                "nodeDemand: {partition: batch}, "
                f"{SAFE}}}\n"
                "- {mirror: a/n, machineDeployment: x/md2, maxReplicas: 100, nodeDemand: {partition: gpu, "
                "slurmrestd: 'http://other:6820', jwtSecret: slurm/other, tokenUser: slinky}}\n"
                "- {mirror: a/o, machineDeployment: x/md3, maxReplicas: 100}\n"
            )
        },
        "slime",
    )
    first, second, third = (table.get("a", n) for n in ("m", "n", "o"))
    assert first is not None and second is not None and third is not None
    assert first.capacity_aware and not second.capacity_aware and not third.capacity_aware
    assert first.node_demand is not None and first.node_demand.partition == "batch"
    assert first.safe_scale_in is not None and first.node_demand.endpoint == first.safe_scale_in.endpoint  # shared
    assert second.node_demand is not None and (second.node_demand.slurmrestd, second.node_demand.token_user) == (
        "http://other:6820",
        "slinky",
    )
    assert third.node_demand is None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("capacityAware: 'yes'", "mappings[0].capacityAware: must be true or false, got 'yes'"),
        (
            "nodeDemand: batch",
            "mappings[0].nodeDemand: must be a map with keys partition, slurmrestd, jwtSecret, jwtKey, apiVersion, "
            "tokenUser",
        ),
        ("nodeDemand: {slurmrestd: 'http://s:6820', jwtSecret: s/j}", "mappings[0].nodeDemand: missing key partition"),
        (
            "nodeDemand: {partition: batch}",
            "mappings[0].nodeDemand: needs slurmrestd and jwtSecret (here, or in the mapping's safeScaleIn block)",
        ),
        (
            "nodeDemand: {partition: 'a b', slurmrestd: 'http://s:6820', jwtSecret: s/j}",
            "mappings[0].nodeDemand.partition: 'a b' is not a Slurm partition name (letters, digits, '.', '_', '-')",
        ),
        (
            "nodeDemand: {partition: batch, Partition: x}",
            "mappings[0].nodeDemand: unknown key(s) Partition; allowed: partition, slurmrestd, jwtSecret, jwtKey, "
            "apiVersion, tokenUser",
        ),
        (
            f"nodeDemand: {{partition: batch, jwtKey: other.key}}, {SAFE}",
            "mappings[0].nodeDemand: give both slurmrestd and jwtSecret, or neither (to use the safeScaleIn endpoint)",
        ),
        (
            "nodeDemand: {partition: batch, slurmrestd: 'ftp://s', jwtSecret: s/j}",
            "mappings[0].nodeDemand.slurmrestd: 'ftp://s' is not an http:// or https:// URL",
        ),
    ],
)
def test_option_errors(item: str, message: str) -> None:
    with pytest.raises(MappingError) as error:
        parse_mappings({"mappings": f"- {{mirror: a/m, machineDeployment: x/md, maxReplicas: 100, {item}}}"}, "slime")
    assert str(error.value) == message


def test_one_partition_feeds_one_pool() -> None:
    demand = "nodeDemand: {partition: batch, slurmrestd: 'http://s:6820', jwtSecret: s/j}"
    with pytest.raises(MappingError) as error:
        parse_mappings(
            {
                "mappings": f"- {{mirror: a/m, machineDeployment: x/md, maxReplicas: 100, {demand}}}\n"
                f"- {{mirror: a/n, machineDeployment: x/md2, maxReplicas: 100, {demand}}}"
            },
            "slime",
        )
    assert (
        str(error.value)
        == "mappings[0] and mappings[1] both publish the node demand of partition 'batch'; one partition feeds one pool"
    )
