"""Fixtures of the real-Slurm tier: the cached Slurm root (once per session) and one :class:`SlurmSite` per test.

Without root (or another prerequisite) each test of the tier is skipped with a one-line reason,
and fails under ``CI=true`` (:func:`testbed.framework.prerequisites.unavailable`). The figures of the
scale-in simulation are printed at the end of the run ("real Slurm figures") and written as JSON
to ``$SLIME_REAL_SLURM_FIGURES`` when that is set (:mod:`testbed.scenarios.summary`);
``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubemu import Emulator
from testbed.components.debian_root import SlurmRoot
from testbed.components.netns import Network
from testbed.components.services import ScaleWebhookRoute, Scaling
from testbed.framework.pins import DEFAULT_SLURM, SLURM_RELEASES, SlurmRelease
from testbed.framework.pki import Pki
from testbed.scenarios import summary
from testbed.scenarios.prepare import part
from testbed.scenarios.slurm_pool import Pool, make_pool
from testbed.scenarios.slurm_site import Admission, SlurmSite, slurm_site

NODESETS = ("nodeset-a",)  # Slinky v1.3's NodeSet=nodeset-a Feature=nodeset-a, and a partition over it


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module's ``SLURM_RELEASES`` (or a test's ``slurm_releases`` mark) runs each of its tests that use real Slurm
    on each release."""
    marker = metafunc.definition.get_closest_marker("slurm_releases")
    releases = marker.args if marker else getattr(metafunc.module, "SLURM_RELEASES", None)
    if releases and "slurm_release" in metafunc.fixturenames:
        metafunc.parametrize("slurm_release", releases, indirect=True)


FIGURES: dict[str, Any] = summary.figures("real Slurm figures", env="SLIME_REAL_SLURM_FIGURES")


@pytest.fixture
def figures() -> dict[str, Any]:
    return FIGURES


@pytest.fixture
def slurm_release(request: pytest.FixtureRequest) -> SlurmRelease:
    """The Slurm release a test runs on: 26.05 (Slinky v1.3's default) unless the test is parametrized
    with ``slurm_release`` (indirect): the join and scale-in tests also run on 24.11."""
    return SLURM_RELEASES[getattr(request, "param", DEFAULT_SLURM.series)]


@pytest.fixture
def slurm_root(slurm_release: SlurmRelease) -> SlurmRoot:
    """The root with that Slurm (made once, cached across sessions; built in the background while earlier tests
    run, :mod:`testbed.scenarios.prepare`)."""
    root: SlurmRoot = part(f"slurm-{slurm_release.series}", with_stack=False)
    return root


@pytest.fixture
def network(slurm_root: SlurmRoot) -> Iterator[Network]:
    with Network() as net:
        yield net


@pytest.fixture
def site(
    slurm_root: SlurmRoot,
    network: Network,
    emulator_factory: Callable[..., Emulator],
    scale_routes: dict[int, ScaleWebhookRoute],
    pki: Pki,
    tmp_path: Path,
) -> Iterator[SlurmSite]:
    """Real slurmctld + slurmrestd, kubemu seeded with Slinky and CAPM3 objects, the injection webhook admitting
    metaData Secrets."""
    admission = Admission()
    emulator = emulator_factory(admission=admission)
    admission.scale = scale_routes[id(emulator)]
    with slurm_site(slurm_root, network, emulator, admission, pki, tmp_path, nodesets=NODESETS) as site:
        yield site


@pytest.fixture
def pool(site: SlurmSite, scaling_factory: Callable[..., Scaling]) -> Callable[..., Pool]:
    """``pool(n, hosts=(), **safeScaleIn options)``: n real hosts in a MachineDeployment, its mirror, the scaling
    webhook on real slurmrestd."""
    return lambda replicas, hosts=(), **safe: make_pool(site, scaling_factory, replicas, hosts, **safe)
