"""The kit's pytest plugin: the fixtures every suite shares, the real tiers' builds, and the session's audits.

Loaded by the repository's ``conftest.py`` (``pytest_plugins``), for ``tests/`` and ``kit/tests`` alike:

- **the fast suite's fixtures**: a dev PKI, kubemu emulators reached through kubeconfigs (their
  deployments' ``/scale`` writes routed to the scaling webhooks started against them, as
  kube-apiserver routes them), a scaling-webhook starter;
- **the session's audits**: every log line of the session is captured through the services'
  production formatter; at the end RBAC is audited over every API call the services made, and
  the logs and texts the tests handed in are scanned for every key the session made;
- **the real tiers' builds**: once the tests are collected, what the selected real tests need is
  built in the background (:mod:`testbed.scenarios.prepare`) while the fast suite runs; each real
  test waits for its parts before its own timeout starts (markers ``real_k8s``, ``real_loop`` with
  ``real_parts(...)``, ``real_slurm``);
- **the real tiers' shared components**: one plain control plane per session (the tests that use
  an API server as it is), one chart stack per session (the story tests).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubemu import Emulator, TlsFiles
from testbed.components.controlplane import ControlPlane
from testbed.components.serve import RunningService, started_services, stop_all
from testbed.components.services import ScaleWebhookRoute, Scaling, StartInjection, start_scaling
from testbed.components.services import start_injection as start_injection_service
from testbed.framework.audit import EVIDENCE, RECORDED_CALLS, EvidenceHandler, audit_rbac, leaks
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.pins import SLURM_RELEASES
from testbed.framework.pki import Pki, make_pki
from testbed.framework.progress import progress_writer
from testbed.framework.world import issued_secrets
from testbed.scenarios import distribution, prepare, summary
from testbed.scenarios.stack import Stack, start_control_plane, start_stack

# --- the session's audits ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def session_audits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Capture every log line of the session; at its end, audit RBAC and scan for leaked secrets.

    Log records go through the services' production JSON formatter at INFO, the services'
    default level. The audits run whatever tests were selected, over what those tests did.
    """
    handler = EvidenceHandler(EVIDENCE)
    root = logging.getLogger()
    client_log = logging.getLogger("httpx")  # the test clients' own request lines: noise
    saved = root.level, client_log.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    client_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        client_log.setLevel(saved[1])
    started = started_services()
    if not started:
        return
    checked = audit_rbac(RECORDED_CALLS, started, tmp_path_factory.mktemp("rbac-audit"))
    secrets = issued_secrets()
    found = leaks(EVIDENCE, secrets)
    assert not found, "secrets leaked:\n" + "\n".join(found[:10])
    assert EVIDENCE.log_lines, f"services ran ({', '.join(sorted(started))}) but no log line was captured"
    summary.line(
        "audits",
        "RBAC audit: "
        + ", ".join(f"{service} {count} distinct call(s)" for service, count in sorted(checked.items()))
        + f" allowed by the chart; secret scan: {len(secrets)} secret(s) over {len(EVIDENCE.log_lines)} log lines "
        f"and {len(EVIDENCE.texts)} texts, 0 leaks",
    )


# --- the fast suite ---------------------------------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def scale_routes() -> dict[int, ScaleWebhookRoute]:
    """Per emulator (by id): the admission route its ``deployments/scale`` writes take to scaling webhooks."""
    return {}


@pytest.fixture
def emulator_factory(
    tmp_path: Path, pki: Pki, scale_routes: dict[int, ScaleWebhookRoute]
) -> Iterator[Callable[..., Emulator]]:
    """Start emulators (a management and a workload cluster, say); all stop after the test.

    A workload cluster serves https (the test PKI's pair), as the kubeconfig Cluster API writes demands.

    Unless a test brings its own ``admission`` hook, a mirror ``/scale`` write through the API goes to the
    scaling webhooks started against that emulator (``scaling_factory``), as kube-apiserver sends it.
    """
    started: list[tuple[Emulator, bool]] = []

    def start(workload: bool = False, **options: object) -> Emulator:
        """``workload=True``: a CAPI workload cluster, whose RBAC comes from its kubeconfig, not our chart."""
        route = ScaleWebhookRoute()
        options.setdefault("admission", route)
        if workload:
            options.setdefault("tls", TlsFiles(str(pki.cert_file), str(pki.key_file), str(pki.ca_file)))
        emulator = Emulator(**options).start()  # type: ignore[arg-type]
        scale_routes[id(emulator)] = route
        started.append((emulator, workload))
        return emulator

    yield start
    for emulator, workload in started:
        emulator.stop()
        if not workload:
            RECORDED_CALLS.extend(emulator.requests)


@pytest.fixture
def emulator(emulator_factory: Callable[..., Emulator]) -> Emulator:
    return emulator_factory()


