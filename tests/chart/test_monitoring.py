"""The chart's ServiceMonitor, PrometheusRule and Grafana dashboard, held against promtool, the services and the docs.

- every alert and every dashboard query parses (``promtool check rules``; the dashboard's queries
  as recording rules);
- every metric a rule or a panel reads is one the services register (read from their metrics
  classes, as tests/test_docs.py does), or ``up``;
- every alert has a ``for:``, a severity and a ``runbook_url`` whose anchor is a section of
  docs/operations.md, and that page has a section for every alert;
- the alerts fire on series fixtures where they should and stay silent where they should not
  (``promtool test rules``): notably ``SliMeScalingLeaderAbsent`` with no scaling series at all,
  where ``SliMeNoScalingLeader``'s ``sum(...) != 1`` is empty and cannot fire.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.components.prometheus import promtool as find_promtool
from testbed.framework.chart import CRD_APIS, NAMESPACE, TWO_MAPPINGS, HelmError, by_kind, one
from testbed.framework.debian import PackagesUnavailable
from testbed.framework.paths import REPO_ROOT
from tests.test_docs import registered_metrics

APIS = (*CRD_APIS, "monitoring.coreos.com/v1")
ALL_ON = {
    **TWO_MAPPINGS,
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "runbookBaseURL": "https://git.example.org/slime/docs/operations.md"},
        "grafanaDashboard": {"enabled": True},
    },
}
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
INJ, SCL = "slime-injection-webhook", "slime-scaling-webhook"


@pytest.fixture(scope="module")
def promtool() -> str:
    try:
        return find_promtool()
    except PackagesUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no promtool on PATH and Debian's prometheus package could not be fetched, and CI=true: {exc}")
        pytest.skip(f"no promtool: {exc}")


@pytest.fixture(scope="module")
def objects(render: Any) -> list[dict[str, Any]]:
    return render(ALL_ON, api_versions=APIS)


def rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = by_kind(objects, "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = one(objects, "ConfigMap", "slime-dashboard")
    board: dict[str, Any] = json.loads(config_map["data"]["slime.json"])
    return board


def queries(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in board["panels"] for t in panel.get("targets") or []]


def check_rules(promtool: str, tmp_path: Path, groups: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_every_alert_parses(objects: list[dict[str, Any]], promtool: str, tmp_path: Path) -> None:
    (rule,) = by_kind(objects, "PrometheusRule")
    proc = check_rules(promtool, tmp_path, rule["spec"]["groups"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules(objects))} rules found" in proc.stdout


def test_every_dashboard_query_parses(objects: list[dict[str, Any]], promtool: str, tmp_path: Path) -> None:
    found = queries(dashboard(objects))
    assert len(found) >= 20
    recording = [{"record": f"slime:dashboard:{i}", "expr": q} for i, q in enumerate(found)]
    proc = check_rules(promtool, tmp_path, [{"name": "dashboard", "rules": recording}])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_catches_a_broken_query(promtool: str, tmp_path: Path) -> None:
    proc = check_rules(promtool, tmp_path, [{"name": "x", "rules": [{"record": "x:y", "expr": "sum(rate(x[5m])"}]}])
    assert proc.returncode != 0


FUNCTIONS = {"sum", "rate", "increase", "max", "min", "histogram_quantile", "absent", "time", "by", "or", "and"}


def metric_names(expr: str) -> set[str]:
    names = {m.group(1) for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr)}
    names |= {m.group(1) for m in re.finditer(r"\b(slime_[a-z0-9_]+)\b", expr)}
    return names - FUNCTIONS


def known_series() -> set[str]:
    out = {"up"}
    for family in registered_metrics():
        out |= {family, f"{family}_total", f"{family}_bucket", f"{family}_sum", f"{family}_count"}
    return out


def test_every_metric_read_is_one_the_services_register(objects: list[dict[str, Any]]) -> None:
    exprs = [str(r["expr"]) for r in rules(objects)] + queries(dashboard(objects))
    read = set().union(*(metric_names(e) for e in exprs))
    assert read and not sorted(read - known_series()), sorted(read - known_series())
    assert "slime_scaling_leader" in read and "slime_webhook_latency_seconds_bucket" in read
    assert metric_names("sum(slime_no_such_metric{a='b'})") - known_series() == {"slime_no_such_metric"}  # can fail


def slugs(page: Path) -> set[str]:
    """The anchors a Markdown renderer (GitHub's rule) gives the page's headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M):
        text = re.sub(r"[`*]", "", heading).strip().lower()
        out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text)))
    return out


