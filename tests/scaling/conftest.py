"""Fixtures of the scaling webhook suite: seeded emulators and a running service."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubemu import Emulator
from scaling_webhook.main import ScalingService, build_service
from scaling_webhook.settings import ScalingSettings
from tests.support.pki import Pki
from tests.support.service import RunningService, start_service

NAMESPACE = "slime"
CONFIG_MAP = "scaling-webhook-configmap"
CAPI = "cluster.x-k8s.io"


def wait_for(condition: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def mirror(name: str, namespace: str = NAMESPACE, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "pause", "image": "pause"}]}},
        },
    }


def machine_deployment(name: str, namespace: str, replicas: int = 1, version: str = "v1beta1") -> dict[str, Any]:
    return {
        "apiVersion": f"{CAPI}/{version}",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "clusterName": "c1"},
    }


def config_map(data: dict[str, str], name: str = CONFIG_MAP, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def scale_request(
    namespace: str,
    name: str,
    replicas: Any,
    *,
    dry_run: bool = False,
    operation: str = "UPDATE",
    old_replicas: int = 1,
) -> dict[str, Any]:
    """An AdmissionReview request as kube-apiserver sends it for ``PATCH deployments/<name>/scale``."""
    scale_kind = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    resource = {"group": "apps", "version": "v1", "resource": "deployments"}

    def scale(value: Any) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": value},
            "status": {"replicas": old_replicas, "selector": f"app={name}"},
        }

    return {
        "kind": scale_kind,
        "resource": resource,
        "subResource": "scale",
        "requestKind": scale_kind,
        "requestResource": resource,
        "requestSubResource": "scale",
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:keda:keda-operator"},
        "object": scale(replicas),
        "oldObject": scale(old_replicas),
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"},
    }


def md_replicas(emulator: Emulator, namespace: str, name: str) -> int | None:
    obj = emulator.get(f"{CAPI}/v1beta1", "MachineDeployment", namespace, name)
    return None if obj is None else obj["spec"].get("replicas")


def md_events(emulator: Emulator, namespace: str, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    events = [
        e for e in emulator.list("v1", "Event", namespace)
        if e.get("involvedObject", {}).get("name") == name and e.get("involvedObject", {}).get("kind") == "MachineDeployment"
    ]
    return [e for e in events if reason is None or e.get("reason") == reason]


@dataclass
class Scaling:
    """A running scaling webhook plus its wired parts."""

    service: ScalingService
    running: RunningService
    emulator: Emulator

    def review(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.running.review("/validate", request)

    def metrics_text(self) -> str:
        return httpx.get(f"{self.running.metrics_url}/metrics", timeout=5).text

    def metric(self, name: str, labels: str = "") -> float | None:
        prefix = f"{name}{{{labels}}} " if labels else f"{name} "
        for line in self.metrics_text().splitlines():
            if line.startswith(prefix):
                return float(line.split()[-1])
        return None

    def calls(self, **filters: Any) -> list[Any]:
        return [r for r in self.emulator.requests if all(getattr(r, k) == v for k, v in filters.items())]

    def hot_path_calls(self) -> list[Any]:
        """Every request except Event creation (sent off the admission path) and the ConfigMap watch."""
        return [r for r in self.emulator.requests if r.resource not in ("events", "configmaps")]


@pytest.fixture
def seeded(emulator: Emulator) -> Emulator:
    """Two mirrors in ``slime``, each mapped to a MachineDeployment in its own namespace (list form)."""
    emulator.create(mirror("mirror-a", replicas=2))
    emulator.create(mirror("mirror-b", replicas=1))
    emulator.create(machine_deployment("md-a", "metal3", replicas=2))
    emulator.create(machine_deployment("md-b", "metal3-b", replicas=1))
    emulator.create(config_map({"mappings": "- mirror: slime/mirror-a\n  machineDeployment: metal3/md-a\n"
                                            "- mirror: slime/mirror-b\n  machineDeployment: metal3-b/md-b\n"}))
    return emulator


@pytest.fixture
def scaling_factory(pki: Pki, tmp_path: Path) -> Iterator[Callable[..., Scaling]]:
    """Start scaling webhooks against an emulator; all stop after the test."""
    started: list[Scaling] = []

    def start(emulator: Emulator, wait_reconciled: bool = True, settle_seconds: float = 0.02, **options: Any) -> Scaling:
        kubeconfig = emulator.write_kubeconfig(tmp_path / f"kubeconfig-{len(started)}")
        values: dict[str, Any] = {
            "cert_file": str(pki.cert_file),
            "key_file": str(pki.key_file),
            "KUBECONFIG": kubeconfig,
            "namespace": NAMESPACE,
            "resync_seconds": 3600,
            "patch_timeout_seconds": 1.0,
            "log_level": "DEBUG",
        }
        values.update(options)
        service = build_service(ScalingSettings(**values))
        service.reconciler.settle_seconds = settle_seconds
        running = start_service(service.runner, pki.ca_file)
        scaling = Scaling(service, running, emulator)
        started.append(scaling)
        wait_for(lambda: httpx.get(f"{running.metrics_url}/readyz", timeout=5).status_code == 200, what="readiness")
        if wait_reconciled:
            wait_for(lambda: service.reconciler.passes >= 1, what="the first reconcile pass")
        return scaling

    yield start
    for scaling in started:
        scaling.running.stop()


@pytest.fixture
def scaling(seeded: Emulator, scaling_factory: Callable[..., Scaling]) -> Scaling:
    return scaling_factory(seeded)