@pytest.fixture
def kubeconfig(emulator: Emulator, tmp_path: Path) -> str:
    """A kubeconfig file for ``emulator``: services load it exactly as they load a real one."""
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def scaling_factory(
    pki: Pki, tmp_path: Path, scale_routes: dict[int, ScaleWebhookRoute]
) -> Iterator[Callable[..., Scaling]]:
    """Start scaling webhooks against an emulator (each joins its admission route); all stop after the test."""
    started: list[Scaling] = []

    def start(emulator: Emulator, wait_reconciled: bool = True, **options: Any) -> Scaling:
        values: dict[str, Any] = {
            "namespace": SLIME_NAMESPACE,
            "resync_seconds": 3600,
            "patch_timeout_seconds": 1.0,
            "log_level": "DEBUG",
        }
        values.update(options)
        kubeconfig = emulator.write_kubeconfig(tmp_path / f"kubeconfig-{len(started)}")
        scaling = start_scaling(kubeconfig, pki, emulator=emulator, wait_reconciled=wait_reconciled, **values)
        started.append(scaling)
        route = scale_routes.get(id(emulator))
        if route is not None:
            route.add(scaling)
        return scaling

    yield start
    stop_all([scaling.running for scaling in started])


@pytest.fixture
def start_injection(pki: Pki, tmp_path: Path) -> Iterator[StartInjection]:
    running: list[RunningService] = []

    def start(emulator: Emulator, **overrides: Any) -> RunningService:
        kubeconfig = emulator.write_kubeconfig(tmp_path / f"kubeconfig-{emulator.port}")
        service = start_injection_service(kubeconfig, pki, **overrides)
        running.append(service)
        return service

    yield start
    stop_all(running)


# --- the real tiers' builds -------------------------------------------------------------------------------------

_GROUP_NEEDS: dict[str, tuple[bool, list[str]]] = {}  # an xdist unit -> what its tests need, in the order they need it


def _needs(item: pytest.Item) -> tuple[bool, list[str]]:
    """Whether ``item`` needs the real-Kubernetes tier's parts, and which parts of :data:`prepare.PARTS`."""
    with_stack = bool(item.get_closest_marker("real_k8s") or item.get_closest_marker("real_loop"))
    names = [name for marker in item.iter_markers("real_parts") for name in marker.args]
    if item.get_closest_marker("real_slurm"):
        names += [f"slurm-{series}" for series in SLURM_RELEASES]
    return with_stack, names


def _group(item: pytest.Item) -> str:
    return distribution.group_of(item.nodeid)


def _combined(needs: list[tuple[bool, list[str]]]) -> tuple[bool, list[str]]:
    names = list(dict.fromkeys(name for _, parts in needs for name in parts))  # in the order the tests need them
    return any(stack for stack, _ in needs), names


def _worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An xdist worker collects in the order the units are dealt (:func:`distribution.dealing_order`)."""
    if _worker(config):
        order = distribution.dealing_order([item.nodeid for item in items])
        items[:] = [items[i] for i in order]


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each real tier as one unit on one worker (:mod:`testbed.scenarios.distribution`)."""
    return distribution.make_scheduler(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Begin building what the selected real tests need. Alone, at once; on an xdist worker, once the worker starts a
    real tier (it runs the whole tier: :mod:`testbed.scenarios.distribution`): that tier's parts first."""
    if session.config.option.collectonly:
        return
    by_group: dict[str, list[tuple[bool, list[str]]]] = {}
    for item in session.items:
        if group := _group(item):
            by_group.setdefault(group, []).append(_needs(item))
    _GROUP_NEEDS.update({group: _combined(needs) for group, needs in by_group.items()})
    if by_group and not _worker(session.config):
        with_stack, names = _combined([need for needs in by_group.values() for need in needs])
        prepare.start(names, with_stack, progress_writer(session.config))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """A real test waits for its parts before its own timeout starts (the builds run while earlier tests run)."""
    group = _group(item)
    if group and _worker(item.config):  # this unit's parts first, then every other real unit's (this worker may
        # be dealt another unit next; the cache's locks keep the other worker from building one thing again)
        own = _GROUP_NEEDS.get(group, _needs(item))
        with_stack, names = _combined([own, *_GROUP_NEEDS.values()])
        prepare.start(names, with_stack, _worker_progress)
    with_stack, names = _needs(item)
    if with_stack:
        prepare.ensure_stack()
    for name in names:
        prepare.ensure(name)
    yield


def _worker_progress(text: str) -> None:
    """An xdist worker's output is not shown: its progress lines go to the run's summary."""
    summary.line("real components", text)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if _worker(session.config):
        session.config.workeroutput[summary.KEY] = summary.worker_output()  # type: ignore[attr-defined]
    else:
        summary.write_figure_files()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: a worker ended; add its figures and lines to the run's summary."""
    summary.merge(getattr(node, "workeroutput", {}).get(summary.KEY, {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    summary.report(terminalreporter)


# --- the real tiers' shared components --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane for the session, with the upstream CRDs and no webhooks: for the tests that use an API server
    as it is and leave it so (their own namespaces, their releases uninstalled)."""
    cp = start_control_plane(tmp_path_factory.mktemp("control-plane"))
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The chart installed with helm, both webhooks as the chart's pods (:func:`~testbed.scenarios.stack.start_stack`);
    the story tests' stack."""
    stack = start_stack(tmp_path_factory.mktemp("stack"))
    yield stack
    stack.stop_webhooks()
    stack.cp.stop()
