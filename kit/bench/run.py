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
import base64
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from testbed import reviews, world
from testbed.ports import free_port

REPO = Path(__file__).resolve().parents[2]
LUA = Path(__file__).with_name("post.lua")
RUNS = Path(__file__).with_name("runs")  # the raw results behind docs/performance.md (python3 -m bench.compare)
CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVER_CPU, LOAD_CPU = 0, 1


def say(message: str) -> None:
    print(f"[bench] {message}", flush=True)


# --- tools --------------------------------------------------------------------------------------


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    say("wrk is not installed; installing it with: apt-get install -y wrk")
    try:
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=True, stdout=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["apt-get", "install", "-y", "wrk"], check=True, stdout=subprocess.DEVNULL)
    found = shutil.which("wrk")
    if not found:
        raise SystemExit(
            "bench: wrk is required and could not be installed; install it (apt-get install -y wrk, brew install wrk) "
            "and retry"
        )
    return found


def ensure_kopf() -> str | None:
    """kopf's version, installing it with pip if needed; None when it cannot be had."""
    try:
        import kopf  # noqa: F401
    except ImportError:
        say("kopf is not installed; installing it with: python3 -m pip install kopf")
        result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "kopf"], capture_output=True, text=True)
        if result.returncode != 0:
            say(f"cannot install kopf; its row is skipped: {result.stderr.strip()[-300:]}")
            return None
    from importlib.metadata import version

    return version("kopf")


def wrk_version(wrk: str) -> str:
    out = subprocess.run([wrk, "-v"], capture_output=True, text=True)
    return (out.stdout + out.stderr).splitlines()[0].split(" [")[0] if (out.stdout + out.stderr) else "wrk"


# --- processes ----------------------------------------------------------------------------------


def injection_command(port: int, metrics: int, cert: Path, key: Path, kubeconfig: str, *extra: str) -> list[str]:
    """The injection webhook as the benchmarks start it: TLS on 127.0.0.1:``port``, metrics on ``metrics``."""
    return [
        sys.executable,
        "-m",
        "injection_webhook.main",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics),
        "--cert-file",
        str(cert),
        "--key-file",
        str(key),
        "--kubeconfig",
        kubeconfig,
        *extra,
    ]


def pin(cpu: int) -> Callable[[], None] | None:
    if (os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory(pid: int) -> dict[str, float]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024  # kB -> MiB
    return values


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    url: str
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_server(name: str, command: list[str], url: str, workdir: Path, env: dict[str, str] | None = None) -> Server:
    log = workdir / f"{name.replace(' ', '-').replace('/', '-')}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=pin(SERVER_CPU),
        )
    return Server(name, process, url, log)


def wait_until(condition: Callable[[], bool], timeout: float, what: str, server: Server | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server is not None and server.process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({server.process.returncode}); see {server.log}")
        with contextlib.suppress(Exception):
            if condition():
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}" + (f"; see {server.log}" if server else ""))


# --- the emulated cluster -----------------------------------------------------------------------


def tcp_nodelay(emu: Any) -> bool:
    """Make sure the emulator's listening socket has TCP_NODELAY (accepted sockets inherit it on Linux).

    Returns True when the bench had to set it. kubemu before commit 48c5a41 bound a socket created
    with ``proto=0``, so asyncio did not set TCP_NODELAY on its connections; its responses (headers,
    then body) met Nagle + delayed ACK and every API call took ~40 ms. kube-apiserver (Go) sets
    TCP_NODELAY on every connection, so the bench sets it when kubemu does not, unless
    ``--kubemu-as-shipped``; the "as shipped" row then shows the difference.
    """
    changed = False
    try:
        for server in emu._server.servers:
            for sock in server.sockets:
                if not sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    changed = True
    except (AttributeError, OSError):
        return False
    return changed


def seed_cluster(emu: Any) -> dict[str, Any]:
    """Slinky + an opted-in Metal3 template and Metal3Data + a mirror mapped to a MachineDeployment."""
    world.seed_slinky(emu)
    world.seed_nodeport(emu, "slurm", "slurm")
    _, data = world.seed_metal3(emu, template_labels={"slurm-controller-namespace": "slurm"})
    world.ensure_namespace(emu, world.SLIME_NAMESPACE)
    for name in ("mirror-a", "unmapped"):
        emu.create(world.mirror(name))
    emu.create(world.machine_deployment("md-a", "metal3", cluster="bm-cluster"))
    emu.create(
        world.config_map(
            {"mappings": "- mirror: slime-system/mirror-a\n  machineDeployment: metal3/md-a\n  maxReplicas: 100\n"}
        )
    )
    return world.metadata_secret(data)


