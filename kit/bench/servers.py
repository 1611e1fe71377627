"""The benchmarks' processes: the load tools they need, the servers they start (pinned to a CPU), their readiness,
and the injection webhook set up the way every injection benchmark measures it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.world import seed_world
from certs.devcerts import create_ca, issue_serving_cert
from kubemu import Emulator
from testbed.framework.errors import ComponentFailed
from testbed.framework.objects import SLURM_BINDINGS
from testbed.framework.paths import REPO_ROOT as REPO
from testbed.framework.ports import free_port
from testbed.framework.wait import wait_for

CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVER_CPU, LOAD_CPU = 0, 1


def say(message: str) -> None:
    print(f"[bench] {message}", flush=True)


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
        # The bench world's tenant: its Metal3 objects in metal3, its Controller in slurm (the operator's binding).
        "--slurm-bindings",
        SLURM_BINDINGS,
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


def running(server: Server, condition: Callable[[], object]) -> Callable[[], object]:
    """``condition`` for :func:`~testbed.framework.wait.wait_for`: its errors mean "not yet", but a server that
    exited fails the wait at once."""

    def holds() -> object:
        if server.process.poll() is not None:
            raise ComponentFailed(f"{server.name}: the process exited ({server.process.returncode}); see {server.log}")
        try:
            return condition()
        except Exception:  # noqa: BLE001 - not listening yet, not ready yet
            return None

    return holds


@dataclass
class InjectionBench:
    """The injection webhook as a process on 127.0.0.1 against a seeded kubemu, ready; its CA trusted by ``context``."""

    server: Server
    secret: dict[str, Any]  # the metaData Secret CAPM3 would create, for the reviews
    context: ssl.SSLContext
    port: int
    metrics: int
    workdir: Path


@contextlib.contextmanager
def injection_bench(name: str, prefix: str, *extra: str) -> Iterator[InjectionBench]:
    """A dev CA and serving pair, kubemu seeded (:func:`bench.world.seed_world`), the injection webhook started with
    ``extra`` flags and ready; everything stopped at the end."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    ca = create_ca(workdir)
    cert, key = workdir / "tls.crt", workdir / "tls.key"
    issue_serving_cert(ca, cert, key, ["localhost"], ["127.0.0.1"])
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    emu = Emulator().start()
    port, metrics = free_port(), free_port()
    try:
        secret = seed_world(emu)
        command = injection_command(port, metrics, cert, key, emu.write_kubeconfig(workdir / "kubeconfig"), *extra)
        server = start_server(name, command, f"https://127.0.0.1:{port}/mutate", workdir)
        try:
            ready = f"http://127.0.0.1:{metrics}/readyz"
            wait_for(running(server, lambda: httpx.get(ready, timeout=2).status_code == 200), 60, "readiness", 0.1)
            yield InjectionBench(server, secret, context, port, metrics, workdir)
        finally:
            server.stop()
    finally:
        emu.stop()
