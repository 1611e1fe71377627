"""Load runs: each target a server process under ``wrk``, its throughput, latency, CPU per request and the API calls
it made; the answer checked before and after."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.servers import LOAD_CPU, Server, cpu_seconds, pin, running, say, start_server
from testbed.framework.errors import KitError
from testbed.framework.ports import free_port
from testbed.framework.wait import wait_for

LUA = Path(__file__).with_name("post.lua")


@dataclass
class Run:
    connections: int
    seconds: float
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_request: float
    api_calls: dict[str, int]


def wrk_run(wrk: str, url: str, body_file: Path, connections: int, seconds: float) -> dict[str, Any]:
    taskset = ["taskset", "-c", str(LOAD_CPU)] if pin(LOAD_CPU) and shutil.which("taskset") else []
    command = [*taskset, wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(LUA), url]
    out = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "BENCH_BODY": str(body_file)}, timeout=seconds + 60
    )
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise KitError(f"wrk gave no summary: {out.stdout}\n{out.stderr}")


def api_calls(emu: Any, since: int) -> dict[str, int]:
    """Calls recorded since index ``since``, by "verb resource", excluding long-running watches."""
    calls: dict[str, int] = {}
    for call in emu.requests[since:]:
        if call.verb == "watch":
            continue
        key = f"{call.verb} {call.resource}{'/' + call.subresource if call.subresource else ''}"
        calls[key] = calls.get(key, 0) + 1
    return calls


def measure(wrk: str, server: Server, body_file: Path, emu: Any, connections: int, seconds: float) -> Run:
    since = len(emu.requests)
    cpu_before = cpu_seconds(server.process.pid)
    summary = wrk_run(wrk, server.url, body_file, connections, seconds)
    cpu_after = cpu_seconds(server.process.pid)
    requests = max(summary["requests"], 1)
    errors = sum(summary[k] for k in ("connect", "read", "write", "status", "timeout"))
    elapsed = summary["duration_us"] / 1e6
    return Run(
        connections,
        round(elapsed, 2),
        summary["requests"],
        errors,
        summary["requests"] / elapsed,
        summary["p50_us"] / 1000,
        summary["p99_us"] / 1000,
        (cpu_after - cpu_before) * 1e6 / requests,
        api_calls(emu, since),
    )


@dataclass
class TargetResult:
    name: str
    kind: str  # baseline | ours | extra
    description: str
    throughput: list[Run] = field(default_factory=list)
    latency: list[Run] = field(default_factory=list)
    skipped: str = ""
    check: str = ""

    def median(self, runs: str, attribute: str) -> float:
        values = [getattr(r, attribute) for r in getattr(self, runs)]
        return statistics.median(values) if values else float("nan")


@dataclass
class Target:
    name: str
    kind: str
    description: str
    command: list[str]
    path: str
    body: bytes
    ready: Callable[[Server], bool]
    check: Callable[[dict[str, Any]], str | None]  # None when the answer is the expected one
    env: dict[str, str] = field(default_factory=dict)
    emulator: Any = None  # the API emulator this target talks to, when not the default one


def post_once(server: Server, body: bytes, ca_file: Path) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(ca_file))
    answer = httpx.post(
        server.url, content=body, headers={"Content-Type": "application/json"}, verify=context, timeout=10
    )
    answer.raise_for_status()
    return answer.json()["response"]


def run_target(
    target: Target, args: argparse.Namespace, wrk: str, emu: Any, workdir: Path, ca_file: Path
) -> TargetResult:
    emu = target.emulator or emu
    result = TargetResult(target.name, target.kind, target.description)
    port = free_port()
    command = [c.replace("{port}", str(port)) for c in target.command]
    env = {k: v.replace("{port}", str(port)) for k, v in target.env.items()}
    server = start_server(target.name, command, f"https://127.0.0.1:{port}{target.path}", workdir, env)
    body_file = workdir / f"body-{port}.json"
    body_file.write_bytes(target.body)
    try:
        wait_for(running(server, lambda: target.ready(server)), 60, f"{target.name} to be ready", 0.1)
        # Ready is not yet right: the scaling webhook answers 503 until its watches of the mapped
        # mirror and MachineDeployment have listed. Ask (bounded) until the answer is the expected one.
        answers: list[dict[str, Any]] = []

        def right() -> bool:
            answers.append(post_once(server, target.body, ca_file))
            return not target.check(answers[-1])

        wait_for(right, 30, f"{target.name} to answer as expected", interval=0.2, diagnostics=lambda: str(answers[-1:]))
        say(f"{target.name}: warm-up")
        wrk_run(wrk, server.url, body_file, args.connections, args.warmup)
        for i in range(args.repeats):
            run = measure(wrk, server, body_file, emu, args.connections, args.duration)
            result.throughput.append(run)
            say(
                f"{target.name}: run {i + 1}/{args.repeats}: {run.rps:,.0f} req/s, p50 {run.p50_ms:.2f} ms, "
                f"p99 {run.p99_ms:.2f} ms, "
                f"{run.cpu_us_per_request:.0f} µs CPU/req, errors {run.errors}"
            )
            latency = measure(wrk, server, body_file, emu, 1, args.latency_duration)
            result.latency.append(latency)
            say(f"{target.name}: 1 connection: p50 {latency.p50_ms:.2f} ms, p99 {latency.p99_ms:.2f} ms")
        problem = target.check(post_once(server, target.body, ca_file))
        if problem:
            raise KitError(f"{target.name} answered wrongly after the load: {problem}")
        result.check = "answer checked before and after the load"
    finally:
        server.stop()
    return result