def injection_request(secret: dict[str, Any]) -> dict[str, Any]:
    return {"uid": "bench-injection", **reviews.secret_request(secret)}


def scale_request(name: str, replicas: int) -> dict[str, Any]:
    return {"uid": f"bench-{name}", **reviews.scale_request(world.SLIME_NAMESPACE, name, replicas)}


def review(request: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


# --- load ---------------------------------------------------------------------------------------


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
    raise RuntimeError(f"wrk gave no summary: {out.stdout}\n{out.stderr}")


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

    def calls_per_admission(self, runs: str = "throughput") -> dict[str, float]:
        total = sum(r.requests for r in getattr(self, runs)) or 1
        keys = {k for r in getattr(self, runs) for k in r.api_calls}
        return {k: sum(r.api_calls.get(k, 0) for r in getattr(self, runs)) / total for k in sorted(keys)}


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
        wait_until(lambda: target.ready(server), 60, f"{target.name} to be ready", server)
        # Ready is not yet right: the scaling webhook answers 503 until its watches of the mapped
        # mirror and MachineDeployment have listed. Ask (bounded) until the answer is the expected one.
        deadline = time.monotonic() + 30
        while True:
            answer = post_once(server, target.body, ca_file)
            problem = target.check(answer) if answer else "no answer"
            if not problem:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.name} answered wrongly: {problem}: {answer}")
            time.sleep(0.2)
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
            raise RuntimeError(f"{target.name} answered wrongly after the load: {problem}")
        result.check = "answer checked before and after the load"
    finally:
        server.stop()
    return result


# --- handler-only -------------------------------------------------------------------------------


