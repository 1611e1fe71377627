"""A controller manager run out of cluster, in a network namespace of its own that reaches only the API server.

Cluster API's, CAPM3's and the baremetal-operator's managers (controller-runtime) listen on ports
their releases give no host flag for (the webhook server on ``*:<port>``, health, metrics). So
each runs in a namespace of its own (``slime-<pid>-<n>``, only ``lo`` up, removed on stop and,
when a run died, by the next run's :func:`testbed.components.netns.remove_stale`), with
:mod:`testbed.components.forward` carrying exactly one port in: the API server's, at
``127.0.0.1:<port>`` as outside. Whatever the manager listens on exists only inside that
namespace: nothing outside can reach it, and it can dial nothing but the API server. No webhook
configuration points at these managers (their admission and conversion webhooks are off; the
modules using this say what that loses). The process is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from testbed.components.controlplane import ControlPlane
from testbed.components.netns import delete_namespace, new_namespace
from testbed.framework.errors import ComponentFailed
from testbed.framework.paths import REPO_ROOT
from testbed.framework.pki import Ca, write_pair
from testbed.framework.processes import spawn, stop_process, tail, wait_started


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

    def start(self, timeout: float | str = "controller-start") -> IsolatedManager:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.netns = new_namespace()
            self._forward()
            self._certificates()
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env}
            self.process = spawn(["ip", "netns", "exec", self.netns, *self.argv], self.log, env=env)
            wait_started(self.process, self._logged_ready, timeout, self.name, self.log)
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.monotonic() - started
        return self

    def _forward(self) -> None:
        argv = [sys.executable, "-m", "testbed.components.forward", self.netns, str(self.cp.port), str(os.getpid())]
        log = self.workdir / "forward.log"
        self.forwarder = spawn(argv, log, cwd=REPO_ROOT, stdout=subprocess.PIPE)
        assert self.forwarder.stdout is not None
        line = self.forwarder.stdout.readline().decode().strip()  # "ready", or nothing when it died
        if line != "ready":
            raise ManagerFailed(f"the loopback forwarder into {self.netns} did not start: {tail(log)}")

    def _certificates(self) -> None:
        """A self-signed serving pair for the webhook server; nobody outside the namespace can call it."""
        ca = Ca.create(f"{self.name}-webhook-ca")
        pair = ca.issue(f"{self.name}-webhook", dns=("localhost",), ips=("127.0.0.1",), server=True)
        write_pair(self.cert_dir, "tls", pair)

    def _logged_ready(self) -> bool:
        return self.ready(self.log.read_text(errors="replace"))

    def tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        for proc in (self.process, self.forwarder):
            if proc is not None:
                stop_process(proc, 10.0)
        if self.netns:
            delete_namespace(self.netns)


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
