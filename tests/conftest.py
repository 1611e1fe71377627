"""Fixtures shared by every suite: a dev PKI, API emulators reached through kubeconfigs, a
scaling-webhook starter, and the end-of-session audits (RBAC and secrets, tests/support/audit.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubemu import Emulator, TlsFiles
from testbed.audit import EVIDENCE, RECORDED_CALLS, EvidenceHandler, audit_rbac, leaks
from testbed.pki import Pki, make_pki
from testbed.serve import RunningService, started_services
from testbed.services import ScaleWebhookRoute, Scaling, StartInjection, start_scaling
from testbed.services import start_injection as start_injection_service
from testbed.world import SLIME_NAMESPACE, issued_secrets

# The real tiers' shared fixtures (control_plane, stack) live in the kit.
pytest_plugins = ["testbed.real.fixtures"]

AUDIT_SUMMARY: list[str] = []


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
    AUDIT_SUMMARY.append(
        "RBAC audit: "
        + ", ".join(f"{service} {count} distinct call(s)" for service, count in sorted(checked.items()))
        + f" allowed by the chart; secret scan: {len(secrets)} secret(s) over {len(EVIDENCE.log_lines)} log lines "
        f"and {len(EVIDENCE.texts)} texts, 0 leaks"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in AUDIT_SUMMARY:
        terminalreporter.write_line(line)


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
        scaling = start_scaling(
            emulator.write_kubeconfig(tmp_path / f"kubeconfig-{len(started)}"),
            pki,
            emulator=emulator,
            wait_reconciled=wait_reconciled,
            ready_timeout=5.0,
            **values,
        )
        started.append(scaling)
        route = scale_routes.get(id(emulator))
        if route is not None:
            route.add(scaling)
        return scaling

    yield start
    for scaling in started:
        scaling.running.stop()


@pytest.fixture
def start_injection(pki: Pki, tmp_path: Path) -> Iterator[StartInjection]:
    running: list[RunningService] = []

    def start(emulator: Emulator, **overrides: object) -> RunningService:
        kubeconfig = emulator.write_kubeconfig(tmp_path / f"kubeconfig-{emulator.port}")
        service = start_injection_service(kubeconfig, pki, **overrides)
        running.append(service)
        return service

    yield start
    for service in running:
        service.stop()