def per_call(fn: Callable[[], Any], calls: int, warm: int = 2000) -> dict[str, float]:
    """Median and p99 of ``calls`` individually timed calls, in µs."""
    for _ in range(warm):
        fn()
    clock = time.perf_counter_ns
    samples = []
    for _ in range(calls):
        started = clock()
        fn()
        samples.append(clock() - started)
    samples.sort()
    return {
        "median_us": samples[len(samples) // 2] / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
        "calls": calls,
    }


def handler_only(emu: Any, workdir: Path, secret: dict[str, Any], calls: int) -> dict[str, Any]:
    from common.admission import decode_review, encode_review
    from common.kube import local_client
    from injection_webhook.decision import JoinInfo, join_data, select
    from injection_webhook.decision import respond as injection_respond
    from injection_webhook.metadata import merged_metadata
    from injection_webhook.resolver import InjectionResolver
    from injection_webhook.settings import InjectionSettings
    from scaling_webhook.decision import Observed, decide, scale_target
    from scaling_webhook.decision import respond as scaling_respond
    from scaling_webhook.mappings import parse_mappings

    resolver = InjectionResolver(
        local_client(emu.write_kubeconfig(workdir / "kubeconfig-handler")),
        InjectionSettings.model_fields["controller_selector"].default,
        3.0,
    )
    resolver.start()
    try:
        wait_until(lambda: resolver.not_ready_reason() is None, 30, "the resolver caches")
        request = injection_request(secret)
        selected = select(request)
        assert selected is not None
        owner = resolver.check_owner(selected).verified
        assert owner is not None and resolver.resolve(selected, owner, True).__class__.__name__ == "JoinInfo"
        before = len(emu.requests)

        def injection() -> Any:  # as the app: select, verify the owner, resolve, respond
            found = select(request)
            assert found is not None
            verified = resolver.check_owner(found).verified
            assert verified is not None
            return injection_respond(found, resolver.resolve(found, verified))

        assert injection().outcome == "patched"
        results: dict[str, Any] = {"injection": per_call(injection, calls)}
        body = review(request)

        def with_envelope() -> bytes:  # + JSON decode and envelope checks, and the JSON encode of the answer
            decoded = decode_review(body)
            found = select(decoded)
            assert found is not None
            verified = resolver.check_owner(found).verified
            assert verified is not None
            return encode_review(decoded["uid"], injection_respond(found, resolver.resolve(found, verified)))

        results["injection + envelope"] = per_call(with_envelope, calls)
        # The mutation's own parts: the metaData merge, and in it the parse that proves the result reads back
        # as the old map plus the join data (the edit is never sent unverified).
        resolution = resolver.resolve(selected, owner)
        assert isinstance(resolution, JoinInfo)
        entries = join_data(resolution)
        merged = merged_metadata(selected.encoded_metadata, entries)
        assert merged is not None
        rendered = base64.b64decode(merged).decode()
        results["metaData merge"] = per_call(lambda: merged_metadata(selected.encoded_metadata, entries), calls)
        results["verification parse"] = per_call(lambda: yaml.load(rendered, Loader=yaml.CSafeLoader), calls)
        results["injection_api_calls"] = len([c for c in emu.requests[before:] if c.verb != "watch"])
    finally:
        resolver.stop()
    table = parse_mappings(
        {
            "mappings": f"- mirror: {world.SLIME_NAMESPACE}/mirror-a\n  machineDeployment: metal3/md-a\n"
            "  maxReplicas: 100\n"
        },
        world.SLIME_NAMESPACE,
    )
    mapped = scale_request("mirror-a", 3)
    unmapped = scale_request("unmapped", 3)

    observed = Observed(world.mirror("mirror-a", replicas=1), world.machine_deployment("md-a", "metal3"))

    def scaling() -> Any:
        mapping = scale_target(mapped, table)
        assert mapping is not None
        return scaling_respond(decide(mapped, mapping, observed))

    assert scaling().allowed and scale_target(unmapped, table) is None
    results["scaling"] = per_call(scaling, calls)
    results["scaling unmapped"] = per_call(lambda: scale_target(unmapped, table), calls)
    results["log line"] = log_line_cost(workdir, calls)
    return results


def log_line_cost(workdir: Path, calls: int) -> dict[str, float]:
    """One INFO admission log line as ``common.webhook`` writes it, through ``JsonFormatter`` to a file."""
    import logging

    from common.logs import JsonFormatter

    logger = logging.getLogger("bench.admission")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    with (workdir / "log-line.jsonl").open("w") as sink:
        handler = logging.StreamHandler(sink)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
        fields = {
            "webhook": "injection",
            "uid": "0b5c3f0e-bench",
            "decision": "patched",
            "duration_ms": 0.312,
            "kind": "Secret",
            "namespace": "metal3",
            "name": "m3m-0-metadata",
            "operation": "CREATE",
            "dry_run": False,
        }
        try:
            return per_call(lambda: logger.info("admission", extra={"fields": fields}), calls)
        finally:
            logger.removeHandler(handler)


# --- memory -------------------------------------------------------------------------------------


def rss_for(count: int, workdir: Path, cert: Path, key: Path, templates: int | None = None) -> dict[str, Any]:
    """RSS once ready with ``count`` Metal3Data spread over ``templates`` templates (default: one each)."""
    from kubemu import Emulator

    emu = Emulator().start()
    tcp_nodelay(emu)
    try:
        world.seed_slinky(emu)
        templates = count if templates is None else templates
        for i in range(count):
            world.seed_metal3(
                emu, template=f"tmpl-{i % templates}", index=i, template_labels={"slurm-controller-namespace": "slurm"}
            )
        kubeconfig = emu.write_kubeconfig(workdir / f"kubeconfig-rss-{count}")
        port, metrics = free_port(), free_port()
        server = start_server(
            f"injection-rss-{count}",
            injection_command(port, metrics, cert, key, kubeconfig),
            f"https://127.0.0.1:{port}/mutate",
            workdir,
        )
        try:
            started = time.monotonic()
            wait_until(
                lambda: httpx.get(f"http://127.0.0.1:{metrics}/readyz", timeout=5).status_code == 200,
                120,
                f"the injection service with {count} Metal3Data",
                server,
            )
            ready_after = time.monotonic() - started
            time.sleep(1.0)
            values = memory(server.process.pid)
        finally:
            server.stop()
        retained, retained_peak = retained_by_caches(kubeconfig)
    finally:
        emu.stop()
    return {
        "metal3data": count,
        "templates": templates,
        "rss_mib": round(values["VmRSS"], 1),
        "peak_rss_mib": round(values["VmHWM"], 1),
        "ready_s": round(ready_after, 2),
        "traced_mib": round(retained, 1),
        "traced_peak_mib": round(retained_peak, 1),
    }


def retained_by_caches(kubeconfig: str) -> tuple[float, float]:
    """Python memory a resolver keeps once its caches synced, and its peak (tracemalloc, after gc), in MiB.

    Runs in this process, so it counts what the caches hold without the allocator's slack, which
    RSS also contains. The first figure includes the client objects; compare across counts.
    """
    import gc
    import tracemalloc

    from common.kube import local_client
    from injection_webhook.resolver import InjectionResolver
    from injection_webhook.settings import InjectionSettings

    gc.collect()
    tracemalloc.start()
    resolver = InjectionResolver(
        local_client(kubeconfig), InjectionSettings.model_fields["controller_selector"].default, 3.0
    )
    resolver.start()
    try:
        wait_until(lambda: resolver.not_ready_reason() is None, 300, "the in-process resolver caches")
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        resolver.stop()
        tracemalloc.stop()
    return current / 2**20, peak / 2**20


# --- environment ---------------------------------------------------------------------------------


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


# --- main -----------------------------------------------------------------------------------------


def targets(
    cert: Path,
    key: Path,
    kubeconfig: str,
    secret: dict[str, Any],
    kopf_version: str | None,
    extras: bool,
    shipped: tuple[Any, str] | None = None,
) -> list[Target]:
    tls = ["--cert-file", str(cert), "--key-file", str(key)]
    baseline_body = review(injection_request(secret))  # baselines receive the same bytes as the injection webhook

    def tls_ready(server: Server) -> bool:
        with socket.create_connection(("127.0.0.1", int(server.url.split(":")[2].split("/")[0])), timeout=1):
            return True

    def metrics_ready(server: Server) -> bool:
        args = [str(arg) for arg in server.process.args]  # type: ignore[union-attr]
        metrics_port = args[args.index("--metrics-port") + 1]
        return httpx.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status_code == 200

    def allowed(answer: dict[str, Any]) -> str | None:
        return None if answer.get("allowed") is True and "patch" not in answer else "expected a plain allow"

    def patched(answer: dict[str, Any]) -> str | None:
        return (
            None
            if answer.get("allowed") is True and answer.get("patchType") == "JSONPatch"
            else "expected the JSONPatch"
        )

    def scaled(answer: dict[str, Any]) -> str | None:
        return (
            None
            if answer.get("allowed") is True
            and "follows the stored mirror to 3" in (answer.get("status") or {}).get("message", "")
            else "expected a scale"
        )

    service = [sys.executable, "-m"]
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--metrics-port",
        "{metrics}",
        *tls,
        "--kubeconfig",
        kubeconfig,
    ]
    found: list[Target] = [
        Target(
            "raw ASGI",
            "baseline",
            "minimal ASGI callable on uvicorn: reads the body, returns a fixed allowed review",
            [*service, "bench.apps", "raw", "--port", "{port}", *tls],
            "/validate",
            baseline_body,
            tls_ready,
            allowed,
        ),
        Target(
            "bare FastAPI",
            "baseline",
            "one FastAPI POST route: reads the body, returns a fixed allowed review",
            [*service, "bench.apps", "fastapi", "--port", "{port}", *tls],
            "/validate",
            baseline_body,
            tls_ready,
            allowed,
        ),
    ]
    if kopf_version:
        found.append(
            Target(
                "kopf",
                "baseline",
                f"kopf {kopf_version} WebhookServer (aiohttp), @kopf.on.validate handler that allows",
                [*service, "bench.kopf_app"],
                "/trivial",
                baseline_body,
                tls_ready,
                allowed,
                env={"BENCH_PORT": "{port}", "BENCH_CERT": str(cert), "BENCH_KEY": str(key), "KUBECONFIG": kubeconfig},
            )
        )
    found += [
        Target(
            "injection (warm, patched)",
            "ours",
            "Metal3 metaData Secret CREATE: full resolution from the caches and the JSONPatch",
            [*service, "injection_webhook.main", *common],
            "/mutate",
            baseline_body,
            metrics_ready,
            patched,
        ),
        Target(
            "scaling (mapped)",
            "ours",
            (
                "mirror /scale UPDATE of a mapped mirror: decided from the caches, then allow "
                "(the leader writes the MachineDeployment after the admission, not in it)"
            ),
            [
                *service,
                "scaling_webhook.main",
                *common,
                "--namespace",
                world.SLIME_NAMESPACE,
                "--resync-seconds",
                "3600",
            ],
            "/validate",
            review(scale_request("mirror-a", 3)),
            metrics_ready,
            scaled,
        ),
        Target(
            "scaling (unmapped)",
            "ours",
            "/scale UPDATE of a Deployment with no mapping: allow with no call",
            [
                *service,
                "scaling_webhook.main",
                *common,
                "--namespace",
                world.SLIME_NAMESPACE,
                "--resync-seconds",
                "3600",
            ],
            "/validate",
            review(scale_request("unmapped", 3)),
            metrics_ready,
            allowed,
        ),
    ]
    if shipped is not None:
        shipped_emu, shipped_kubeconfig = shipped
        shipped_common = [c if c != kubeconfig else shipped_kubeconfig for c in common]
        found.append(
            Target(
                "scaling (mapped) vs kubemu as shipped",
                "extra",
                "the mapped scaling target against an emulator without TCP_NODELAY (kubemu as it is today): ~40 ms per "
                "API call",
                [
                    *service,
                    "scaling_webhook.main",
                    *shipped_common,
                    "--namespace",
                    world.SLIME_NAMESPACE,
                    "--resync-seconds",
                    "3600",
                ],
                "/validate",
                review(scale_request("mirror-a", 3)),
                metrics_ready,
                scaled,
                emulator=shipped_emu,
            )
        )
    if extras:
        found.append(
            Target(
                "raw ASGI on uvloop",
                "extra",
                "the raw ASGI app on uvloop instead of the stdlib loop (informative)",
                [*service, "bench.apps", "raw", "--loop", "uvloop", "--port", "{port}", *tls],
                "/validate",
                baseline_body,
                tls_ready,
                allowed,
            )
        )
    return found


