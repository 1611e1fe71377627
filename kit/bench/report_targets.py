"""The "Targets" section of ``docs/performance.md``: each target judged on one run, and what was measured for a
missed one (every number from that run)."""

from __future__ import annotations

import statistics
from typing import Any

Check = tuple[str, str, str, bool | None, str]  # goal, target, measured, met (None: informative), the target row


def median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs]
    return statistics.median(values) if values else float("nan")


def calls(target: dict[str, Any]) -> dict[str, float]:
    """API calls per admission over a target's runs, by call."""
    runs = target["throughput"] + target["latency"]
    total = sum(r["requests"] for r in runs) or 1
    keys = sorted({k for r in runs for k in r["api_calls"]})
    return {k: sum(r["api_calls"].get(k, 0) for r in runs) / total for k in keys}


def targets_section(results: dict[str, Any], measured: dict[str, Any], rps: dict[str, float]) -> list[str]:
    out = ["## Targets", "", "| target | goal | measured | |", "|---|---|---|---|"]
    checks = targets(results, measured, rps)
    for goal, target, measured_text, met, _name in checks:
        out.append(
            f"| {goal} | {target} | {measured_text} | {'met' if met else '**missed**' if met is False else '–'} |"
        )
    missed = [c for c in checks if c[3] is False]
    out += ["", "### Missed targets: what was measured and why", ""]
    if not missed:
        out.append("None.")
    for goal, _target, _measured, _met, name in missed:
        out.append(f"- **{goal}**: {why(goal, name, results, measured, rps)}")
    out.append("")
    return out


def targets(results: dict[str, Any], measured: dict[str, Any], rps: dict[str, float]) -> list[Check]:
    h = results["handlers"]
    checks: list[Check] = [
        (
            "injection handler median",
            "< 50 µs",
            f"{h['injection']['median_us']:.1f} µs",
            h["injection"]["median_us"] < 50,
            "",
        ),
        (
            "scaling handler median",
            "< 25 µs",
            f"{h['scaling']['median_us']:.1f} µs",
            h["scaling"]["median_us"] < 25,
            "",
        ),
    ]
    checks += _throughput(rps)
    checks += _api_calls(h, measured)
    rss = {r["metal3data"]: r for r in results["rss"] if r["templates"] == r["metal3data"]}
    if 10_000 in rss:
        checks.append(
            (
                "injection RSS with 10,000 Metal3Data (+ 10,000 templates)",
                "≤ 100 MB",
                f"{rss[10_000]['rss_mib']:.1f} MiB",
                rss[10_000]["rss_mib"] * 1.048576 <= 100,
                "",
            )
        )
    return checks


def _throughput(rps: dict[str, float]) -> list[Check]:
    """The throughput targets are the injection webhook's; the scaling webhook has none, so its ratios are shown
    against the same bars, for information."""
    checks: list[Check] = []
    for name in ("injection (warm, patched)", "scaling (unmapped)", "scaling (mapped)"):
        if name not in rps:
            continue
        judged = name.startswith("injection")
        label = "" if judged else " (informative: the scaling webhook has no throughput target)"
        for ref, bar, factor in (("bare FastAPI", "≥ 0.5×", 0.5), ("kopf", "≥ 2×", 2.0)):
            if rps.get(ref):
                ratio = rps[name] / rps[ref]
                checks.append(
                    (
                        f"{name}: throughput vs {ref}{label}",
                        bar,
                        f"{ratio:.2f}× ({rps[name]:,.0f} vs {rps[ref]:,.0f} req/s)",
                        (ratio >= factor) if judged else None,
                        name,
                    )
                )
    if "kopf" not in rps:
        checks.append(("throughput vs kopf", "≥ 2×", "kopf not measured (see its row)", None, ""))
    return checks


