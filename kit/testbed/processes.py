"""Stopping a process the kit started: by its PID, never by name."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import suppress


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to one process we started, then SIGKILL if it is still there after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
