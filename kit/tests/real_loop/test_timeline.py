"""The timeline model the whole-loop test and ``slime-demo --real`` share (pure; runs in the fast suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.scenarios.timeline import STEP_KEYS, ScaleUp, plot, render


def scale_up(**seconds: float) -> ScaleUp:
    result = ScaleUp("4-node job")
    for step, at in seconds.items():
        result.mark(step, 1_800_000_000 + at)
    return result


IN_ORDER = dict(
    submitted=0, seen=4.1, admitted=9.02, mirror=9.03, md=9.05, machine=9.2, injected=9.9, registered=14.0, started=15.5
)


def test_phases_in_the_thesis_grouping() -> None:
    timeline = scale_up(**IN_ORDER)
    assert timeline.missing() == [] and timeline.out_of_order() == []
    assert [(name, round(value, 3)) for name, value in timeline.phases() if value is not None] == [
        ("KEDA reaction", 9.02),
        ("scaling webhook", 0.03),
        ("Cluster API", 0.15),
        ("provisioning (Metal3, cloud-init)", 4.8),
        ("Slurm scheduling", 1.5),
    ]
    text = render([timeline])
    assert "9.02 s  scaling webhook admitted" in text and "30 ms" in text and "NOT IN ORDER" not in text


def test_out_of_order_and_missing_steps_are_reported() -> None:
    timeline = scale_up(**{**IN_ORDER, "md": 8.0})
    del timeline.at["registered"]
    assert timeline.out_of_order() == [("mirror", "md")]
    assert timeline.missing() == ["registered"]
    assert "NOT IN ORDER: mirror after md; registered not seen" in render([timeline])


def test_a_polled_step_is_in_order_unless_a_later_step_came_before_the_poll_that_missed_it() -> None:
    # KEDA reacted to the demand (admitted at 0.36 s) between the recorder's polls at 0.28 s (no
    # demand yet) and 0.48 s (demand): the order holds. Had the poll at 0.40 s missed it, it would not.
    base = 1_800_000_000
    timeline = scale_up(**{**IN_ORDER, "admitted": 0.36, "mirror": 0.37, "md": 0.38})
    del timeline.at["seen"]
    timeline.mark("seen", base + 0.48, not_before=base + 0.28)
    assert timeline.out_of_order() == []
    late = scale_up(**{**IN_ORDER, "admitted": 0.36, "mirror": 0.37, "md": 0.38})
    del late.at["seen"]
    late.mark("seen", base + 0.48, not_before=base + 0.40)
    assert late.out_of_order() == [("seen", "admitted")]


def test_the_first_sighting_of_a_step_is_kept() -> None:
    timeline = scale_up(submitted=0)
    timeline.mark("submitted", 1_800_000_099)
    assert timeline.since_submit("submitted") == 0
    with pytest.raises(ValueError, match="unknown step 'booted'"):
        timeline.mark("booted", 0)
    assert STEP_KEYS[0] == "submitted" and STEP_KEYS[-1] == "started"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = plot([scale_up(**IN_ORDER), scale_up(**{k: v * 2 for k, v in IN_ORDER.items()})], tmp_path / "timeline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