def _api_calls(h: dict[str, Any], measured: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    injection = measured.get("injection (warm, patched)")
    if injection:
        total = sum(calls(injection).values())
        checks.append(
            (
                "API calls per warm injection admission",
                "0",
                f"{total:.4f} (HTTP runs) and {h['injection_api_calls']} (handler loop)",
                total == 0 and h["injection_api_calls"] == 0,
                "injection (warm, patched)",
            )
        )
    scaling = measured.get("scaling (mapped)")
    if scaling:
        p99 = median(scaling["latency"], "p99_ms")
        checks.append(
            ("mapped scaling admission p99 (1 conn)", "≤ 10 ms", f"{p99:.2f} ms", p99 <= 10, "scaling (mapped)")
        )
        hot = sum(v for k, v in calls(scaling).items() if not k.startswith("create events"))
        checks.append(
            (
                "API calls per mapped scaling admission (hot path: the caches, one writer afterwards)",
                "0",
                f"{hot:.3f}",
                hot < 0.01,
                "scaling (mapped)",
            )
        )
    return checks


def why(goal: str, name: str, results: dict[str, Any], measured: dict[str, Any], rps: dict[str, float]) -> str:
    """A data-backed explanation for a missed target (every number comes from this run)."""
    if "throughput" in goal:
        return _why_throughput(goal, name, results["handlers"], measured)
    if "handler" in goal:
        return "see the handler-only table; the figure is the median of individually timed calls on this machine."
    if "RSS" in goal:
        return _why_rss(results["rss"])
    if "p99" in goal:
        scaling = measured[name]
        return (
            f"with one connection the p50 is {median(scaling['latency'], 'p50_ms'):.2f} ms and the p99 "
            f"{median(scaling['latency'], 'p99_ms'):.2f} ms; the tail comes from the emulator's PATCH and the noisy "
            "shared CPU."
        )
    return "see the tables above."


def _why_throughput(goal: str, name: str, h: dict[str, Any], measured: dict[str, Any]) -> str:
    ours = measured[name]
    ref = "bare FastAPI" if "FastAPI" in goal else "kopf"
    if ref not in measured:
        return "the reference was not measured."
    cpu_ours = median(ours["throughput"], "cpu_us_per_request")
    cpu_ref = median(measured[ref]["throughput"], "cpu_us_per_request")
    text = (
        f"the server is CPU-bound on its one core, so throughput follows CPU per request: {cpu_ours:,.0f} µs for "
        f"{name} against {cpu_ref:,.0f} µs for {ref}. "
    )
    if name.startswith("injection"):
        return text + _why_injection(ref, h, measured, cpu_ours, cpu_ref)
    if "mapped" in name:
        return text + (
            "A mapped admission is decided from the watch caches with no API call (the leader writes the "
            "MachineDeployment after the admission, not in it); beyond the unmapped path it decodes the whole "
            "review, reads the mirror and the MachineDeployment from the caches and writes an INFO log line."
        )
    return text + (
        "The unmapped path does no API call; the difference is the shared transport (JSON decode/encode, "
        "metrics, logging at debug)."
    )


def _why_injection(ref: str, h: dict[str, Any], measured: dict[str, Any], cpu_ours: float, cpu_ref: float) -> str:
    parts = [
        ("the decision (select + resolve + respond: YAML edit, base64, JSONPatch)", h["injection"]["median_us"]),
        (
            "the JSON decode of the review and encode of the answer",
            h["injection + envelope"]["median_us"] - h["injection"]["median_us"],
        ),
    ]
    if "log line" in h:
        parts.append(
            (
                "the INFO log line every patched admission writes (JsonFormatter + stream write)",
                h["log line"]["median_us"],
            )
        )
    known = sum(v for _, v in parts)
    text = (
        "Measured separately in this run: "
        + "; ".join(f"{label} {v:,.0f} µs" for label, v in parts)
        + f". Together about {known:,.0f} µs"
    )
    if ref == "bare FastAPI":
        rest = cpu_ours - cpu_ref - known
        text += (
            f", and about {max(rest, 0):,.0f} µs remain for the rest of the shared transport (body read loop, "
            "Prometheus histogram, counters and in-flight gauge, the larger response). "
            "Bare FastAPI does none of this: it returns a fixed answer without parsing the body. "
        )
        if "metaData merge" in h:
            text += (
                "Within 50 µs of it would leave 50 µs for all of the work above, while the metaData merge "
                f"alone takes {h['metaData merge']['median_us']:,.0f} µs, "
                f"{h['verification parse']['median_us']:,.0f} µs of it the parse that proves the edited "
                "YAML reads back as the old map plus the join data (kept: an edit is never sent unverified)."
            )
        return text
    text += ". "
    if "bare FastAPI" not in measured:
        return text
    return text + (
        f"kopf parses the review and runs its handler machinery ({cpu_ref:,.0f} µs per request) for a "
        f"handler that allows without reading the object; ours does the full mutation in {cpu_ours:,.0f} "
        f"µs. To be 2× kopf, the injection path would have to fit in about {cpu_ref / 2:,.0f} µs per request, "
        "which is near the bare FastAPI floor measured here "
        f"({median(measured['bare FastAPI']['throughput'], 'cpu_us_per_request'):,.0f} µs) plus the "
        f"{known:,.0f} µs of work listed above."
    )


def _why_rss(runs: list[dict[str, Any]]) -> str:
    rss = [r for r in runs if r["templates"] == r["metal3data"]]
    base, top = rss[0], rss[-1]
    objects = 2 * (top["metal3data"] - base["metal3data"])
    per_rss = (top["rss_mib"] - base["rss_mib"]) * 2**20 / max(1, objects)
    text = (
        f"the process already uses {base['rss_mib']:.0f} MiB with {base['metal3data']} objects: Python, "
        "FastAPI/Starlette, uvicorn, the `kubernetes` client, cryptography and prometheus_client are loaded "
        f"before anything is cached. With {top['metal3data']:,} Metal3Data and as many templates, RSS grows by "
        f"{top['rss_mib'] - base['rss_mib']:.0f} MiB (about {per_rss:,.0f} bytes per object)."
    )
    if "traced_mib" in top and "traced_mib" in base:
        held = top["traced_mib"] - base["traced_mib"]
        text += (
            f" Of that, the resolver holds {held:.0f} MiB (tracemalloc: about "
            f"{held * 2**20 / max(1, objects):,.0f} bytes per object, slim dicts of name, namespace, labels, "
            "owner references, resourceVersion and the template name). The rest is allocator memory left over "
            f"from decoding the initial lists (peak RSS {top['peak_rss_mib']:.0f} MiB), which CPython's allocator "
            "and glibc keep rather than return to the system."
        )
    realistic = [r for r in runs if r["templates"] != r["metal3data"]]
    if realistic:
        r = realistic[-1]
        spread = (
            f" With a more realistic spread ({r['metal3data']:,} Metal3Data over {r['templates']:,} "
            f"templates) RSS is {r['rss_mib']:.0f} MiB"
        )
        over = r["rss_mib"] * 1.048576 > 100
        text += spread + (", which also misses the 100 MB budget." if over else ", within the budget.")
    return text
