"""``slime-demo --real`` as a person runs it (issue 15): the whole-loop story, its verdict, its figures.

The story itself is checked step by step by test_whole_loop.py; this test proves the command: it
exits 0 only when the story had no problem, prints the timeline, writes the three figure files,
and nothing it prints holds a key (its output joins the session's secret scan).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from demo.main import main
from testbed.audit import EVIDENCE
from testbed.real.components import component
from testbed.real.timeline import STEP_KEYS

pytestmark = [pytest.mark.real_loop, pytest.mark.timeout(1500)]


def test_slime_demo_real_runs_the_story_and_draws_its_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    component("whole-loop")  # built once for the session; skip (locally) or fail (CI) like the other tests
    lines: list[str] = []
    code = main(["--real", "--figures", str(tmp_path / "figures")], out=lines.append)
    errors = capsys.readouterr().err
    EVIDENCE.add_text("slime-demo --real output", "\n".join(lines) + errors)
    assert code == 0, errors + "\n".join(lines[-40:])
    assert any(line.startswith("Real demo complete") for line in lines), lines[-5:]
    timeline = json.loads((tmp_path / "figures" / "timeline.json").read_text())
    assert [s["label"] for s in timeline["scale_ups"]] == [
        "1-node job, pool at 0",
        "4-node job",
        "4-node job after scale-in to 0",
    ]
    for scale_up in timeline["scale_ups"]:
        assert sorted(scale_up["since_submit"]) == sorted(STEP_KEYS), scale_up
    assert (tmp_path / "figures" / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Scale-up: 4-node job after scale-in to 0" in (tmp_path / "figures" / "timeline.txt").read_text()
