"""bench.whole_loop splits the scaling webhook phase at the mirror stored and lists the leader's requests."""

from __future__ import annotations

from bench.whole_loop import webhook_phase
from testbed.scenarios.story import Story
from testbed.scenarios.timeline import ScaleUp


def scale_up(stored_after: float, written_after: float, calls: list[tuple[float, str]]) -> ScaleUp:
    timeline = ScaleUp("4-node job", leader_calls=calls)
    timeline.mark("admitted", 100.0)
    timeline.mark("mirror", 100.0 + stored_after)
    timeline.mark("md", 100.0 + stored_after + written_after)
    return timeline


def test_the_phase_is_split_at_the_mirror_stored_with_the_median_scale_ups_requests() -> None:
    story = Story(
        scale_ups=[
            scale_up(
                0.002, 0.010, [(0.001, "get machinedeployments/scale"), (0.009, "patch machinedeployments/scale")]
            ),
            scale_up(0.004, 0.030, [(0.020, "list machines")]),
            scale_up(0.003, 0.020, [(0.0015, "get machinedeployments/scale")]),
        ]
    )
    untimed = ScaleUp("1-node job")  # a scale-up whose steps were not all seen is left out
    story.scale_ups.append(untimed)

    target, _, line = webhook_phase([story])

    assert "median 23 ms, max 34 ms, p99 34 ms over 3 scale-ups" in target
    assert target.endswith("**missed**.")
    assert "(3 scale-ups" in line
    assert "mirror stored median 3 ms, max 4 ms" in line
    assert "MachineDeployment write median 20 ms, max 30 ms" in line
    median = "in the median scale-up (20 ms; times from the mirror stored): `get machinedeployments/scale` at +1.5 ms"
    assert median in line
    assert "in the slowest (30 ms, 4-node job): `list machines` at +20.0 ms." in line
    assert line.endswith(
        "Where the leader's last request was the write (1 scale-ups): mirror stored → the leader's `PATCH` received "
        "median 9 ms, max 9 ms; that `PATCH` received → answered by the API server median 1 ms, max 1 ms."
    )


def test_the_target_is_met_only_when_the_slowest_of_fewer_than_100_is_within_15_ms() -> None:
    fast = Story(scale_ups=[scale_up(0.002, 0.010, []), scale_up(0.002, 0.012, [])])
    assert webhook_phase([fast])[0].endswith(": met.")
    fast.scale_ups.append(scale_up(0.002, 0.014, []))
    assert webhook_phase([fast])[0].endswith("**missed**.")


def test_no_timed_scale_up_gives_no_line() -> None:
    assert webhook_phase([Story(scale_ups=[ScaleUp("1-node job")])]) == []
