"""How the suite's tests are spread over pytest-xdist's workers (``-n 2``, the whole suite's default).

Each real tier runs as one unit on one worker, in collection order, so that the components its
session shares are started once (the way Cluster API's e2e shares one management cluster): the
real-Kubernetes and whole-loop tiers are one unit (the control plane, the chart's stack, the image),
the real-Slurm tier another. Every other test is a unit of its own. The units go out largest
first, so each worker starts on a real tier at once and the fast tests fill in around them as the
workers run low.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

GROUPS = {  # a directory of kit/tests -> the unit its tests form
    "kit/tests/real_k8s/": "real-kubernetes",
    "kit/tests/real_loop/": "real-kubernetes",
    "kit/tests/real_slurm/": "real-slurm",
}


def group_of(nodeid: str) -> str:
    """The unit a test belongs to ("" for a test of its own)."""
    return next((group for prefix, group in GROUPS.items() if nodeid.startswith(prefix)), "")


class TierScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
    """xdist's scope scheduling, a scope being a real tier or else one test."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid


def make_scheduler(config: Any, log: Any) -> TierScheduling | None:
    """The scheduler for ``--dist load`` (what ``-n`` means by default); other modes are xdist's own."""
    return TierScheduling(config, log) if config.getvalue("dist") == "load" else None
