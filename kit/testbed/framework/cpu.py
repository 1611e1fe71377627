"""CPU-bound processes that compete for the machine: the demo's busy runs and the benches' loaded series."""

from __future__ import annotations

import subprocess
import sys


def burner(seconds: float) -> subprocess.Popen[bytes]:
    """One process that keeps a CPU busy for ``seconds`` at most (pure Python arithmetic, no I/O)."""
    code = f"import time\nend = time.monotonic() + {seconds:.0f}\nx = 0\nwhile time.monotonic() < end:\n    x += 1\n"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
