"""The whole-loop tier's components (issue 15): each built or fetched once per session, before any test runs.

First what the real-Kubernetes tier needs (control plane, CRDs, image: :func:`testbed.real.story.prepare`),
then each component of :data:`COMPONENTS`. A missing prerequisite is each test's one-line skip reason
locally and its failure under ``CI=true``.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed.real import capi_site, certmanager, keda_site, loop
from testbed.real import story as k8s
from testbed.real.prerequisites import unavailable

Progress = Callable[[str], None]

# name -> prepare(progress) -> what the tests need of it (binaries, a root...). A prepare function
# raises testbed.real.build.BuildUnavailable (or another *Unavailable) when a prerequisite is missing.
COMPONENTS: dict[str, Callable[[Progress], Any]] = {
    # controller + cainjector (built), its CRDs: tests/real_loop/test_cert_manager.py
    "cert-manager": certmanager.build,
    "capi": capi_site.prepare,  # the CAPI core manager (built), its CRDs, the Slurm root: tests/real_loop/test_capi*.py
    "keda": keda_site.prepare,  # KEDA (built), Debian's Prometheus, the Slurm root: tests/real_loop/test_keda.py
    "whole-loop": lambda progress: loop.prepare(
        _scratch(), progress
    ),  # all of the above: tests/real_loop/test_whole_loop.py
}


def _scratch() -> Path:
    """A directory for this session's generated files (the labelled CAPM3 CRD copies), removed at exit."""
    workdir = Path(tempfile.mkdtemp(prefix="slime-loop-crds-"))
    atexit.register(shutil.rmtree, workdir, True)
    return workdir


@dataclass
class Components:
    ready: dict[str, Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


PREPARED = Components()


def prepare_all(config: pytest.Config) -> None:
    """Prepare every component (the tier's ``pytest_collection_finish``)."""
    progress = k8s.progress_writer(config, "real_loop")
    k8s.prepare(progress)
    for name, prepare in COMPONENTS.items():
        started = time.monotonic()
        try:
            PREPARED.ready[name] = prepare(progress)
        except Exception as exc:  # noqa: BLE001 - reported by every test that needs it
            unavailable_class = type(exc).__name__.endswith("Unavailable")
            (PREPARED.missing if unavailable_class else PREPARED.failed)[name] = f"{type(exc).__name__}: {exc}"
        progress(
            f"{name}: {'ready' if name in PREPARED.ready else 'NOT ready'} after {time.monotonic() - started:.0f} s"
        )


def component(name: str) -> Any:
    """What ``name``'s prepare function returned; skip (locally) or fail (CI) the test when it could not be had."""
    k8s.prepared()
    if name in PREPARED.missing:
        unavailable(PREPARED.missing[name])
    if name in PREPARED.failed:
        pytest.fail(f"preparing {name} failed: {PREPARED.failed[name]}", pytrace=False)
    assert name in PREPARED.ready, f"{name} is not in testbed/real/components.py COMPONENTS"
    return PREPARED.ready[name]
