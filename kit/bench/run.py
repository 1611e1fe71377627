"""The SliMe benchmark: ``python3 -m bench`` (a few minutes; writes ``docs/performance.md``).

One run measures every target with the same load tool (``wrk``), the same dev certificate, the
same machine and the same emulated API server:

- baselines: a raw ASGI app on uvicorn (the floor), a bare FastAPI app, kopf's admission
  server with a trivial handler (the Python peer);
- ours: the injection webhook with warm caches (the full mutation), and the scaling webhook
  on a mapped mirror (one MachineDeployment PATCH per admission) and on an unmapped one.

Each target is a separate server process over TLS (HTTP/1.1 keep-alive), pinned to CPU 0. wrk
and the API emulator (in this process) share CPU 1. Each target gets a throughput run
(``--connections`` connections, default 8) and an unloaded latency run (1 connection), each
``--repeats`` times (default 3); the report gives medians. Server CPU per request comes from
``/proc/<pid>/stat`` (utime + stime) around each run. API calls per admission come from the
emulator's recorded requests.

Also measured: handler-only medians (no HTTP), and the RSS of the injection service with 10,
1,000 and 10,000 cached Metal3Data (plus as many Metal3DataTemplates).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.handlers import handler_only
from bench.load import TargetResult, run_target
from bench.memory import rss_for
from bench.servers import LOAD_CPU, REPO, SERVER_CPU, ensure_kopf, ensure_wrk, pin, say, wrk_version
from bench.targets import targets
from bench.world import seed_world
from certs.devcerts import create_ca, issue_serving_cert
from kubemu import Emulator
from testbed.framework.ports import free_port

RUNS = Path(__file__).with_name("runs")  # the raw results behind docs/performance.md (python3 -m bench.compare)


def environment(wrk: str, kopf_version: str | None) -> dict[str, str]:
    from importlib.metadata import version

    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    packages = {
        name: version(name) for name in ("uvicorn", "fastapi", "starlette", "httptools", "kubernetes", "aiohttp")
    }
    if kopf_version:
        packages["kopf"] = kopf_version
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "affinity": f"servers on CPU {SERVER_CPU}; wrk and the API emulator on CPU {LOAD_CPU}"
        if pin(0)
        else "not pinned (1 CPU)",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "wrk": wrk_version(wrk),
        **packages,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_state(),
    }


def git_state() -> str:
    """The commit measured, and whether the working tree differed from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    files = [line[3:] for line in changed if line.strip()]
    return head + (f" + uncommitted changes in {', '.join(files)}" if files else "")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per throughput run (default 10)")
    parser.add_argument(
        "--latency-duration", type=float, default=5.0, help="seconds per 1-connection latency run (default 5)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per target; medians are reported (default 3)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of unmeasured load first (default 2)")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections for throughput (default 8)")
    parser.add_argument("--handler-calls", type=int, default=50_000, help="timed calls per handler-only figure")
    parser.add_argument(
        "--rss-counts",
        default="10,1000,10000,10000/100",
        help=(
            "Metal3Data counts for the RSS figures; N means N Metal3Data and N templates, N/T spreads N over T "
            "templates"
        ),
    )
    parser.add_argument("--no-extras", action="store_true", help="skip the informative rows (uvloop)")
    parser.add_argument("--only", default="", help="';'-separated target names to run (default: all)")
    parser.add_argument(
        "--output", default=str(REPO / "docs" / "performance.md"), help="Markdown report ('-' for none)"
    )
    parser.add_argument("--json", default="", help="also write the raw results here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 run of 3 s per target, 5k handler calls, RSS at 10 and 1000 (a smoke test)",
    )
    parser.add_argument(
        "--render-only", metavar="RESULTS_JSON", help="re-render the report from a saved results.json; measure nothing"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.latency_duration, args.repeats, args.warmup = 3.0, 2.0, 1, 1.0
        args.handler_calls = 5000
        if args.rss_counts == parser.get_default("rss_counts"):
            args.rss_counts = "10,1000"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.render_only:
        write_report(json.loads(Path(args.render_only).read_text()), args.output)
        return
    wrk = ensure_wrk()
    kopf_version = ensure_kopf()
    if pin(LOAD_CPU):
        os.sched_setaffinity(0, {LOAD_CPU})  # this process runs the emulator: keep it off the servers' CPU
    workdir = Path(tempfile.mkdtemp(prefix="slime-bench-"))
    say(f"work directory {workdir}")
    ca = create_ca(workdir)
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    issue_serving_cert(ca, cert, key, ["localhost"], ["127.0.0.1"])
    results: dict[str, Any] = {
        "environment": {**environment(wrk, kopf_version), "API server": "kubemu in the bench process"},
        "command": "python3 -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "json")},
    }
    with Emulator() as emu:
        results.update(measure_targets(args, emu, wrk, kopf_version, workdir, ca.cert_file))
    results["rss"] = []
    for spec in [c for c in args.rss_counts.split(",") if c]:
        count, _, spread = spec.partition("/")
        templates = int(spread) if spread else int(count)
        say(f"RSS with {int(count)} Metal3Data and {templates} templates")
        results["rss"].append(rss_for(int(count), workdir, cert, key, templates))
        say(json.dumps(results["rss"][-1]))
    save(results, args, workdir)
    write_report(results, args.output)


def measure_targets(
    args: argparse.Namespace, emu: Emulator, wrk: str, kopf_version: str | None, workdir: Path, ca_file: Path
) -> dict[str, Any]:
    """Every chosen target under load, then the handler-only figures: ``targets`` and ``handlers`` of the results."""
    secret = seed_world(emu)
    kubeconfig = emu.write_kubeconfig(workdir / "kubeconfig")
    chosen = targets(workdir / "tls.crt", workdir / "tls.key", kubeconfig, secret, kopf_version, not args.no_extras)
    if args.only:
        wanted = {name.strip() for name in args.only.split(";")}
        chosen = [t for t in chosen if t.name in wanted]
    measured: list[TargetResult] = []
    for target in chosen:
        target.command = [c.replace("{metrics}", str(free_port())) for c in target.command]
        say(f"target: {target.name}")
        try:
            measured.append(run_target(target, args, wrk, emu, workdir, ca_file))
        except RuntimeError as exc:
            say(f"{target.name}: skipped: {exc}")
            measured.append(TargetResult(target.name, target.kind, target.description, skipped=str(exc)))
    if not kopf_version:
        measured.append(
            TargetResult("kopf", "baseline", "kopf admission server", skipped="kopf could not be installed")
        )
    say("handler-only medians")
    handlers = handler_only(emu, workdir, secret, args.handler_calls)
    say(json.dumps(handlers))
    return {"targets": [asdict(t) for t in measured], "handlers": handlers}


def save(results: dict[str, Any], args: argparse.Namespace, workdir: Path) -> None:
    """The raw results: in the work directory, at ``--json``, and (a run for the page) in ``bench/runs``."""
    (workdir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    say(f"raw results in {workdir / 'results.json'}")
    saved = [Path(args.json)] if args.json else []
    if args.output != "-":  # the page's figures keep their raw run, for bench.compare
        RUNS.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
        saved.append(RUNS / f"{stamp}-{results['environment']['commit'].split()[0]}.json")
    for path in saved:
        path.write_text(json.dumps(results, indent=2) + "\n")
        say(f"results saved in {path}")


def write_report(results: dict[str, Any], output: str) -> None:
    from bench.report import render
    from bench.sections import write_head

    text = render(results)
    if output != "-":
        write_head(Path(output), text)
        say(f"wrote {output}")
    print(text)


if __name__ == "__main__":
    main()
