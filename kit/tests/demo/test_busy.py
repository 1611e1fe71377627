"""``python -m demo.busy``: the demo passes on a machine kept busy by CPU-bound processes.

The full proof is ten runs beside two burners (``python -m demo.busy --runs 10 --burners 2``,
its last result in docs/testing.md); this keeps the command working with one run beside one burner
(the second core is the rest of the suite's: each run and burner more took seconds of CPU from the
other tests). Nothing is timed: a run passes when ``slime-demo`` exits 0.
"""

from __future__ import annotations

import sys

import pytest

from demo.busy import session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_demo_passes_beside_a_cpu_bound_process() -> None:
    lines: list[str] = []
    results = session(1, 1, [sys.executable, "-m", "demo.main"], lines.append)
    assert [r.code for r in results] == [0], "\n".join(lines)
    assert lines[-1].startswith("1/1 runs passed with 1 CPU-bound process(es)")
