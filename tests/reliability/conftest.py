"""Fixtures of the reliability suite: real services, seeded clusters, and the figures of the run.

Every log line, metrics page and error text of the session is evidence for the secret scan
(:data:`testbed.framework.audit.EVIDENCE`, checked at the end of every session). The figures
(counts, latencies, pickup times) are printed at the end of the run, and written as JSON to
``$SLIME_RELIABILITY_FIGURES`` when that is set, by the kit's plugin (:mod:`testbed.scenarios.summary`, which
gathers them from every xdist worker); ``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.framework.pki import Pki
from testbed.scenarios.reliability import FIGURES, Services


@pytest.fixture
def figures() -> dict[str, Any]:
    return FIGURES


@pytest.fixture
def services(pki: Pki, tmp_path: Path) -> Iterator[Services]:
    started = Services(pki, tmp_path)
    yield started
    started.close()
