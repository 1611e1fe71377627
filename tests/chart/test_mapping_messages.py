"""The chart refuses a mapping exactly when the scaling webhook would, and says the same thing.

Each case is a ``scaling.mappings`` item (its ``config`` keys are copied into the ConfigMap item).
The chart renders it (``helm template``); the service's own parser
(:func:`scaling_webhook.mappings.parse_mappings`) reads the ConfigMap item the chart would write.
Both must accept, or both refuse with the same message: the chart's ``fail`` text is the
service's (a ``null`` never reaches the ConfigMap: Helm drops null keys from values), the refusal of
a pool with no cap included (its text is the service's, scaling_webhook/mappings.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from scaling_webhook.mappings import MappingError, parse_mappings
from testbed.framework.chart import NAMESPACE, HelmError

SAFE = {"slurmrestd": "http://slurm-restapi.slurm:6820", "jwtSecret": "slurm/slurm-auth-jwths256"}


def item(index: int = 0, maxReplicas: Any = 4, **config: Any) -> dict[str, Any]:
    mapping: dict[str, Any] = {
        "mirror": {"name": f"mirror-{index}", "namespace": NAMESPACE},
        "machineDeployment": {"name": f"md-{index}", "namespace": "metal3"},
    }
    if maxReplicas is not None:
        mapping["maxReplicas"] = maxReplicas
    if config:
        mapping["config"] = config
    return mapping


def configmap_item(mapping: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap list item the chart renders for a mapping without KEDA."""
    out: dict[str, Any] = {
        "mirror": f"{mapping['mirror']['namespace']}/{mapping['mirror']['name']}",
        "machineDeployment": f"{mapping['machineDeployment']['namespace']}/{mapping['machineDeployment']['name']}",
    }
    if "maxReplicas" in mapping:
        out["maxReplicas"] = mapping["maxReplicas"]
    out.update(mapping.get("config") or {})
    return out


def service_message(mappings: list[dict[str, Any]]) -> str | None:
    text = yaml.safe_dump([configmap_item(m) for m in mappings])
    try:
        parse_mappings({"mappings": text}, NAMESPACE)
    except MappingError as exc:
        return str(exc)
    return None


def chart_message(render: Any, mappings: list[dict[str, Any]]) -> str | None:
    try:
        render({"scaling": {"mappings": mappings}})
    except HelmError as exc:
        match = re.search(r"execution error at \([^)]*\): (.*?)\n\nUse --debug", exc.stderr, re.S)
        assert match, exc.stderr
        return match.group(1)
    return None


