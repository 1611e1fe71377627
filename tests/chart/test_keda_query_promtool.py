"""The default KEDA query, as rendered by the chart, evaluated by a real PromQL engine (promtool).

``promtool test rules`` evaluates an expression on series fixtures (``input_series``) and
compares the result (``promql_expr_test``); no Prometheus server is started. Debian ships it
in the ``prometheus`` package: ``promtool`` from PATH, else the one
:mod:`testbed.components.prometheus` fetches from that package into the cache (``apt-get download``,
nothing installed). Only when neither can be had does the test skip locally, and fail under CI=true.

The query must give one node per job: running + pending once at least T jobs are pending,
else running, and 0 (not "no result") when the series are absent.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.components import slurm_metrics
from testbed.components.prometheus import promtool as find_promtool
from testbed.framework.chart import by_kind, mapping
from testbed.framework.debian import PackagesUnavailable

PARTITION = "batch"
RUNNING, PENDING = "slurm_partition_jobs_running", "slurm_partition_jobs_pending"

# (running, pending, T) -> expected value; None = the series is absent.
CASES = {
    "10-running-1-pending-T1": (10, 1, 1, 11),
    "0-running-0-pending-T1": (0, 0, 1, 0),
    "3-running-0-pending-T1": (3, 0, 1, 3),
    "no-series-at-all-T1": (None, None, 1, 0),
    "2-running-1-pending-T2": (2, 1, 2, 2),
    "2-running-2-pending-T2": (2, 2, 2, 4),
    "only-pending-series-T1": (None, 4, 1, 4),
    "only-running-series-T1": (5, None, 1, 5),
}


@pytest.fixture(scope="module")
def promtool() -> str:
    try:
        return find_promtool()
    except PackagesUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no promtool on PATH and Debian's prometheus package could not be fetched, and CI=true: {exc}")
        pytest.skip(f"no promtool: {exc}")


def rendered_query(render: Any, threshold: int) -> str:
    values = {
        "keda": {"enabled": True, "pendingThreshold": threshold},
        "scaling": {"mappings": [mapping("slime-system/mirror-batch", "metal3/md-batch", PARTITION)]},
    }
    (so,) = by_kind(render(values), "ScaledObject")
    query: str = so["spec"]["triggers"][0]["metadata"]["query"]
    return query


def series(running: int | None, pending: int | None) -> list[dict[str, str]]:
    out = []
    if running is not None:
        out.append({"series": f'{RUNNING}{{partition="{PARTITION}"}}', "values": str(running)})
    if pending is not None:
        out.append({"series": f'{PENDING}{{partition="{PARTITION}"}}', "values": str(pending)})
    # Another partition's jobs must never count.
    out.append({"series": f'{RUNNING}{{partition="other"}}', "values": "100"})
    out.append({"series": f'{PENDING}{{partition="other"}}', "values": "100"})
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_default_query_with_promtool(render: Any, promtool: str, tmp_path: Path, case: str) -> None:
    running, pending, threshold, expected = CASES[case]
    query = rendered_query(render, threshold)
    rules_test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(running, pending),
                "promql_expr_test": [
                    {"expr": query, "eval_time": "0m", "exp_samples": [{"labels": "{}", "value": expected}]}
                ],
            }
        ],
    }
    test_file = tmp_path / "keda-query-test.yaml"
    test_file.write_text(json.dumps(rules_test, indent=2))  # JSON is YAML
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"query {query!r} on {case}:\n{proc.stdout}{proc.stderr}"


def test_promtool_catches_a_wrong_answer(render: Any, promtool: str, tmp_path: Path) -> None:
    """The harness itself: promtool fails when the expected value is wrong (so a pass means something)."""
    rules_test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(10, 1),
                "promql_expr_test": [
                    {
                        "expr": rendered_query(render, 1),
                        "eval_time": "0m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "wrong.yaml"
    test_file.write_text(json.dumps(rules_test))
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "got: {} 1.1E+01" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_thesis_query_was_wrong(promtool: str, tmp_path: Path) -> None:
    """Why the default changed: `PENDING >= T or RUNNING` answers 1 for 10 running + 1 pending."""
    sel = f'{{partition="{PARTITION}"}}'
    old = f"{PENDING}{sel} >= 1 or {RUNNING}{sel}"
    rules_test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(10, 1),
                "promql_expr_test": [
                    {"expr": old, "eval_time": "0m", "exp_samples": [{"labels": f"{PENDING}{sel}", "value": 1}]}
                ],
            }
        ],
    }
    test_file = tmp_path / "thesis.yaml"
    test_file.write_text(json.dumps(rules_test))
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_default_metric_names_are_what_slurm_25_11_serves(render: Any, promtool: str) -> None:
    """The chart's default names are those of Slurm 25.11's /metrics/partitions, in text promtool accepts.

    The text is testbed/components/slurm_metrics.py's, which the whole-loop tier serves to Prometheus in
    place of Slurm >= 25.11's endpoint (names, HELP, TYPE and layout read from SchedMD's slurm-25.11 branch).
    """
    text = slurm_metrics.render(
        slurm_metrics.partition_counts(
            [
                {"job_state": ["PENDING"], "partition": PARTITION, "state_reason": "Resources"},
                {"job_state": ["RUNNING"], "partition": PARTITION, "state_reason": "None"},
            ],
            [PARTITION, "other"],
        )
    )
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    query = rendered_query(render, 1)
    for name in (RUNNING, PENDING):
        assert f"{name}{{partition=" in query
        assert f"# TYPE {name} gauge\n" in text and f'{name}{{partition="{PARTITION}"}} 1\n' in text
