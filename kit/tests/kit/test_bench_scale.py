"""``python3 -m bench.scale`` measures what it says, on a world small enough for the fast suite.

Nothing here times anything: it checks that a world settles where the mirrors say, that no busy
node is released, that a steady pass reads Slurm once and writes nothing, and that the page's
section carries every row and the targets' lines (the bench is otherwise only run by hand).
"""

from __future__ import annotations

from pathlib import Path

from bench.scale import render, run_world, tls


def test_a_small_world_settles_releases_no_busy_node_and_renders(tmp_path: Path) -> None:
    with tls(tmp_path) as (cert, key):
        workdir = tmp_path / "world"
        workdir.mkdir()
        result = run_world(workdir, hosts=40, pools=2, unrelated=10, cert=cert, key=key)
    steady, out, scale_in = result.phases
    assert [p.settled for p in result.phases] == [True, True, True]
    assert [p.busy_released for p in result.phases] == [0, 0, 0]
    assert [(p.slurm, p.slurm_writes, p.writes) for p in steady.passes] == [(1, 0, 0)] * 3
    assert out.total("writes") > 0 and scale_in.total("slurm_writes") == 2 * 2 * (20 - 15)  # drain + FUTURE, 5 a pool
    assert result.rss_mib > 0
    text = render([result], "python3 -m bench.scale --hosts 40 --pools 2")
    assert text.count("| 40 | 2 | 10 |") == 3 and "Targets:" in text
