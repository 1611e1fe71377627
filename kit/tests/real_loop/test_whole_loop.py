"""The whole loop, real: a job is submitted, KEDA/HPA scale the mirror on the node demand, the scaling
webhook and its leader move the MachineDeployment, Cluster API makes Machines, the injection webhook fills in their
metaData, their slurmd join the real slurmctld, the job starts; then the jobs end and safe scale-in brings the
pool back to 0 without killing anything.

One test drives the story of :func:`testbed.scenarios.story.run_story` (the same one ``slime-demo --real`` runs) and
checks, through :meth:`testbed.scenarios.story.Story.problems`: every step of each scale-up's timeline seen and in
order, a multi-node job given all its nodes, every job completed, no busy host powered off, nothing Slurm needs
lost (a job as big as the pool still accepted at 0), no key in any log. ``SLIME_REAL_LOOP_FIGURES=<dir>`` writes
the timeline (text, JSON, PNG) there; the figures in docs/performance.md come from that.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.scenarios.story import run_story
from testbed.scenarios.timeline import render
from testbed.scenarios.whole_loop import Loop

pytestmark = [pytest.mark.real_loop, pytest.mark.real_parts("whole-loop"), pytest.mark.timeout(1500)]


def test_the_whole_loop(loop: Loop) -> None:
    lines: list[str] = []
    try:
        story = run_story(loop, lines.append)
    finally:
        print("\n".join(lines))
    print(render(story.scale_ups))
    if os.environ.get("SLIME_REAL_LOOP_FIGURES"):
        story.write_figures(Path(os.environ["SLIME_REAL_LOOP_FIGURES"]))
    assert story.problems() == [], "\n".join(story.problems()) + "\n" + render(story.scale_ups)
    assert len(story.scale_ups) == 3 and all(s.since_submit("started") is not None for s in story.scale_ups)
