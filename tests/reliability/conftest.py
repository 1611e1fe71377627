"""Fixtures of the reliability suite: real services, seeded clusters, and the figures of the run.

Every log line, metrics page and error text of the session is evidence for the secret scan
(:data:`testbed.audit.EVIDENCE`, checked at the end of every session). The figures
(counts, latencies, pickup times) are printed at the end of the run, and written as JSON to
``$SLIME_RELIABILITY_FIGURES`` when that is set; ``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.pki import Pki
from testbed.reliability import FIGURES, Services


@pytest.fixture(scope="package", autouse=True)
def figures_file() -> Iterator[None]:
    """Write the figures of this package to ``$SLIME_RELIABILITY_FIGURES`` when it is set."""
    yield
    target = os.environ.get("SLIME_RELIABILITY_FIGURES")
    if target and FIGURES:
        Path(target).write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


@pytest.fixture
def figures() -> dict[str, Any]:
    return FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("reliability figures")
        for name in sorted(FIGURES):
            terminalreporter.write_line(f"{name}: {json.dumps(FIGURES[name], sort_keys=True)}")


@pytest.fixture
def services(pki: Pki, tmp_path: Path) -> Iterator[Services]:
    started = Services(pki, tmp_path)
    yield started
    started.close()
