"""values.schema.json carries the services' own bounds and formats: a value the schema allows, the service takes.

Every chart value the chart renders into a service's flag or variable is listed in :data:`SETTINGS`
with the settings field it becomes. For numbers the schema's bounds must equal the field's
(``gt``/``ge``/``le``/``lt``), and its type be the field's; ports are the one deliberate
difference (the pods run as non-root with every capability dropped, so they cannot bind below
1024). For strings the schema's pattern must admit nothing the service refuses: hypothesis draws
strings from each pattern and the settings model (its own validators) must take every one. The
schema may be stricter than the service where a JSON-schema pattern cannot say the exact rule
(an IPv6 zone, a host name whose last label starts with a digit), never looser.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable
from typing import Any

import annotated_types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from common.settings import ServiceSettings
from injection_webhook.settings import InjectionSettings
from scaling_webhook.settings import ScalingSettings
from testbed.framework.chart import COMBOS, HelmError, by_kind
from testbed.framework.paths import CHART

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

# chart value -> (the settings model whose flag it becomes, the field)
SETTINGS: dict[str, tuple[type[ServiceSettings], str]] = {
    "logLevel": (ServiceSettings, "log_level"),
    "certPollSeconds": (ServiceSettings, "cert_poll_seconds"),
    "injection.port": (InjectionSettings, "port"),
    "injection.metricsPort": (InjectionSettings, "metrics_port"),
    "injection.controllerSelector": (InjectionSettings, "controller_selector"),
    "injection.cacheSyncTimeoutSeconds": (InjectionSettings, "cache_sync_timeout_seconds"),
    "injection.confServer.policy": (InjectionSettings, "conf_server_policy"),
    "injection.confServer.nodeAddresses": (InjectionSettings, "conf_server_node_addresses"),
    "injection.extraJoinData": (InjectionSettings, "extra_join_data"),
    "injection.allowedRequesters": (InjectionSettings, "allowed_requesters"),
    "injection.slurmBindings": (InjectionSettings, "slurm_bindings"),
    "injection.templateOptIns": (InjectionSettings, "template_opt_ins"),
    "scaling.port": (ScalingSettings, "port"),
    "scaling.metricsPort": (ScalingSettings, "metrics_port"),
    "scaling.configMapName": (ScalingSettings, "config_map"),
    "scaling.resyncSeconds": (ScalingSettings, "resync_seconds"),
    "scaling.patchTimeoutSeconds": (ScalingSettings, "patch_timeout_seconds"),
    "scaling.leaseName": (ScalingSettings, "lease_name"),
    "scaling.allowedRequesters": (ScalingSettings, "scale_requesters"),
    "keda.scaleRequesters": (ScalingSettings, "scale_requesters"),  # joined to scaling.allowedRequesters
}
# Set by the chart itself, from no value (the mounted files, the pod's namespace and name).
FIXED = {"SLIME_CERT_FILE", "SLIME_KEY_FILE", "SLIME_CLIENT_CA_FILE", "POD_NAMESPACE", "POD_NAME"}
# Deliberately narrower than the service, and why.
UNPRIVILEGED_PORTS = {"minimum": 1024}


def schema_of(path: str) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for key in path.split("."):
        node = node["properties"][key]
    return node


def bounds(model: type[ServiceSettings], field: str) -> dict[str, float]:
    """The field's numeric bounds in JSON-schema words."""
    out: dict[str, float] = {}
    for item in model.model_fields[field].metadata:
        if isinstance(item, annotated_types.Ge):
            out["minimum"] = item.ge  # type: ignore[assignment]
        elif isinstance(item, annotated_types.Gt):
            out["exclusiveMinimum"] = item.gt  # type: ignore[assignment]
        elif isinstance(item, annotated_types.Le):
            out["maximum"] = item.le  # type: ignore[assignment]
        elif isinstance(item, annotated_types.Lt):
            out["exclusiveMaximum"] = item.lt  # type: ignore[assignment]
    return out


NUMERIC = [v for v, (m, f) in SETTINGS.items() if m.model_fields[f].annotation in (int, float)]


