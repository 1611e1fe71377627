"""Fixtures of the real-Slurm tier: the cached Slurm root (once per session) and one :class:`Site` per test.

Without root (or another prerequisite) each test of the tier is skipped with a one-line reason,
and fails under ``CI=true`` (:func:`testbed.real.prerequisites.unavailable`). The figures of the
scale-in simulation are printed at the end of the run ("real Slurm figures") and written as JSON
to ``$SLIME_REAL_SLURM_FIGURES`` when that is set; ``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubemu import Emulator
from testbed.audit import scan_logs
from testbed.pki import Pki
from testbed.ports import free_port
from testbed.real.netns import Network
from testbed.real.prerequisites import unavailable
from testbed.real.slurm import (
    DEFAULT_RELEASE,
    RELEASES,
    Release,
    Slurm,
    SlurmConfig,
    SlurmRoot,
    Unavailable,
    prepare_root,
)
from testbed.real.slurm_pool import Pool, make_pool
from testbed.real.slurm_site import Admission, Site
from testbed.services import ScaleWebhookRoute, Scaling, start_injection
from testbed.world import seed_nodeport, seed_slinky

_ROOTS: dict[str, SlurmRoot | str] = {}
NODESETS = ("nodeset-a",)  # Slinky v1.3's NodeSet=nodeset-a Feature=nodeset-a, and a partition over it


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module's ``SLURM_RELEASES`` (or a test's ``slurm_releases`` mark) runs each of its tests that use real Slurm
    on each release."""
    marker = metafunc.definition.get_closest_marker("slurm_releases")
    releases = marker.args if marker else getattr(metafunc.module, "SLURM_RELEASES", None)
    if releases and "slurm_release" in metafunc.fixturenames:
        metafunc.parametrize("slurm_release", releases, indirect=True)


FIGURES: dict[str, Any] = {}


@pytest.fixture
def figures() -> Iterator[dict[str, Any]]:
    yield FIGURES
    target = os.environ.get("SLIME_REAL_SLURM_FIGURES")
    if target and FIGURES:
        Path(target).write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("real Slurm figures")
        for name in sorted(FIGURES):
            terminalreporter.write_line(f"{name}: {json.dumps(FIGURES[name], sort_keys=True)}")


@pytest.fixture
def slurm_release(request: pytest.FixtureRequest) -> Release:
    """The Slurm release a test runs on: 26.05 (Slinky v1.3's default) unless the test is parametrized
    with ``slurm_release`` (indirect): the join and scale-in tests also run on 24.11."""
    return RELEASES[getattr(request, "param", DEFAULT_RELEASE.series)]


@pytest.fixture
def slurm_root(slurm_release: Release) -> SlurmRoot:
    """The root with that Slurm (made once, cached across sessions); the first test pays for it."""
    if slurm_release.series not in _ROOTS:
        try:
            _ROOTS[slurm_release.series] = prepare_root(release=slurm_release)
        except Unavailable as exc:
            _ROOTS[slurm_release.series] = str(exc)
    found = _ROOTS[slurm_release.series]
    if isinstance(found, str):
        unavailable(found)
        raise AssertionError("unreachable")
    return found


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
) -> Iterator[Site]:
    """Real slurmctld + slurmrestd, kubemu seeded with Slinky and CAPM3 objects, the injection webhook admitting
    metaData Secrets."""
    admission = Admission()
    emulator = emulator_factory(admission=admission)
    admission.scale = scale_routes[id(emulator)]
    cluster = seed_slinky(emulator, host_ip=network.host_address)
    port = free_port(30000, 32767)  # slurmctld's port is the NodePort Service's nodePort, as in the thesis setup
    seed_nodeport(emulator, cluster.namespace, cluster.controller, node_port=port)
    slurm = Slurm(
        slurm_root,
        tmp_path / "slurm",
        SlurmConfig.slinky(slurm_root, network.host_address, port, nodesets=NODESETS),
        slurm_key=cluster.key,
        jwt_key=cluster.jwt_key,
    )  # the keys of Slinky's Secrets
    injection = None
    site = None
    try:
        slurm.start()
        injection = start_injection(emulator.write_kubeconfig(tmp_path / "kubeconfig-injection"), pki)
        admission.injection = injection
        site = Site(emulator, slurm_root, network, slurm, cluster, tmp_path)
        yield site
    finally:
        if site is not None:
            site.close()
            scan_logs("node", site.node_logs())
        if injection is not None:
            injection.stop()
        slurm.close()
        scan_logs("slurm", slurm.logs())


@pytest.fixture
def pool(site: Site, scaling_factory: Callable[..., Scaling]) -> Callable[..., Pool]:
    """``pool(n, hosts=(), **safeScaleIn options)``: n real hosts in a MachineDeployment, its mirror, the scaling
    webhook on real slurmrestd."""
    return lambda replicas, hosts=(), **safe: make_pool(site, scaling_factory, replicas, hosts, **safe)