def test_every_alert_has_for_a_severity_and_a_runbook_that_exists(objects: list[dict[str, Any]]) -> None:
    anchors = slugs(OPERATIONS)
    base = ALL_ON["monitoring"]["prometheusRule"]["runbookBaseURL"]
    alerts = [r for r in rules(objects) if "alert" in r]
    assert len(alerts) >= 13
    for alert in alerts:
        assert re.fullmatch(r"\d+[smh]", alert["for"]), alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        url = alert["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == base and anchor in anchors, f"{alert['alert']}: {url} (no such section in docs/operations.md)"
        assert anchor == alert["alert"].lower(), "each alert's section is named after it"
        assert alert["annotations"]["summary"]
    # ... and the page's runbook section documents exactly the chart's alerts.
    section = OPERATIONS.read_text().split("\n## Alerts and runbooks\n", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^### (\S+)$", section, re.M) == [a["alert"] for a in alerts]


def test_every_expression_selects_only_this_release(objects: list[dict[str, Any]]) -> None:
    for rule in rules(objects):
        for selector in re.findall(r"\{([^}]*)\}", str(rule["expr"])):
            assert f'namespace="{NAMESPACE}"' in selector, (rule["alert"], selector)


def fire(promtool: str, tmp_path: Path, objects: list[dict[str, Any]], test: dict[str, Any]) -> str:
    (rule,) = by_kind(objects, "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    test_file = tmp_path / "test.yaml"
    test_file.write_text(json.dumps({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [test]}))
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


def alert(objects: list[dict[str, Any]], name: str, value: float = 1, **labels: str) -> dict[str, Any]:
    """An expected firing alert: the rule's labels and annotations, its templates filled as Prometheus fills them."""
    (rule,) = [r for r in rules(objects) if r.get("alert") == name]
    annotations = {}
    for key, text in rule["annotations"].items():
        text = text.replace("{{ $value }}", f"{value:g}")
        for label, label_value in labels.items():
            text = text.replace(f"{{{{ $labels.{label} }}}}", label_value)
        annotations[key] = text
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


INJ_SEL = f'namespace="{NAMESPACE}",service="{INJ}"'
SCL_SEL = f'namespace="{NAMESPACE}",service="{SCL}"'


def test_the_leader_alerts_cover_none_two_and_absent(
    objects: list[dict[str, Any]], promtool: str, tmp_path: Path
) -> None:
    absent = {
        "interval": "1m",
        "input_series": [{"series": f"up{{{INJ_SEL}}}", "values": "1x20"}],  # injection scraped; scaling not at all
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "SliMeScalingLeaderAbsent", "exp_alerts": []},  # for: 5m
            {
                "eval_time": "10m",
                "alertname": "SliMeScalingLeaderAbsent",
                "exp_alerts": [alert(objects, "SliMeScalingLeaderAbsent", namespace=NAMESPACE, service=SCL)],
            },
            {"eval_time": "10m", "alertname": "SliMeNoScalingLeader", "exp_alerts": []},  # empty sum: silent
        ],
    }
    assert fire(promtool, tmp_path, objects, absent) == ""
    two = {
        "interval": "1m",
        "input_series": [
            {"series": f'slime_scaling_leader{{{SCL_SEL},pod="a"}}', "values": "1x20"},
            {"series": f'slime_scaling_leader{{{SCL_SEL},pod="b"}}', "values": "1x20"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "10m",
                "alertname": "SliMeNoScalingLeader",
                "exp_alerts": [alert(objects, "SliMeNoScalingLeader", 2)],
            },
            {"eval_time": "10m", "alertname": "SliMeScalingLeaderAbsent", "exp_alerts": []},
        ],
    }
    assert fire(promtool, tmp_path, objects, two) == ""
    one_leader = {
        "interval": "1m",
        "input_series": [
            {"series": f'slime_scaling_leader{{{SCL_SEL},pod="a"}}', "values": "1x20"},
            {"series": f'slime_scaling_leader{{{SCL_SEL},pod="b"}}', "values": "0x20"},
            # Another release's leader in another namespace changes nothing here.
            {"series": 'slime_scaling_leader{namespace="other",service="slime-scaling-webhook"}', "values": "1x20"},
        ],
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "SliMeNoScalingLeader", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "SliMeScalingLeaderAbsent", "exp_alerts": []},
        ],
    }
    assert fire(promtool, tmp_path, objects, one_leader) == ""


