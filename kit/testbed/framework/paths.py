"""Where the kit reads and writes: the checkout, the build cache outside it, and the cache's file locks.

Builds and fetched artifacts go to :func:`cache_root`, one directory per name, version and hash
of what decides the build, so a fresh clone on the same machine reuses them and a change of pins
builds anew. :func:`locked` gives one builder per cache entry across processes (two sessions may
start at once); :data:`HEAVY_BUILD_LOCK` lets one heavy build run at a time on the machine.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]  # the source checkout the kit runs from
STACK = REPO_ROOT / "kit" / "stack"  # the Go modules the real components are built from
# $SLIME_REAL_CHART: install another copy of the chart (e.g. a deliberately broken one, docs/testing.md).
CHART = Path(os.environ.get("SLIME_REAL_CHART") or REPO_ROOT / "charts" / "slime")
HEAVY_BUILD_LOCK = "heavy-build"  # every go build (two at once on 2 cores take longer than one after the other)


def cache_root() -> Path:
    """``$SLIME_REAL_CACHE``, else ``$XDG_CACHE_HOME/slime/real``, else ``~/.cache/slime/real``."""
    explicit = os.environ.get("SLIME_REAL_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slime" / "real"


@contextmanager
def locked(name: str) -> Iterator[None]:
    """Hold the cache's file lock ``name`` (across processes) for the ``with`` block."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
