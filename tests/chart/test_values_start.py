"""Every value combination the schema allows starts the services: rendered, then run with the rendered args and env.

For each combination (the structural COMBOS, and ones at every bound the schema allows) each
webhook Deployment's container is taken as rendered: its command, args and env (``valueFrom``
resolved as the kubelet would: the pod's namespace and name). First the service's own settings
parser reads exactly that (what the pod would exit 2 on). Then the console script runs as a
process with that env and those args, changed only where the pod differs from this machine: it
listens on 127.0.0.1 and free ports, reads a dev certificate (and CA) instead of the mounted
Secret, and talks to kubemu through a kubeconfig. It must come up ready.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from certs.devcerts import main as dev_certs
from common.cli import ConfigError, parse_settings
from common.settings import ServiceSettings
from injection_webhook.settings import InjectionSettings
from kubemu import Emulator
from scaling_webhook.settings import ScalingSettings
from testbed.framework.chart import COMBOS, NAMESPACE, by_kind, mapping
from testbed.framework.ports import free_port
from testbed.framework.wait import wait_for

SERVICES: dict[str, tuple[type[ServiceSettings], str]] = {
    "injection-webhook": (InjectionSettings, "injection_webhook.main"),
    "scaling-webhook": (ScalingSettings, "scaling_webhook.main"),
}

# At the schema's bounds and in its odder corners: everything here must render and start.
EDGES: dict[str, dict[str, Any]] = {
    "upper-bounds": {
        "logLevel": "error",
        "certPollSeconds": 10,
        "injection": {
            "cacheSyncTimeoutSeconds": 25,
            "port": 65535,
            "metricsPort": 1024,
            "controllerSelector": "app.kubernetes.io/name in (slurmctld, slurm-ctld),!skip,tier!=x",
            "confServer": {"policy": "[2001:db8::1]:65535", "nodeAddresses": ["192.0.2.1", "node-1.example", "::1"]},
            "extraJoinData": ["controller-name", "jwt-key"],
            "templateOptIns": ["controller-name", "jwt-key"],
            "jwtKeySecretNames": ["slurm-auth-jwths256"],
            "slurmBindings": ["metal3=slurm", "*=slurm-site", "metal3-b=workload:slurm"],
            "allowedRequesters": ["system:serviceaccount:capm3-system:capm3-manager", "system:kube-controller-manager"],
        },
        "scaling": {
            "patchTimeoutSeconds": 25,
            "resyncSeconds": 86400,
            "allowedRequesters": ["system:serviceaccount:keda:keda-operator", "system:kube-controller-manager"],
            "mappings": [mapping(f"{NAMESPACE}/mirror-a", "metal3/md-a", maxReplicas=2147483647)],
        },
    },
    "lower-bounds": {
        "logLevel": "DEBUG",
        "certPollSeconds": 0.01,
        "injection": {"cacheSyncTimeoutSeconds": 0.001, "confServer": {"policy": "slurmctld.hpc.example"}},
        "scaling": {"patchTimeoutSeconds": 0.001, "resyncSeconds": 0.5, "allowedRequesters": []},
    },
    # Parsed, not started: the session's RBAC audit holds every call to the chart's default names.
    "long-names": {"scaling": {"configMapName": "a." * 100 + "map", "leaseName": "lease.example"}},
    "policy-service-name": {"injection": {"confServer": {"policy": "service/slurmctld-lb"}}},
    "policy-ipv4-port": {"injection": {"confServer": {"policy": "192.0.2.50:6817"}}},
}
CASES = {**{k: v for k, v in COMBOS.items()}, **EDGES}


def containers(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(pod name, container) of each webhook Deployment."""
    out = []
    for deployment in by_kind(objects, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        for container in spec["containers"]:
            if container.get("command", [""])[0] in SERVICES:
                out.append((f"{deployment['metadata']['name']}-0", container))
    return out


def environment(container: dict[str, Any], pod: str) -> dict[str, str]:
    """The container's env as the kubelet sets it (fieldRefs: the pod's namespace and name)."""
    fields = {"metadata.namespace": NAMESPACE, "metadata.name": pod}
    env = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("case", list(CASES))
def test_the_rendered_settings_parse(render: Callable[..., Any], case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the pod would exit 2 on, read by the service's own parser from exactly what was rendered."""
    found = containers(render(CASES[case]))
    assert found
    for pod, container in found:
        command = container["command"][0]
        settings_type, _ = SERVICES[command]
        for name in [n for n in os.environ if n.startswith("SLIME_") or n in ("KUBECONFIG", "POD_NAMESPACE")]:
            monkeypatch.delenv(name)
        for name, value in environment(container, pod).items():
            monkeypatch.setenv(name, value)
        try:
            parse_settings(settings_type, container.get("args") or [], command)
        except ConfigError as exc:
            pytest.fail(f"{case}: {command} would exit 2: {exc}")


def start(container: dict[str, Any], pod: str, kubeconfig: str, certs: Path) -> tuple[subprocess.Popen[str], int]:
    command = container["command"][0]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SLIME_") and k not in ("KUBECONFIG", "POD_NAMESPACE")
    }
    env.update(environment(container, pod))
    metrics_port = free_port()
    env.update(
        {
            "SLIME_HOST": "127.0.0.1",
            "SLIME_PORT": str(free_port()),
            "SLIME_METRICS_PORT": str(metrics_port),
            "SLIME_CERT_FILE": str(certs / "tls.crt"),
            "SLIME_KEY_FILE": str(certs / "tls.key"),
            "KUBECONFIG": kubeconfig,
        }
    )
    if "SLIME_CLIENT_CA_FILE" in env:
        env["SLIME_CLIENT_CA_FILE"] = str(certs / "ca.crt")
    process = subprocess.Popen(
        [sys.executable, "-m", SERVICES[command][1], *(container.get("args") or [])],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, metrics_port


# Starting processes costs seconds: the combinations that change what the processes do at start.
STARTED = ["defaults", "admission-auth", "slurm-bindings", "upper-bounds", "lower-bounds"]


@pytest.mark.parametrize("case", STARTED)
def test_the_rendered_pods_start(render: Callable[..., Any], case: str, emulator: Emulator, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    dev_certs(["--out", str(certs), "--dns", "localhost"])
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    started = []  # both services at once: each start is mostly the interpreter importing the service
    try:
        for pod, container in containers(render(CASES[case])):
            started.append((container["command"][0], *start(container, pod, kubeconfig, certs)))
        for command, process, metrics_port in started:
            wait_for(functools.partial(settled, process, metrics_port), 60, f"{command} of {case} to be ready")
            assert process.poll() is None, f"{case}: {command} exited: {process.stderr.read()}"  # type: ignore[union-attr]
    finally:
        for _, process, _ in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process, _ in started:
            process.communicate(timeout=30)


def settled(process: subprocess.Popen[str], metrics_port: int) -> bool:
    """Ready (/readyz 200), or gone."""
    if process.poll() is not None:
        return True
    try:
        return httpx.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