CASES: dict[str, list[dict[str, Any]]] = {
    # accepted by both
    "capped": [item()],
    "capacity-aware-uncapped": [item(maxReplicas=None, capacityAware=True)],
    "capped-and-capacity-aware": [item(capacityAware=True)],
    "capacity-aware-false-capped": [item(capacityAware=False)],
    "safe-scale-in-minimal": [item(safeScaleIn=SAFE)],
    "safe-scale-in-full": [
        item(
            safeScaleIn={
                **SAFE,
                "jwtKey": "jwt.key",
                "apiVersion": "v0.0.44",
                "tokenUser": "root",
                "drainTimeoutSeconds": 3600,
                "releasedNodes": "delete",
            }
        )
    ],
    "safe-scale-in-fractional-timeout": [item(safeScaleIn={**SAFE, "drainTimeoutSeconds": 0.5})],
    "safe-scale-in-trailing-slashes": [item(safeScaleIn={**SAFE, "slurmrestd": "https://slurm.example:6820//"})],
    "node-demand-own-endpoint": [item(nodeDemand={"partition": "batch", **SAFE})],
    "node-demand-shares-safe-endpoint": [item(safeScaleIn=SAFE, nodeDemand={"partition": "gpu.a_1-x"})],
    "two-partitions": [item(0, nodeDemand={"partition": "a", **SAFE}), item(1, nodeDemand={"partition": "b", **SAFE})],
    # refused by both, with the same words
    "uncapped": [item(maxReplicas=None)],
    "uncapped-capacity-aware-false": [item(maxReplicas=None, capacityAware=False)],
    "uncapped-second": [item(0), item(1, maxReplicas=None)],
    "unknown-config-key": [item(drainTimeoutSeconds=30)],
    "unknown-config-key-hint": [item(safescalein=SAFE)],
    "capacity-aware-string": [item(capacityAware="yes")],
    "capacity-aware-number": [item(capacityAware=1)],
    "capacity-aware-map": [item(capacityAware={"hosts": [1, "it's"]})],
    "safe-not-a-map": [item(safeScaleIn="http://slurm:6820")],
    "safe-unknown-key": [item(safeScaleIn={**SAFE, "drainTimeout": 5, "apiversion": "v0.0.42"})],
    "safe-missing-url": [item(safeScaleIn={"jwtSecret": "slurm/k"})],
    "safe-missing-secret": [item(safeScaleIn={"slurmrestd": "http://slurm:6820"})],
    "safe-empty-url": [item(safeScaleIn={**SAFE, "slurmrestd": "  "})],
    "safe-url-number": [item(safeScaleIn={**SAFE, "slurmrestd": 6820})],
    "safe-url-no-scheme": [item(safeScaleIn={**SAFE, "slurmrestd": "slurm-restapi:6820"})],
    "safe-url-ftp": [item(safeScaleIn={**SAFE, "slurmrestd": "ftp://slurm:6820"})],
    "safe-url-quote": [item(safeScaleIn={**SAFE, "slurmrestd": "http://it's:1"})],
    "safe-secret-no-slash": [item(safeScaleIn={**SAFE, "jwtSecret": "slurm-auth"})],
    "safe-secret-three-parts": [item(safeScaleIn={**SAFE, "jwtSecret": "a/b/c"})],
    "safe-secret-bad-namespace": [item(safeScaleIn={**SAFE, "jwtSecret": "Slurm/key"})],
    "safe-secret-bad-name": [item(safeScaleIn={**SAFE, "jwtSecret": "slurm/Key_1"})],
    "safe-bad-jwt-key": [item(safeScaleIn={**SAFE, "jwtKey": "a/b"})],
    "safe-empty-jwt-key": [item(safeScaleIn={**SAFE, "jwtKey": ""})],
    "safe-bad-api-version": [item(safeScaleIn={**SAFE, "apiVersion": "v0.0.41"})],
    "safe-api-version-number": [item(safeScaleIn={**SAFE, "apiVersion": 42})],
    "safe-zero-timeout": [item(safeScaleIn={**SAFE, "drainTimeoutSeconds": 0})],
    "safe-negative-timeout": [item(safeScaleIn={**SAFE, "drainTimeoutSeconds": -2.5})],
    "safe-bool-timeout": [item(safeScaleIn={**SAFE, "drainTimeoutSeconds": True})],
    "safe-string-timeout": [item(safeScaleIn={**SAFE, "drainTimeoutSeconds": "1h"})],
    "safe-released-nodes": [item(safeScaleIn={**SAFE, "releasedNodes": "drain"})],
    "safe-released-nodes-bool": [item(safeScaleIn={**SAFE, "releasedNodes": False})],
    "demand-not-a-map": [item(nodeDemand=["batch"])],
    "demand-no-partition": [item(nodeDemand=dict(SAFE))],
    "demand-no-partition-unknown-key": [item(nodeDemand={**SAFE, "partitions": "a"})],
    "demand-empty-partition": [item(nodeDemand={"partition": "", **SAFE})],
    "demand-bad-partition": [item(nodeDemand={"partition": "gpu a", **SAFE})],
    "demand-partition-dash-first": [item(nodeDemand={"partition": "-gpu", **SAFE})],
    "demand-partition-too-long": [item(nodeDemand={"partition": "p" * 64, **SAFE})],
    "demand-partition-slash": [item(nodeDemand={"partition": "a/b", **SAFE})],
    "demand-no-endpoint": [item(nodeDemand={"partition": "batch"})],
    "demand-half-endpoint-with-safe": [
        item(safeScaleIn=SAFE, nodeDemand={"partition": "b", "slurmrestd": "http://x:1"})
    ],
    "demand-bad-url-with-safe": [item(safeScaleIn=SAFE, nodeDemand={"partition": "b", **SAFE, "slurmrestd": "x"})],
    "safe-api-version-46": [item(safeScaleIn={**SAFE, "apiVersion": "v0.0.46"})],
    # slurmHealth: accepted by both
    "health-minimal": [item(slurmHealth=SAFE)],
    "health-full": [
        item(
            slurmHealth={
                **SAFE,
                "registrationTimeout": "20m",
                "unhealthyTimeout": "1h30m",
                "remediate": True,
                "maxUnhealthy": "25%",
                "slurmUser": "slurmadm",
            }
        )
    ],
    "health-seconds-and-count": [item(slurmHealth={**SAFE, "registrationTimeout": 900, "maxUnhealthy": 2})],
    "health-shares-safe-endpoint": [item(safeScaleIn=SAFE, slurmHealth={"remediate": True})],
    "health-shares-demand-endpoint": [item(nodeDemand={"partition": "b", **SAFE}, slurmHealth={})],
    # slurmHealth: refused by both, with the same words
    "health-no-endpoint": [item(slurmHealth={"remediate": True})],
    "health-half-endpoint-with-safe": [item(safeScaleIn=SAFE, slurmHealth={"slurmrestd": "http://x:1"})],
    "health-unknown-key": [item(slurmHealth={**SAFE, "nodeStartupTimeout": "10m"})],
    "health-not-a-map": [item(slurmHealth=True)],
    "health-bad-duration": [item(slurmHealth={**SAFE, "registrationTimeout": "soon"})],
    "health-duration-no-unit": [item(slurmHealth={**SAFE, "unhealthyTimeout": "15"})],
    "health-zero-duration": [item(slurmHealth={**SAFE, "unhealthyTimeout": "0m"})],
    "health-zero-seconds": [item(slurmHealth={**SAFE, "registrationTimeout": 0})],
    "health-negative-seconds": [item(slurmHealth={**SAFE, "registrationTimeout": -5})],
    "health-bool-duration": [item(slurmHealth={**SAFE, "registrationTimeout": False})],
    "health-remediate-string": [item(slurmHealth={**SAFE, "remediate": "yes"})],
    "health-max-over-100": [item(slurmHealth={**SAFE, "maxUnhealthy": "140%"})],
    "health-max-negative": [item(slurmHealth={**SAFE, "maxUnhealthy": -1})],
    "health-max-fraction": [item(slurmHealth={**SAFE, "maxUnhealthy": 1.5})],
    "health-bad-user": [item(slurmHealth={**SAFE, "slurmUser": "Robert Tables"})],
    "health-user-number": [item(slurmHealth={**SAFE, "slurmUser": 64030})],
    "health-bad-url": [item(slurmHealth={**SAFE, "slurmrestd": "slurm:6820"})],
    "duplicate-partition": [
        item(0, nodeDemand={"partition": "a", **SAFE}),
        item(1, nodeDemand={"partition": "a", **SAFE}),
    ],
    "duplicate-partition-shared-endpoint": [
        item(0, safeScaleIn=SAFE, nodeDemand={"partition": "batch"}),
        item(1),
        item(2, nodeDemand={"partition": " batch ", **SAFE}),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_chart_and_the_service_agree(render, case: str) -> None:
    mappings = CASES[case]
    expected = service_message(mappings)
    assert chart_message(render, mappings) == expected


def test_the_cases_cover_both_answers() -> None:
    """A comparison that only ever sees acceptances (or refusals) could not fail."""
    answers = [service_message(m) for m in CASES.values()]
    assert sum(a is None for a in answers) >= 10 and sum(a is not None for a in answers) >= 40


def test_an_uncapped_pool_is_refused_with_the_shared_text(render) -> None:
    message = chart_message(render, [item(maxReplicas=None)])
    assert message == (
        f"mappings[0] (mirror {NAMESPACE}/mirror-0): maxReplicas is required unless capacityAware caps the pool: a "
        "mirror anyone can scale would otherwise ask for up to 2147483647 Machines"
    )


def test_keda_caps_a_mapping_that_names_no_max(render) -> None:
    """With KEDA the ConfigMap gets its maxReplicaCount as maxReplicas: capped, so accepted."""
    values = {"keda": {"enabled": True, "maxReplicaCount": 6}, "scaling": {"mappings": [item(maxReplicas=None)]}}
    values["scaling"]["mappings"][0]["partition"] = "batch"
    (cm,) = [
        o for o in render(values) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "scaling-webhook-configmap"
    ]
    assert yaml.safe_load(cm["data"]["mappings"])[0]["maxReplicas"] == 6


@pytest.mark.parametrize("partition", ["gpu a", "-x", "a" * 64, 'quo"te', ""])
def test_a_partition_the_service_would_refuse_fails_rendering(render, partition: str) -> None:
    """`partition` feeds the KEDA query and /demand/<partition>: the service's name rule, its words."""
    values = {"scaling": {"mappings": [{**item(), "partition": partition}]}}
    with pytest.raises(HelmError) as exc:
        render(values)
    assert (
        f"scaling.mappings[0].partition: {partition!r} is not a Slurm partition name (letters, digits, '.', '_', '-')"
        in exc.value.stderr
    )
