"""bench.compare puts two saved runs of the main benchmark side by side, with after/before ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_of(commit: str, rps: float, p99_ms: float, rss_mib: float, skipped: str = "") -> dict[str, Any]:
    def runs(**values: float) -> list[dict[str, Any]]:
        return [dict(values), dict(values)]

    return {
        "environment": {"commit": commit, "date": "2026-11-26 03:00 UTC"},
        "targets": [
            {
                "name": "injection (warm, patched)",
                "skipped": skipped,
                "throughput": runs(rps=rps, cpu_us_per_request=100.0, p99_ms=2.0),
                "latency": runs(rps=rps / 4, cpu_us_per_request=100.0, p99_ms=p99_ms),
            },
            {"name": "only before", "skipped": "", "throughput": runs(rps=1.0), "latency": runs(p99_ms=1.0)},
        ],
        "handlers": {"injection": {"median_us": 80.0, "p99_us": 90.0, "calls": 10}, "injection_api_calls": 0},
        "rss": [{"metal3data": 10000, "templates": 10000, "rss_mib": rss_mib, "ready_s": 2.0}],
    }


def compare(tmp_path: Path, before: dict[str, Any], after: dict[str, Any]) -> str:
    files = []
    for name, results in (("before.json", before), ("after.json", after)):
        (tmp_path / name).write_text(json.dumps(results))
        files.append(str(tmp_path / name))
    answer = subprocess.run(
        [sys.executable, "-m", "bench.compare", *files], capture_output=True, text=True, check=True, timeout=60
    )
    return answer.stdout


def test_each_figure_measured_in_both_runs_gets_its_ratio(tmp_path: Path) -> None:
    after = run_of("bbbbbbb + uncommitted changes in x.py", rps=3000.0, p99_ms=0.5, rss_mib=60.0)
    after["targets"].pop()  # a target the later run did not measure has no row
    text = compare(tmp_path, run_of("aaaaaaa", rps=1500.0, p99_ms=1.0, rss_mib=80.0), after)
    lines = text.splitlines()
    assert lines[0] == "| figure | aaaaaaa | bbbbbbb | after/before |"
    assert "| injection (warm, patched): req/s | 1,500 | 3,000 | 2.00× |" in lines
    assert "| injection (warm, patched): p99 ms, 1 connection | 1.00 | 0.50 | 0.50× |" in lines
    assert "| injection (warm, patched): CPU µs/request | 100 | 100 | 1.00× |" in lines
    assert "| handler injection: median µs | 80.00 | 80.00 | 1.00× |" in lines
    assert "| RSS MiB, 10000 Metal3Data / 10000 templates | 80.00 | 60.00 | 0.75× |" in lines
    assert not any("only before" in line for line in lines)


def test_a_target_skipped_in_one_run_is_left_out(tmp_path: Path) -> None:
    skipped = run_of("bbbbbbb", rps=3000.0, p99_ms=0.5, rss_mib=60.0, skipped="answered wrongly")
    text = compare(tmp_path, run_of("aaaaaaa", rps=1500.0, p99_ms=1.0, rss_mib=80.0), skipped)
    assert "injection (warm, patched)" not in text and "RSS MiB" in text
