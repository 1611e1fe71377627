"""The targets of the main benchmark: the baselines (raw ASGI, bare FastAPI, kopf) and ours (both webhooks)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import httpx

from bench.load import Target
from bench.servers import Server
from bench.world import injection_request, review, scale_request
from testbed.framework import objects


def tls_ready(server: Server) -> bool:
    with socket.create_connection(("127.0.0.1", int(server.url.split(":")[2].split("/")[0])), timeout=1):
        return True


def metrics_ready(server: Server) -> bool:
    args = [str(arg) for arg in server.process.args]  # type: ignore[union-attr]
    metrics_port = args[args.index("--metrics-port") + 1]
    return httpx.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status_code == 200


def allowed(answer: dict[str, Any]) -> str | None:
    return None if answer.get("allowed") is True and "patch" not in answer else "expected a plain allow"


def patched(answer: dict[str, Any]) -> str | None:
    return (
        None if answer.get("allowed") is True and answer.get("patchType") == "JSONPatch" else "expected the JSONPatch"
    )


def scaled(answer: dict[str, Any]) -> str | None:
    message = (answer.get("status") or {}).get("message", "")
    return None if answer.get("allowed") is True and "follows the stored mirror to 3" in message else "expected a scale"


SERVICE = [sys.executable, "-m"]


def baselines(tls: list[str], body: bytes, env: dict[str, str], kopf_version: str | None) -> list[Target]:
    """The floor (a raw ASGI app), a bare FastAPI app, kopf's admission server."""
    found = [
        Target(
            "raw ASGI",
            "baseline",
            "minimal ASGI callable on uvicorn: reads the body, returns a fixed allowed review",
            [*SERVICE, "bench.apps", "raw", "--port", "{port}", *tls],
            "/validate",
            body,
            tls_ready,
            allowed,
        ),
        Target(
            "bare FastAPI",
            "baseline",
            "one FastAPI POST route: reads the body, returns a fixed allowed review",
            [*SERVICE, "bench.apps", "fastapi", "--port", "{port}", *tls],
            "/validate",
            body,
            tls_ready,
            allowed,
        ),
    ]
    if kopf_version:
        description = f"kopf {kopf_version} WebhookServer (aiohttp), @kopf.on.validate handler that allows"
        kopf = [*SERVICE, "bench.kopf_app"]
        found.append(Target("kopf", "baseline", description, kopf, "/trivial", body, tls_ready, allowed, env=env))
    return found


def ours(common: list[str], body: bytes) -> list[Target]:
    """The injection webhook with warm caches, the scaling webhook on a mapped and on an unmapped mirror."""
    scaling = [*SERVICE, "scaling_webhook.main", *common, "--namespace", objects.SLIME_NAMESPACE]
    scaling += ["--resync-seconds", "3600"]
    return [
        Target(
            "injection (warm, patched)",
            "ours",
            "Metal3 metaData Secret CREATE: full resolution from the caches and the JSONPatch",
            [*SERVICE, "injection_webhook.main", *common, "--slurm-bindings", objects.SLURM_BINDINGS],
            "/mutate",
            body,
            metrics_ready,
            patched,
        ),
        Target(
            "scaling (mapped)",
            "ours",
            (
                "mirror /scale UPDATE of a mapped mirror: decided from the caches, then allow "
                "(the leader writes the MachineDeployment after the admission, not in it)"
            ),
            scaling,
            "/validate",
            review(scale_request("mirror-a", 3)),
            metrics_ready,
            scaled,
        ),
        Target(
            "scaling (unmapped)",
            "ours",
            "/scale UPDATE of a Deployment with no mapping: allow with no call",
            scaling,
            "/validate",
            review(scale_request("unmapped", 3)),
            metrics_ready,
            allowed,
        ),
    ]


def targets(
    cert: Path, key: Path, kubeconfig: str, secret: dict[str, Any], kopf_version: str | None, extras: bool
) -> list[Target]:
    """Every target, in the report's order; the baselines receive the same bytes as the injection webhook."""
    tls = ["--cert-file", str(cert), "--key-file", str(key)]
    body = review(injection_request(secret))
    kopf_env = {"BENCH_PORT": "{port}", "BENCH_CERT": str(cert), "BENCH_KEY": str(key), "KUBECONFIG": kubeconfig}
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--metrics-port",
        "{metrics}",
        *tls,
        "--kubeconfig",
        kubeconfig,
    ]
    found = [*baselines(tls, body, kopf_env, kopf_version), *ours(common, body)]
    if extras:
        description = "the raw ASGI app on uvloop instead of the stdlib loop (informative)"
        uvloop = [*SERVICE, "bench.apps", "raw", "--loop", "uvloop", "--port", "{port}", *tls]
        found.append(Target("raw ASGI on uvloop", "extra", description, uvloop, "/validate", body, tls_ready, allowed))
    return found