def test_the_harness_fails_on_a_wrong_expectation(objects: list[dict[str, Any]], promtool: str, tmp_path: Path) -> None:
    wrong = {
        "interval": "1m",
        "input_series": [{"series": f'slime_scaling_leader{{{SCL_SEL},pod="a"}}', "values": "1x20"}],
        "alert_rule_test": [
            {
                "eval_time": "10m",
                "alertname": "SliMeNoScalingLeader",
                "exp_alerts": [alert(objects, "SliMeNoScalingLeader", 1)],
            }
        ],
    }
    assert "SliMeNoScalingLeader" in fire(promtool, tmp_path, objects, wrong)


def test_the_other_alerts_fire_on_their_series(objects: list[dict[str, Any]], promtool: str, tmp_path: Path) -> None:
    week = 7 * 86400
    test = {
        "interval": "1m",
        "input_series": [
            {"series": f"up{{{INJ_SEL}}}", "values": "0x90"},
            {
                "series": f'slime_webhook_requests_total{{{INJ_SEL},webhook="injection",outcome="denied"}}',
                "values": "0+1x90",
            },
            {
                "series": f'slime_webhook_requests_total{{{SCL_SEL},webhook="scaling",outcome="errored"}}',
                "values": "0+2x90",
            },
            {
                "series": f'slime_injection_join_data_withheld_total{{{INJ_SEL},reason="requester"}}',
                "values": "0 1x90",
            },
            # Expires 3 days from the start: within 7 days, for longer than the 1 h `for:`.
            {"series": f"slime_certificate_expiry_timestamp_seconds{{{SCL_SEL}}}", "values": f"{3 * 86400}x90"},
            {"series": f"slime_certificate_expiry_timestamp_seconds{{{INJ_SEL}}}", "values": f"{week * 4}x90"},
            {"series": f'slime_scaling_leader{{{SCL_SEL},pod="a"}}', "values": "1x90"},
            {"series": f"slime_scaling_config_valid{{{SCL_SEL}}}", "values": "0x90"},
            {"series": f'slime_scaling_waiting_mappings{{{SCL_SEL},reason="capacity"}}', "values": "1x90"},
            {"series": f'slime_scaling_waiting_mappings{{{SCL_SEL},reason="paused"}}', "values": "0x90"},
            {"series": f"slime_scaling_slurm_errors_total{{{SCL_SEL}}}", "values": "0+1x90"},
            {"series": f"slime_scaling_drain_overdue_total{{{SCL_SEL}}}", "values": "0 1x90"},
            {
                "series": f'slime_scaling_unhealthy_machines{{{SCL_SEL},mapping="metal3/md",reason="NodeLost"}}',
                "values": "2x90",
            },
            {
                "series": f'slime_scaling_unhealthy_machines{{{SCL_SEL},mapping="metal3/md",reason="NeverRegistered"}}',
                "values": "0x90",
            },
            {"series": f"slime_scaling_remediation_short_circuits_total{{{SCL_SEL}}}", "values": "0+1x90"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "80m",
                "alertname": "SliMeInjectionWebhookDown",
                "exp_alerts": [alert(objects, "SliMeInjectionWebhookDown", 0)],
            },
            {
                "eval_time": "80m",
                "alertname": "SliMeInjectionDenied",
                "exp_alerts": [alert(objects, "SliMeInjectionDenied", 15)],
            },
            {"eval_time": "8m", "alertname": "SliMeInjectionDenied", "exp_alerts": []},  # for: 10m
            {
                "eval_time": "30m",
                "alertname": "SliMeJoinDataWithheld",
                "exp_alerts": [alert(objects, "SliMeJoinDataWithheld")],
            },
            {
                "eval_time": "80m",
                "alertname": "SliMeAdmissionErrors",
                "exp_alerts": [alert(objects, "SliMeAdmissionErrors", 30, webhook="scaling")],
            },
            {
                "eval_time": "80m",
                "alertname": "SliMeCertificateExpiring",
                "exp_alerts": [alert(objects, "SliMeCertificateExpiring", 3 * 86400 - 80 * 60 - week, service=SCL)],
            },
            {"eval_time": "80m", "alertname": "SliMeNoScalingLeader", "exp_alerts": []},
            {
                "eval_time": "80m",
                "alertname": "SliMeMappingConfigInvalid",
                "exp_alerts": [alert(objects, "SliMeMappingConfigInvalid", 0)],
            },
            {
                "eval_time": "80m",
                "alertname": "SliMePoolWaiting",
                "exp_alerts": [alert(objects, "SliMePoolWaiting", 1, reason="capacity")],
            },
            {
                "eval_time": "80m",
                "alertname": "SliMeSlurmUnreachable",
                "exp_alerts": [alert(objects, "SliMeSlurmUnreachable", 10)],
            },
            {"eval_time": "30m", "alertname": "SliMeDrainOverdue", "exp_alerts": [alert(objects, "SliMeDrainOverdue")]},
            {"eval_time": "25m", "alertname": "SliMeMachinesUnhealthy", "exp_alerts": []},  # for: 30m
            {
                "eval_time": "40m",
                "alertname": "SliMeMachinesUnhealthy",
                "exp_alerts": [alert(objects, "SliMeMachinesUnhealthy", 2, mapping="metal3/md", reason="NodeLost")],
            },
            {
                "eval_time": "40m",
                "alertname": "SliMeRemediationShortCircuited",
                "exp_alerts": [alert(objects, "SliMeRemediationShortCircuited")],
            },
        ],
    }
    assert fire(promtool, tmp_path, objects, test) == ""


