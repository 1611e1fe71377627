"""A controller manager run out of cluster, in a network namespace of its own that reaches only the API server.

Cluster API's, CAPM3's and the baremetal-operator's managers (controller-runtime) listen on ports
their releases give no host flag for (the webhook server on ``*:<port>``, health, metrics). So
each runs in a namespace of its own (``slime-<pid>-<n>``, only ``lo`` up, removed on stop and,
when a run died, by the next run's :func:`testbed.real.netns.remove_stale`), with
:mod:`testbed.real.forward` carrying exactly one port in: the API server's, at
``127.0.0.1:<port>`` as outside. Whatever the manager listens on exists only inside that
namespace: nothing outside can reach it, and it can dial nothing but the API server. No webhook
configuration points at these managers (their admission and conversion webhooks are off; the
modules using this say what that loses). The process is stopped by its PID.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import ComponentFailed
from testbed.helm import REPO_ROOT
from testbed.real.controlplane import _LIVE, Ca, ControlPlane, _stop, _write
from testbed.real.netns import _NUMBERS, NETNS_PREFIX, ip, kill_pids, netns_pids

_NETNS: set[str] = set()  # the processes are in testbed.real.controlplane's _LIVE, stopped at exit by PID


@atexit.register
def _remove_leftover_namespaces() -> None:
    for netns in list(_NETNS):
        _delete_netns(netns)


def _delete_netns(netns: str) -> None:
    kill_pids(netns_pids(netns), grace=2.0)
    ip("netns", "delete", netns, check=False)
    _NETNS.discard(netns)


class ManagerFailed(ComponentFailed):
    """A manager did not start or stopped; the message carries the end of its log."""


@dataclass
class IsolatedManager:
    """One manager process (``argv``, ``env``) in its own network namespace; ready when ``ready(log text)`` holds."""

    name: str  # for messages and the log file's name
    argv: Sequence[str]
    cp: ControlPlane
    workdir: Path
    ready: Callable[[str], bool]
    env: Mapping[str, str] = field(default_factory=dict)
    netns: str = ""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    forwarder: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started_seconds: float = 0.0

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def cert_dir(self) -> Path:
        """A serving pair for the manager's webhook server (controller-runtime will not start without one)."""
        return self.workdir / "webhook-certs"

    def start(self, timeout: float = 120.0) -> IsolatedManager:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._netns()
            self._forward()
            self._certificates()
            with open(self.log, "ab") as out:
                self.process = subprocess.Popen(
                    ["ip", "netns", "exec", self.netns, *self.argv],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env},
                    start_new_session=True,
                )
            _LIVE[self.process.pid] = self.process
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.monotonic() - started
        return self

    def _netns(self) -> None:
        self.netns = f"{NETNS_PREFIX}{os.getpid()}-{next(_NUMBERS)}"
        _NETNS.add(self.netns)
        ip("netns", "add", self.netns)
        ip("-n", self.netns, "link", "set", "lo", "up")

    def _forward(self) -> None:
        with open(self.workdir / "forward.log", "ab") as err:
            self.forwarder = subprocess.Popen(
                [sys.executable, "-m", "testbed.real.forward", self.netns, str(self.cp.port), str(os.getpid())],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        _LIVE[self.forwarder.pid] = self.forwarder
        assert self.forwarder.stdout is not None
        line = self.forwarder.stdout.readline().decode().strip()  # "ready", or nothing when it died
        if line != "ready":
            raise ManagerFailed(
                f"the loopback forwarder into {self.netns} did not start: "
                f"{(self.workdir / 'forward.log').read_text()[-500:]}"
            )

    def _certificates(self) -> None:
        """A self-signed serving pair for the webhook server; nobody outside the namespace can call it."""
        self.cert_dir.mkdir(exist_ok=True)
        crt, key = Ca.create(f"{self.name}-webhook-ca").issue(
            f"{self.name}-webhook", dns=("localhost",), ips=("127.0.0.1",), server=True
        )
        _write(self.cert_dir / "tls.crt", crt)
        _write(self.cert_dir / "tls.key", key, private=True)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise ManagerFailed(f"{self.name} exited {self.process.returncode}:\n{self.tail()}")
            if self.ready(self.log.read_text(errors="replace")):
                return
            time.sleep(0.2)
        raise ManagerFailed(f"{self.name} did not get ready within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        for proc in (self.process, self.forwarder):
            if proc is not None:
                _stop(proc, 10.0)
        if self.netns:
            _delete_netns(self.netns)


def klog_workers_started(*controllers: str) -> Callable[[str], bool]:
    """Ready once a klog text log (CAPI's, CAPM3's) said ``Starting workers`` for each of ``controllers``."""

    def ready(text: str) -> bool:
        return all(f'"Starting workers" controller="{name}"' in text for name in controllers)

    return ready


def json_workers_started(*controllers: str) -> Callable[[str], bool]:
    """Ready once a zap JSON log (BMO's) said ``Starting workers`` for each of ``controllers``."""

    def ready(text: str) -> bool:
        started = set()
        for line in text.splitlines():
            with suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("msg") == "Starting workers":
                    started.add(entry.get("controller"))
        return all(name in started for name in controllers)

    return ready
