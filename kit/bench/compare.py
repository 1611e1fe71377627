"""Two runs of the main benchmark side by side: ``python3 -m bench.compare BEFORE.json AFTER.json``.

Both files are what ``python3 -m bench --json FILE`` writes (``kit/bench/runs/`` keeps the runs
docs/performance.md was rendered from). For every target measured in both runs it prints the
medians and the ratio after/before: throughput at the throughput connections, p99 at one
connection, server CPU per request; then the handler-only medians and the RSS and time to ready
of the injection service at each Metal3Data count. A ratio compares two runs, maybe on two
machines or two busy moments: the page's own ratios (ours against the baselines of the same
run) are the figures to quote; this shows what moved.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = tuple[str, float | None, float | None]


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def _targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in results.get("targets") or [] if not t.get("skipped")}


def target_rows(before: dict[str, Any], after: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    old, new = _targets(before), _targets(after)
    for name in [n for n in new if n in old]:
        for label, runs, key in (
            ("req/s", "throughput", "rps"),
            ("p99 ms, 1 connection", "latency", "p99_ms"),
            ("CPU µs/request", "throughput", "cpu_us_per_request"),
        ):
            rows.append((f"{name}: {label}", _median(old[name][runs], key), _median(new[name][runs], key)))
    return rows


def handler_rows(before: dict[str, Any], after: dict[str, Any]) -> list[Row]:
    old, new = before.get("handlers") or {}, after.get("handlers") or {}
    return [
        (f"handler {name}: median µs", old[name]["median_us"], value["median_us"])
        for name, value in new.items()
        if isinstance(value, dict) and "median_us" in value and isinstance(old.get(name), dict)
    ]


def rss_rows(before: dict[str, Any], after: dict[str, Any]) -> list[Row]:
    def by_size(results: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
        return {(r["metal3data"], r["templates"]): r for r in results.get("rss") or []}

    old, new = by_size(before), by_size(after)
    rows: list[Row] = []
    for size in [s for s in new if s in old]:
        what = f"{size[0]} Metal3Data / {size[1]} templates"
        rows.append((f"RSS MiB, {what}", old[size]["rss_mib"], new[size]["rss_mib"]))
        rows.append((f"ready s, {what}", old[size].get("ready_s"), new[size].get("ready_s")))
    return rows


def _number(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def _ratio(before: float | None, after: float | None) -> str:
    return f"{after / before:.2f}×" if after is not None and before else "–"


def render(before: dict[str, Any], after: dict[str, Any], names: tuple[str, str]) -> str:
    rows: Iterable[Row] = [
        *target_rows(before, after),
        *handler_rows(before, after),
        *rss_rows(before, after),
    ]
    lines = [
        f"| figure | {names[0]} | {names[1]} | after/before |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {label} | {_number(b)} | {_number(a)} | {_ratio(b, a)} |" for label, b, a in rows]
    return "\n".join(lines)


def _label(path: Path, results: dict[str, Any]) -> str:
    environment = results.get("environment") or {}
    commit = str(environment.get("commit") or "").split(" ")[0]  # "abc1234 + uncommitted changes in …"
    return commit or str(environment.get("date") or path.stem)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="results of the earlier run (python3 -m bench --json FILE)")
    parser.add_argument("after", type=Path, help="results of the later run")
    args = parser.parse_args(argv)
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    print(render(before, after, (_label(args.before, before), _label(args.after, after))))


if __name__ == "__main__":
    main()
