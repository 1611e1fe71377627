"""The whole loop, started once for the session: the whole-loop test and ``slime-demo --real`` tell their stories on
it, one after the other (as ``bench.whole_loop`` runs several on one loop)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.framework.audit import EVIDENCE
from testbed.scenarios.prepare import part
from testbed.scenarios.whole_loop import Loop, whole_loop


@pytest.fixture(scope="session")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    parts = part("whole-loop")
    lines: list[str] = []
    with whole_loop(tmp_path_factory.mktemp("whole-loop"), parts, hosts=4, progress=lines.append) as running:
        print("\n".join(lines))
        try:
            yield running
        finally:
            for name, text in running.logs().items():
                EVIDENCE.add_text(f"whole loop {name}", text)
