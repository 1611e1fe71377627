"""The suite's distribution over xdist workers and the run's summary, in a real pytest session with two workers.

A throwaway tree with the repository's layout (``kit/tests/real_*`` beside ``tests/``) runs under
``-n 2`` with the kit's plugin: each real tier's tests run on one worker in their order, the two
longest tiers dealt first (one to each worker), and the figures tests add on either worker are
printed once and written, merged, to the file their variable names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testbed.scenarios.distribution import dealing_order, group_of

RECORD = """
import os
from pathlib import Path

from testbed.scenarios import summary


def record(name):
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {name}\\n")
    summary.figures("tried figures", env="TRIED_FIGURES")[name] = 1
"""


def test_real_tiers_are_units_dealt_first_and_everything_else_a_test_of_its_own() -> None:
    nodeids = [
        "tests/reliability/test_faults.py::test_x",
        "kit/tests/kubemu/test_crud.py::test_x",
        "kit/tests/real_k8s/test_chart.py::test_x",
        "kit/tests/real_loop/test_capi.py::test_x",
        "kit/tests/real_slurm/test_join.py::test_x[26.05]",
        "kit/tests/real_loop/test_keda.py::test_x",
    ]
    assert [group_of(n) for n in nodeids] == ["", "", "real-k8s", "real-loop", "real-slurm", "real-loop"]
    assert dealing_order(nodeids) == [3, 5, 4, 2, 0, 1]


def _module(path: Path, prefix: str, count: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tests = "".join(f"\n\ndef test_{prefix}_{i}():\n    record('{prefix}_{i}')\n" for i in range(count))
    path.write_text("from record import record\n" + tests)


def test_each_tier_runs_on_one_worker_in_order_and_the_figures_of_both_workers_are_merged(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests kit/tests\naddopts = -p no:cacheprovider\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["testbed.scenarios.fixtures"]\n')
    (tmp_path / "record.py").write_text(RECORD)
    _module(tmp_path / "kit/tests/real_k8s/test_a.py", "k8s", 4)
    _module(tmp_path / "kit/tests/real_loop/test_b.py", "loop", 3)
    _module(tmp_path / "kit/tests/real_slurm/test_c.py", "slurm", 5)
    _module(tmp_path / "tests/test_fast.py", "fast", 12)
    log, figures = tmp_path / "run.log", tmp_path / "figures.json"
    env = {**os.environ, "RUN_LOG": str(log), "TRIED_FIGURES": str(figures), "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line.split() for line in log.read_text().splitlines()]
    worker = {name: who for who, name in ran}
    order = [name for _, name in ran]
    units = {"loop": 3, "slurm": 5, "k8s": 4}
    for unit, count in units.items():
        tests = [f"{unit}_{i}" for i in range(count)]
        assert len({worker[name] for name in tests}) == 1, f"{unit} ran on both workers: {ran}"
        assert [name for name in order if name in tests] == tests, f"{unit} out of order: {ran}"
    assert worker["loop_0"] != worker["slurm_0"], "the two longest tiers are dealt first, one to each worker"
    assert len(ran) == 24 and {worker[f"fast_{i}"] for i in range(12)} <= {"gw0", "gw1"}
    assert json.loads(figures.read_text()) == {name: 1 for name in order}, "every worker's figures, merged"
    assert result.stdout.count("tried figures") == 1, result.stdout
