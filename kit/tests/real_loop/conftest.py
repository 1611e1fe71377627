"""The whole loop, started once for the session: the whole-loop test and ``slime-demo --real`` tell their stories on
it, one after the other (as ``bench.whole_loop`` runs several on one loop)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.framework.audit import EVIDENCE
from testbed.scenarios.prepare import part
from testbed.scenarios.whole_loop import Loop, whole_loop

# The order this tier's tests run in, by the last part each needs: a cold run builds the parts in the order
# the tests need them, so the tests of the quick parts (a Slurm root, cert-manager) run while the long builds
# (CAPI, KEDA) go on, and the whole loop, which needs every part, comes last.
PART_ORDER = ("slurm-26.05", "cert-manager", "capi", "keda", "whole-loop")


def _last_part(item: pytest.Item) -> int:
    needs = [name for marker in item.iter_markers("real_parts") for name in marker.args]
    return max((PART_ORDER.index(name) for name in needs if name in PART_ORDER), default=-1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This tier's tests in :data:`PART_ORDER`, in the places its tests had (the units' dealing order stays)."""
    places = [index for index, item in enumerate(items) if item.get_closest_marker("real_loop")]
    for index, item in zip(places, sorted((items[i] for i in places), key=_last_part), strict=True):
        items[index] = item


@pytest.fixture(scope="session")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    parts = part("whole-loop")
    lines: list[str] = []
    with whole_loop(tmp_path_factory.mktemp("whole-loop"), parts, hosts=4, progress=lines.append) as running:
        print("\n".join(lines))
        try:
            yield running
        finally:
            for name, text in running.logs().items():
                EVIDENCE.add_text(f"whole loop {name}", text)