@pytest.mark.parametrize("value", NUMERIC)
def test_numeric_bounds_are_the_services(value: str) -> None:
    model, field = SETTINGS[value]
    node = schema_of(value)
    kind = model.model_fields[field].annotation
    assert node["type"] == {int: "integer", float: "number"}[kind], value
    schema_bounds = {k: node[k] for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum") if k in node}
    expected = bounds(model, field)
    if value.endswith("ort"):  # port, metricsPort
        expected.update(UNPRIVILEGED_PORTS)
    assert schema_bounds == expected, value


def test_the_numeric_fields_are_bounded_at_all() -> None:
    """A test that compared empty bound sets would pass for nothing."""
    assert {v for v in NUMERIC if bounds(*SETTINGS[v])} >= {
        "certPollSeconds",
        "injection.cacheSyncTimeoutSeconds",
        "scaling.patchTimeoutSeconds",
        "scaling.resyncSeconds",
    }


def test_log_levels_are_the_services() -> None:
    (levels,) = [typing.get_args(ServiceSettings.model_fields["log_level"].annotation)]
    allowed = schema_of("logLevel")["enum"]
    assert {a.upper() for a in allowed} == set(levels)
    for level in allowed:
        assert ServiceSettings(log_level=level).log_level == level.upper()


def test_every_value_the_chart_passes_to_a_service_is_checked_here(render: Callable[..., Any]) -> None:
    """A new flag or variable the chart renders from a value must get a row in SETTINGS."""
    known = {m.env_name(f) for m, f in SETTINGS.values()} | FIXED
    rendered = set()
    for combo in COMBOS.values():
        for deployment in by_kind(render(combo), "Deployment"):
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                rendered |= {e["name"] for e in container.get("env") or []}
    assert rendered and rendered <= known, sorted(rendered - known)
    assert known <= rendered | {"SLIME_CLIENT_CA_FILE"}, sorted(known - rendered)


def accepts(model: type[ServiceSettings], field: str, text: str) -> bool:
    try:
        model(**{field: text})
    except ValidationError:
        return False
    return True


def admits(node: dict[str, Any], text: str) -> bool:
    """A string schema's verdict (enum, pattern, min/maxLength, anyOf, not: what these schemas use)."""
    if "enum" in node and text not in node["enum"]:
        return False
    if "pattern" in node and not re.fullmatch(node["pattern"], text):
        return False
    if not node.get("minLength", 0) <= len(text) <= node.get("maxLength", len(text)):
        return False
    if "anyOf" in node and not any(admits(choice, text) for choice in node["anyOf"]):
        return False
    return not ("not" in node and admits(node["not"], text))


def strings(value: str) -> st.SearchStrategy[str]:
    """What the schema admits for one chart value, as the service receives it (lists joined with commas)."""
    node = schema_of(value)
    if node["type"] == "array":
        items = node["items"]
        element = st.sampled_from(items["enum"]) if "enum" in items else st.from_regex(items["pattern"], fullmatch=True)
        element = element.filter(lambda s: admits(items, s))
        unique = st.lists(element, min_size=node.get("minItems", 0), max_size=4, unique=node.get("uniqueItems", False))
        return unique.map(",".join)
    return st.from_regex(node["pattern"], fullmatch=True).filter(lambda s: admits(node, s))


PATTERNED = [
    "injection.controllerSelector",
    "injection.confServer.policy",
    "injection.confServer.nodeAddresses",
    "injection.extraJoinData",
    "injection.allowedRequesters",
    "injection.slurmBindings",
    "injection.templateOptIns",
    "scaling.allowedRequesters",
    "keda.scaleRequesters",
    "scaling.configMapName",
    "scaling.leaseName",
]


@pytest.mark.parametrize("value", PATTERNED)
def test_every_string_the_schema_admits_the_service_takes(value: str) -> None:
    model, field = SETTINGS[value]

    @settings(max_examples=75, deadline=None)
    @given(strings(value))
    def check(text: str) -> None:
        assert accepts(model, field, text), f"{value}={text!r} passes the schema, and the service refuses it"

    check()


@pytest.mark.parametrize(
    "value,refused",
    [
        (
            "injection.confServer.policy",
            ["10.0.0.1:99999", "999.1.1.1", "hostip", "Service", "hostIP:6817", "[::1", "a..b", "1.2.3", ""],
        ),
        ("injection.confServer.nodeAddresses", ["192.0.2.1:30817", "256.1.1.1", "-node"]),
        ("injection.controllerSelector", ["", "a=b,", "a in b", "=x"]),
        ("injection.allowedRequesters", ["system:serviceaccount:a b", "a\u00a0b"]),
        ("scaling.leaseName", ["Lease", "a_b", "x" * 254]),
    ],
)
def test_the_patterns_refuse_what_the_service_refuses(value: str, refused: list[str]) -> None:
    """The comparison above can fail: these the service refuses, and so does the schema."""
    model, field = SETTINGS[value]
    node = schema_of(value)
    for text in refused:
        assert not accepts(model, field, text), text
        assert not admits(node["items"] if node["type"] == "array" else node, text), text


@pytest.mark.parametrize(
    "values,field",
    [
        ({"logLevel": "CRITICAL"}, "/logLevel"),
        ({"certPollSeconds": 60}, "/certPollSeconds"),
        ({"certPollSeconds": 0}, "/certPollSeconds"),
        ({"injection": {"cacheSyncTimeoutSeconds": 0}}, "/injection/cacheSyncTimeoutSeconds"),
        ({"injection": {"cacheSyncTimeoutSeconds": 26}}, "/injection/cacheSyncTimeoutSeconds"),
        ({"scaling": {"patchTimeoutSeconds": 26}}, "/scaling/patchTimeoutSeconds"),
        ({"scaling": {"patchTimeoutSeconds": 0}}, "/scaling/patchTimeoutSeconds"),
        ({"scaling": {"resyncSeconds": 0}}, "/scaling/resyncSeconds"),
        ({"injection": {"controllerSelector": "app in slurmctld"}}, "/injection/controllerSelector"),
        ({"injection": {"allowedRequesters": []}}, "/injection/allowedRequesters"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
)
def test_the_values_the_review_found_pass_no_more(
    render: Callable[..., Any], values: dict[str, Any], field: str
) -> None:
    """Issue 30: these installed, and then the pods exited 2."""
    with pytest.raises(HelmError) as exc:
        render(values)
    assert field in exc.value.stderr or field.lstrip("/").replace("/", ".") in exc.value.stderr, exc.value.stderr


def test_the_same_port_twice_fails_rendering_as_the_service_would(render: Callable[..., Any]) -> None:
    with pytest.raises(HelmError) as exc:
        render({"scaling": {"port": 9000, "metricsPort": 9000}})
    assert "scaling.port and scaling.metricsPort are both 9000; they must differ" in exc.value.stderr
