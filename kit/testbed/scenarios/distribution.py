"""How the suite's tests are spread over pytest-xdist's workers (``-n 2``, the whole suite's default).

Each real tier runs as one unit on one worker, in collection order, so that the components its
session shares start once (the way Cluster API's e2e shares one management cluster): the
real-Kubernetes tier's control plane and chart stack, the whole loop, the Slurm roots. Every other
test is a unit of its own. The units are dealt in the order of :data:`GROUPS`, longest first, and
the fast tests after them: each worker starts on a real tier, and the fast tests fill in as the
workers run low.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

GROUPS = {  # a directory of kit/tests -> the unit its tests form, longest first (warm: ~14, ~6 and ~4 min)
    "kit/tests/real_loop/": "real-loop",
    "kit/tests/real_slurm/": "real-slurm",
    "kit/tests/real_k8s/": "real-k8s",
}


def group_of(nodeid: str) -> str:
    """The unit a test belongs to ("" for a test of its own)."""
    return next((group for prefix, group in GROUPS.items() if nodeid.startswith(prefix)), "")


def dealing_order(nodeids: list[str]) -> list[int]:
    """The positions of ``nodeids`` in the order the units are dealt: the real tiers in :data:`GROUPS`' order, then
    every other test; collection order within each."""
    rank = {group: index for index, group in enumerate(GROUPS.values())}
    return sorted(range(len(nodeids)), key=lambda i: rank.get(group_of(nodeids[i]), len(rank)))


class TierScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
    """xdist's scope scheduling, a scope being a real tier or else one test, dealt in collection order (the workers
    collect in :func:`dealing_order`)."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid


def make_scheduler(config: Any, log: Any) -> TierScheduling | None:
    """The scheduler for ``--dist load`` (what ``-n`` means by default); other modes are xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    config.option.loadscopereorder = False  # the workers' collection order is the dealing order
    return TierScheduling(config, log)
