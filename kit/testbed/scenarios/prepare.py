"""What the real tiers build or fetch, once per session, before their tests need it.

:func:`start` begins the session's builds in a background thread as soon as the tests are
collected, in the order the tests will need them: the real-Kubernetes tier's parts first
(control plane, CRDs, helm, the image: :func:`testbed.scenarios.stack.prepare`), then each scenario's
parts of :data:`PARTS`. The fast suite runs meanwhile. A test that needs a part waits for it
(:func:`part`; outside its own timeout, which only starts with the test's call); a missing
prerequisite is its one-line skip reason locally and its failure under ``CI=true``.
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
from testbed.framework.pins import SLURM_RELEASES, SlurmRelease
from testbed.framework.prerequisites import unavailable
from testbed.framework.progress import Progress
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


@dataclass
class Prepared:
    ready: dict[str, Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    done: dict[str, threading.Event] = field(default_factory=lambda: {name: threading.Event() for name in PARTS})
    thread: threading.Thread | None = None


PREPARED = Prepared()


def _build(names: list[str], with_stack: bool, progress: Progress) -> None:
    if with_stack:
        stack.prepare(progress)
    for name in names:
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


def start(names: list[str], with_stack: bool, progress: Progress) -> None:
    """Begin building ``names`` (after the real-Kubernetes tier's parts, ``with_stack``) in a background thread,
    once."""
    if PREPARED.thread is not None:
        return
    for name in set(PARTS) - set(names):
        PREPARED.done[name].set()  # not needed this session
    thread = threading.Thread(target=_build, args=(names, with_stack, progress), name="slime-prepare", daemon=True)
    PREPARED.thread = thread
    thread.start()


def wait_stack() -> None:
    """Until the real-Kubernetes tier's parts are built (their outcome: :data:`testbed.scenarios.stack.PREPARED`)."""
    while PREPARED.thread is not None and not stack.PREPARED.done and PREPARED.thread.is_alive():
        PREPARED.thread.join(1.0)


def wait_part(name: str) -> None:
    """Until ``name`` is built (or could not be)."""
    if PREPARED.thread is not None:
        PREPARED.done[name].wait()


def part(name: str, with_stack: bool = True) -> Any:
    """What ``name``'s build returned (waiting for it); skip (locally) or fail (CI) the test when it could not be had.
    ``with_stack``: the real-Kubernetes tier's parts are needed too."""
    assert name in PARTS, f"{name} is not in testbed/scenarios/prepare.py PARTS"
    if PREPARED.thread is None:  # a session that did not collect the test (a person's run of one module)
        start([name], with_stack, lambda line: None)
    if with_stack:
        wait_stack()
        stack.prepared()
    wait_part(name)
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