def test_service_monitor_scrapes_both_webhooks_metrics_port(objects: list[dict[str, Any]], render: Any) -> None:
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    selector = monitor["spec"]["selector"]
    services = [s for s in by_kind(objects, "Service") if s["metadata"]["name"] in (INJ, SCL)]
    for service in services:
        labels = service["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector["matchLabels"].items())
        (expression,) = selector["matchExpressions"]
        assert labels[expression["key"]] in expression["values"]
        assert any(p["name"] == "metrics" for p in service["spec"]["ports"])
    dashboard_map = one(objects, "ConfigMap", "slime-dashboard")
    assert dashboard_map["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_off_by_default_and_checked_like_other_optional_crds(render: Any) -> None:
    plain = render()
    assert not by_kind(plain, "ServiceMonitor") and not by_kind(plain, "PrometheusRule")
    assert not [c for c in by_kind(plain, "ConfigMap") if c["metadata"]["name"] == "slime-dashboard"]
    with pytest.raises(HelmError) as exc:
        render({"crdCheck": "always", "monitoring": {"serviceMonitor": {"enabled": True}}}, api_versions=CRD_APIS)
    assert (
        "monitoring.serviceMonitor.enabled=true needs the Prometheus Operator (monitoring.coreos.com/v1"
        in exc.value.stderr
    )


def test_a_scaling_only_release_has_no_injection_alerts(render: Any) -> None:
    values = {**ALL_ON, "injection": {"enabled": False}}
    names = [r["alert"] for r in rules(render(values, api_versions=APIS)) if "alert" in r]
    assert "SliMeNoScalingLeader" in names and not [n for n in names if "Injection" in n or "JoinData" in n]
