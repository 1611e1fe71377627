"""What the real tiers build or fetch, once per session, before their tests need it.

:func:`start` begins the session's builds in a background thread, in the order the tests will
need them: the real-Kubernetes tier's parts first (control plane, CRDs, helm, the image:
:func:`testbed.scenarios.stack.prepare`), then each scenario's parts of :data:`PARTS`. Other tests
run meanwhile. A test that needs a part waits for it (:func:`part`, :func:`ensure`; outside its
own timeout, which only starts with the test's call); a part the thread has not begun is built at
once by the test that needs it. A missing prerequisite is its one-line skip reason locally and
its failure under ``CI=true``. Every build is cached by version under a file lock, so two
processes (two xdist workers, two sessions) never build one thing twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from testbed.components import certmanager
from testbed.components.debian_root import prepare_root
from testbed.framework.gobuild import download_modules
from testbed.framework.pins import SLURM_RELEASES, SlurmRelease
from testbed.framework.prerequisites import unavailable
from testbed.framework.progress import Progress, quiet
from testbed.scenarios import capi, keda, stack, whole_loop

# name -> build(progress) -> what the tests need of it (binaries, a root...). A build raises a
# ComponentUnavailable when a prerequisite is missing.
PARTS: dict[str, Callable[[Progress], Any]] = {
    "cert-manager": certmanager.build,  # controller + cainjector, its CRDs: test_cert_manager.py
    "capi": capi.prepare,  # the CAPI core manager, its CRDs, CAPM3, BMO, the hosts' root: test_capi*.py
    "keda": keda.prepare,  # KEDA, Debian's Prometheus, the Slurm root: test_keda.py
    "whole-loop": whole_loop.prepare,  # all of the above: test_whole_loop.py, test_demo_real.py
}


def _slurm_root(release: SlurmRelease) -> Callable[[Progress], Any]:
    return lambda progress: prepare_root(progress, release=release)


PARTS.update({f"slurm-{release.series}": _slurm_root(release) for release in SLURM_RELEASES.values()})
GO_BUILT_PARTS = {"cert-manager", "capi", "keda", "whole-loop"}  # (and the real-Kubernetes tier's parts)


@dataclass
class Prepared:
    ready: dict[str, Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    done: dict[str, threading.Event] = field(default_factory=lambda: {name: threading.Event() for name in PARTS})
    claimed: set[str] = field(default_factory=set)  # begun, by the thread or by a test
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    progress: Progress = quiet


PREPARED = Prepared()


def _claim(name: str) -> bool:
    with PREPARED.lock:
        if name in PREPARED.claimed:
            return False
        PREPARED.claimed.add(name)
        return True


def _build_part(name: str, progress: Progress) -> None:
    started = time.monotonic()
    try:
        PREPARED.ready[name] = PARTS[name](progress)
    except Exception as exc:  # noqa: BLE001 - reported by every test that needs it
        unavailable_class = type(exc).__name__.endswith("Unavailable")
        (PREPARED.missing if unavailable_class else PREPARED.failed)[name] = f"{type(exc).__name__}: {exc}"
    finally:
        PREPARED.done[name].set()
    state = "ready" if name in PREPARED.ready else "NOT ready"
    progress(f"{name}: {state} after {time.monotonic() - started:.0f} s")


def _build(names: list[str], with_stack: bool, progress: Progress) -> None:
    if with_stack:
        stack.prepare(progress)
    for name in names:
        if _claim(name):
            _build_part(name, progress)


def start(names: list[str], with_stack: bool, progress: Progress) -> None:
    """Begin building ``names`` (after the real-Kubernetes tier's parts, ``with_stack``) in a background thread,
    once."""
    if PREPARED.thread is not None:
        return
    PREPARED.progress = progress
    thread = threading.Thread(target=_build, args=(names, with_stack, progress), name="slime-prepare", daemon=True)
    PREPARED.thread = thread
    thread.start()
    if with_stack or set(names) & GO_BUILT_PARTS:
        threading.Thread(target=download_modules, args=(progress,), name="slime-downloads", daemon=True).start()


def ensure(name: str) -> None:
    """Until ``name`` is built (or could not be): by the thread when it has begun it, else here and now."""
    if _claim(name):
        _build_part(name, PREPARED.progress)
    else:
        PREPARED.done[name].wait()


def ensure_stack() -> None:
    """Until the real-Kubernetes tier's parts are built (their outcome: :data:`testbed.scenarios.stack.PREPARED`)."""
    stack.prepare(PREPARED.progress)


def part(name: str, with_stack: bool = True) -> Any:
    """What ``name``'s build returned (waiting for it); skip (locally) or fail (CI) the test when it could not be had.
    ``with_stack``: the real-Kubernetes tier's parts are needed too."""
    assert name in PARTS, f"{name} is not in testbed/scenarios/prepare.py PARTS"
    if with_stack:
        ensure_stack()
        stack.prepared()
    ensure(name)
    if name in PREPARED.missing:
        unavailable(PREPARED.missing[name])
    if name in PREPARED.failed:
        pytest.fail(f"preparing {name} failed: {PREPARED.failed[name]}", pytrace=False)
    return PREPARED.ready[name]


def main(argv: list[str] | None = None) -> int:
    """``python3 -m testbed.scenarios.prepare [PART...]``: build (or find in the cache) the real-Kubernetes tier's
    parts and the named parts (default: every part), printing progress; 1 when one could not be had."""
    import argparse

    from testbed.framework.progress import to_stderr

    parser = argparse.ArgumentParser(
        prog="python3 -m testbed.scenarios.prepare",
        description="Build (or find in the cache) what the real tiers need: the real-Kubernetes tier's parts and "
        "the named parts (default: every part).",
    )
    parser.add_argument("parts", nargs="*", metavar="PART", help="one of: " + ", ".join(PARTS))
    names = parser.parse_args(argv).parts or list(PARTS)
    unknown = sorted(set(names) - set(PARTS))
    if unknown:
        parser.error(f"no part {', '.join(unknown)}; the parts: {', '.join(PARTS)}")
    _build(names, True, to_stderr)
    problems = {**PREPARED.missing, **PREPARED.failed}
    if stack.PREPARED.missing or stack.PREPARED.error:
        problems["stack"] = stack.PREPARED.missing or stack.PREPARED.error
    for name, problem in problems.items():
        to_stderr(f"{name}: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
