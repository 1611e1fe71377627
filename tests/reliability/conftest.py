"""Fixtures of the reliability suite: real services, captured JSON logs, and the evidence for the key check.

Every log record of the run goes through :class:`common.logs.JsonFormatter` (the services'
production formatter) into :data:`EVIDENCE`, together with every metrics page and every error
message the tests saw. ``test_z_secrets.py`` runs last and searches all of it for the Slurm keys.
The figures (counts, latencies, pickup times) are printed at the end of the run, and written as
JSON to ``$SLIME_RELIABILITY_FIGURES`` when that is set; ``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.logs import JsonFormatter
from injection_webhook.main import build as build_injection
from injection_webhook.settings import InjectionSettings
from kubemu import Emulator
from scaling_webhook.main import build_service
from scaling_webhook.settings import ScalingSettings
from tests.injection.cluster import SlurmCluster, seed_metal3, seed_nodeport, seed_slinky
from tests.scaling.conftest import NAMESPACE, Scaling, config_map, machine_deployment, mirror, wait_for
from tests.support.pki import Pki
from tests.support.service import RunningService, start_service

OPT_IN = {"slurm-controller-namespace": "slurm"}
REPO_ROOT = Path(__file__).resolve().parents[2]


# --- evidence and figures -----------------------------------------------------------------------


@dataclass
class Evidence:
    """What must never contain a Slurm key: log lines, metric pages, error texts."""

    keys: list[bytes] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (where, text)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_key(self, key: bytes) -> None:
        self.keys.append(key)

    def add_text(self, where: str, text: str) -> None:
        with self._lock:
            self.texts.append((where, text))


EVIDENCE = Evidence()
FIGURES: dict[str, Any] = {}


class _EvidenceHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - a formatter failure is itself evidence
            line = f"FORMAT FAILURE {record.getMessage()!r}"
        with EVIDENCE._lock:
            EVIDENCE.log_lines.append(line)


@pytest.fixture(scope="package", autouse=True)
def captured_logs() -> Iterator[Evidence]:
    """Route every record of this package through the production JSON formatter, at INFO (the default level)."""
    handler = _EvidenceHandler(logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    previous = root.level
    client_log = logging.getLogger("httpx")  # the test clients' own request lines: noise, and slow at 20k
    client_previous = client_log.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    client_log.setLevel(logging.WARNING)
    try:
        yield EVIDENCE
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
        client_log.setLevel(client_previous)
        target = os.environ.get("SLIME_RELIABILITY_FIGURES")
        if target and FIGURES:
            Path(target).write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


@pytest.fixture
def figures() -> dict[str, Any]:
    return FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("reliability figures")
        for name in sorted(FIGURES):
            terminalreporter.write_line(f"{name}: {json.dumps(FIGURES[name], sort_keys=True)}")


# --- seeding ------------------------------------------------------------------------------------


def seed_injection_cluster(emu: Emulator, nodeport: bool = True) -> tuple[SlurmCluster, dict[str, Any]]:
    """A Slinky controller in ``slurm`` and an opted-in Metal3 template with one Metal3Data."""
    slurm = seed_slinky(emu)
    EVIDENCE.add_key(slurm.key)
    if nodeport:
        seed_nodeport(emu, "slurm", "slurm")
    _, data = seed_metal3(emu, template_labels=OPT_IN)
    return slurm, data


def seed_scaling_cluster(emu: Emulator) -> Emulator:
    """``slime/mirror-a`` -> ``metal3/md-a`` (2 replicas each), list form."""
    emu.create(mirror("mirror-a", replicas=2))
    emu.create(machine_deployment("md-a", "metal3", replicas=2))
    emu.create(config_map({"mappings": "- mirror: slime/mirror-a\n  machineDeployment: metal3/md-a\n"}))
    return emu


def md_replicas(emu: Emulator, name: str = "md-a", namespace: str = "metal3") -> int | None:
    obj = emu.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", namespace, name)
    return None if obj is None else obj["spec"].get("replicas")


def mirror_replicas(emu: Emulator, name: str = "mirror-a") -> int | None:
    obj = emu.get("apps/v1", "Deployment", NAMESPACE, name)
    return None if obj is None else obj["spec"].get("replicas")


# --- services -----------------------------------------------------------------------------------


def wait_ready(metrics_url: str, timeout: float = 15.0) -> None:
    wait_for(lambda: httpx.get(f"{metrics_url}/readyz", timeout=5).status_code == 200, timeout, "readiness")


@dataclass
class Services:
    """Starts webhooks in this process; at teardown keeps their metrics pages as evidence, then stops them."""

    pki: Pki
    tmp_path: Path
    running: list[RunningService] = field(default_factory=list)

    def _kubeconfig(self, emu: Emulator) -> str:
        return emu.write_kubeconfig(self.tmp_path / f"kubeconfig-{emu.port}-{len(self.running)}")

    def injection(self, emu: Emulator, ready: bool = True, **overrides: Any) -> RunningService:
        values: dict[str, Any] = {"cert_file": str(self.pki.cert_file), "key_file": str(self.pki.key_file)}
        values.update(overrides)
        settings = InjectionSettings(KUBECONFIG=self._kubeconfig(emu), **values)
        service = start_service(build_injection(settings), self.pki.ca_file)
        self.running.append(service)
        if ready:
            wait_ready(service.metrics_url)
        return service

    def scaling(self, emu: Emulator, settle_seconds: float = 0.02, **overrides: Any) -> Scaling:
        values: dict[str, Any] = {
            "cert_file": str(self.pki.cert_file),
            "key_file": str(self.pki.key_file),
            "namespace": NAMESPACE,
            "resync_seconds": 3600,
            "patch_timeout_seconds": 1.0,
        }
        values.update(overrides)
        wired = build_service(ScalingSettings(KUBECONFIG=self._kubeconfig(emu), **values))
        wired.reconciler.settle_seconds = settle_seconds
        running = start_service(wired.runner, self.pki.ca_file)
        self.running.append(running)
        wait_ready(running.metrics_url)
        wait_for(lambda: wired.reconciler.passes >= 1, 10, "the first reconcile pass")
        return Scaling(wired, running, emu)

    def close(self) -> None:
        for service in self.running:
            try:
                EVIDENCE.add_text(f"metrics :{service.metrics_port}", httpx.get(f"{service.metrics_url}/metrics", timeout=5).text)
            except httpx.HTTPError:
                pass
            service.stop()


@pytest.fixture
def services(pki: Pki, tmp_path: Path) -> Iterator[Services]:
    started = Services(pki, tmp_path)
    yield started
    started.close()


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    value = call()
    return value, time.monotonic() - started
