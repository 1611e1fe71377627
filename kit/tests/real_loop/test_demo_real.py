"""``slime-demo --real`` as a person runs it: the whole-loop story, its verdict, its figures.

The story itself is checked step by step by test_whole_loop.py; this test proves the command: it
exits 0 only when the story had no problem, prints the timeline, writes the three figure files,
and nothing it prints holds a key (its output joins the session's secret scan). It tells its story
on the session's whole loop (``loop``, kit/tests/real_loop/conftest.py), which the command starts
the same way (:func:`testbed.scenarios.whole_loop.whole_loop`) when a person runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from demo.main import main
from testbed.framework.audit import EVIDENCE
from testbed.scenarios.timeline import STEP_KEYS
from testbed.scenarios.whole_loop import Loop

pytestmark = [pytest.mark.real_loop, pytest.mark.real_parts("whole-loop"), pytest.mark.timeout(1500)]


def test_slime_demo_real_runs_the_story_and_draws_its_timeline(
    loop: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines: list[str] = []
    code = main(["--real", "--figures", str(tmp_path / "figures")], out=lines.append, real_loop=loop)
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