def main(argv: list[str] | None = None) -> None:
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
    parser.add_argument(
        "--no-extras", action="store_true", help="skip the informative rows (uvloop, kubemu as shipped)"
    )
    parser.add_argument(
        "--kubemu-as-shipped", action="store_true", help="do not set TCP_NODELAY on the emulator (see tcp_nodelay)"
    )
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
    if args.render_only:
        sys.path.insert(0, str(REPO))
        write_report(json.loads(Path(args.render_only).read_text()), args.output)
        return
    if args.quick:
        args.duration, args.latency_duration, args.repeats, args.warmup = 3.0, 2.0, 1, 1.0
        args.handler_calls = 5000
        if args.rss_counts == parser.get_default("rss_counts"):
            args.rss_counts = "10,1000"
    command = "python3 -m bench " + " ".join(argv if argv is not None else sys.argv[1:])

    sys.path.insert(0, str(REPO))
    from certs.devcerts import create_ca, issue_serving_cert
    from kubemu import Emulator

    wrk = ensure_wrk()
    kopf_version = ensure_kopf()
    if pin(LOAD_CPU):
        os.sched_setaffinity(0, {LOAD_CPU})  # this process runs the emulator: keep it off the servers' CPU
    workdir = Path(tempfile.mkdtemp(prefix="slime-bench-"))
    say(f"work directory {workdir}")
    ca = create_ca(workdir)
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    issue_serving_cert(ca, cert, key, ["localhost"], ["127.0.0.1"])

    emu = Emulator().start()
    nodelay = False if args.kubemu_as_shipped else tcp_nodelay(emu)
    shipped = Emulator().start() if nodelay and not args.no_extras else None
    results: dict[str, Any] = {
        "environment": environment(wrk, kopf_version),
        "command": command,
        "kubemu_nodelay": nodelay,
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "json")},
    }
    results["environment"]["API server"] = "kubemu in the bench process" + (
        ", TCP_NODELAY set by the bench" if nodelay else ""
    )
    try:
        secret = seed_cluster(emu)
        kubeconfig = emu.write_kubeconfig(workdir / "kubeconfig")
        shipped_target = None
        if shipped is not None:
            seed_cluster(shipped)
            shipped_target = (shipped, shipped.write_kubeconfig(workdir / "kubeconfig-shipped"))
        chosen = targets(cert, key, kubeconfig, secret, kopf_version, not args.no_extras, shipped_target)
        if args.only:
            wanted = {name.strip() for name in args.only.split(";")}
            chosen = [t for t in chosen if t.name in wanted]
        measured: list[TargetResult] = []
        for target in chosen:
            target.command = [c.replace("{metrics}", str(free_port())) for c in target.command]
            say(f"target: {target.name}")
            try:
                measured.append(run_target(target, args, wrk, emu, workdir, ca.cert_file))
            except RuntimeError as exc:
                say(f"{target.name}: skipped: {exc}")
                measured.append(TargetResult(target.name, target.kind, target.description, skipped=str(exc)))
        if not kopf_version:
            measured.append(
                TargetResult("kopf", "baseline", "kopf admission server", skipped="kopf could not be installed")
            )
        results["targets"] = [asdict(t) for t in measured]
        say("handler-only medians")
        results["handlers"] = handler_only(emu, workdir, secret, args.handler_calls)
        say(json.dumps(results["handlers"]))
    finally:
        emu.stop()
        if shipped is not None:
            shipped.stop()
    results["rss"] = []
    for spec in [c for c in args.rss_counts.split(",") if c]:
        count, _, spread = spec.partition("/")
        templates = int(spread) if spread else int(count)
        say(f"RSS with {int(count)} Metal3Data and {templates} templates")
        results["rss"].append(rss_for(int(count), workdir, cert, key, templates))
        say(json.dumps(results["rss"][-1]))
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
    write_report(results, args.output)


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
