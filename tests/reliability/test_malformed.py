"""10,000 generated malformed bodies against both webhooks over real TLS.

Every body goes to the injection service *and* the scaling service (20,000 requests), from a few
threads with keep-alive clients. Each answer must be HTTP 200 with an AdmissionReview whose
response either allows (a well-formed request that is not ours) or carries ``status.code`` and a
non-empty ``status.message``. A ``status.code`` of 500 means a handler raised: a bug. The bodies
come from a seeded generator (``malformed.py``), so a failure message names a case that
reproduces with the same seed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from common.webhook import LARGE_BODY_BYTES
from kubemu import Emulator
from testbed.components.serve import RunningService
from testbed.framework.audit import EVIDENCE
from testbed.framework.malformed import Case, generate
from testbed.framework.objects import SLIME_NAMESPACE, metadata_secret
from testbed.framework.reviews import scale_request, secret_request
from testbed.scenarios.reliability import Services, md_replicas, seed_injection_cluster, seed_scaling_cluster

SEED = int(os.environ.get("SLIME_RELIABILITY_SEED", "20250601"))
BODIES = int(os.environ.get("SLIME_RELIABILITY_BODIES", "2000"))
THREADS = 4
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}


def expected_uid(case: Case) -> str | None:
    """The uid the answer must echo, when the transport can know it (None: not checked)."""
    if case.expect_code in (413, 415):
        return ""
    try:
        review = json.loads(case.body)
    except (ValueError, RecursionError):
        return ""
    request = review.get("request") if isinstance(review, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else ""


def problem(case: Case, answer: httpx.Response) -> str | None:
    """What is wrong with this answer, or None."""
    if answer.status_code != 200:
        return f"HTTP {answer.status_code}: {answer.text[:200]}"
    try:
        review = answer.json()
    except ValueError:
        return f"answer is not JSON: {answer.text[:200]!r}"
    if not isinstance(review, dict) or {k: review.get(k) for k in REVIEW} != REVIEW:
        return f"answer is not an AdmissionReview v1: {answer.text[:200]}"
    response = review.get("response")
    if not isinstance(response, dict) or not isinstance(response.get("uid"), str):
        return f"answer has no response with a uid: {answer.text[:200]}"
    status = response.get("status")
    code = status.get("code") if isinstance(status, dict) else None
    if code == 503 and len(case.body) > LARGE_BODY_BYTES:
        # Large bodies are reviewed one at a time: one arriving while another runs is told to retry,
        # before it is decoded (so without its uid). kube-apiserver retries.
        return None if "reviewing another large request" in status.get("message", "") else f"503: {answer.text[:200]}"
    uid = expected_uid(case)
    if uid is not None and response["uid"] != uid:
        return f"uid {response['uid']!r} echoed, expected {uid!r}"
    if code == 500:
        return f"status.code 500 (a handler exception): {answer.text[:300]}"
    if response.get("allowed") is True:
        if case.expect_code is not None:
            return f"allowed, expected an errored review with code {case.expect_code}"
        return None
    if response.get("allowed") is not False:
        return f"response.allowed missing: {answer.text[:200]}"
    if not isinstance(code, int) or not isinstance(status.get("message"), str) or not status["message"].strip():
        return f"refused without a clear error (status.code and status.message): {answer.text[:300]}"
    if case.expect_code is not None and code != case.expect_code:
        return f"status.code {code}, expected {case.expect_code}: {status['message'][:200]}"
    return None


class Flood:
    """Sends every case to every service from a few threads, each with keep-alive clients."""

    def __init__(self, targets: dict[str, tuple[RunningService, str]]) -> None:
        self.targets = targets
        self.local = threading.local()
        self.failures: list[str] = []
        self.outcomes: dict[str, Counter[str]] = {name: Counter() for name in targets}
        self.max_seconds: dict[str, float] = {name: 0.0 for name in targets}
        self.requests = 0
        self.lock = threading.Lock()
        self.opened: list[httpx.Client] = []

    def _clients(self) -> dict[str, httpx.Client]:
        clients = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {name: service.client() for name, (service, _) in self.targets.items()}
            with self.lock:
                self.opened += clients.values()
        return clients

    def send(self, case: Case) -> None:
        headers = {"Content-Type": case.content_type} if case.content_type is not None else {}
        for name, client in self._clients().items():
            service, path = self.targets[name]
            body: Any = case.body
            if case.chunked:
                body = (case.body[i : i + 65536] for i in range(0, len(case.body), 65536))
            started = time.monotonic()
            try:
                answer = client.post(f"{service.url}{path}?timeout=10s", content=body, headers=headers)
                wrong = problem(case, answer)
            except httpx.HTTPError as exc:
                answer, wrong = None, f"request failed: {exc!r}"
            seconds = time.monotonic() - started
            with self.lock:
                self.requests += 1
                self.max_seconds[name] = max(self.max_seconds[name], seconds)
                if wrong is not None:
                    self.failures.append(f"{name}: {wrong}\n    {case.describe()}")
                    continue
                response = answer.json()["response"]  # type: ignore[union-attr]
                code = (response.get("status") or {}).get("code")
                self.outcomes[name][
                    ("allowed" if response["allowed"] else "refused") + (f" {code}" if code else "")
                ] += 1
                if not response["allowed"]:
                    EVIDENCE.add_text(f"{name} error", response["status"]["message"])

    def close(self) -> None:
        for client in self.opened:
            client.close()


@pytest.mark.slow
def test_malformed_bodies_get_clear_errors_and_never_crash(
    emulator: Emulator, services: Services, figures: dict[str, Any]
) -> None:
    _, data = seed_injection_cluster(emulator)
    seed_scaling_cluster(emulator)
    injection = services.injection(emulator)
    scaling = services.scaling(emulator)
    secret = metadata_secret(data)
    templates = [
        {**REVIEW, "request": {"uid": "injection-template", **secret_request(secret)}},
        {
            **REVIEW,
            "request": {"uid": "scaling-template", **scale_request(SLIME_NAMESPACE, "mirror-a", 3, old_replicas=2)},
        },
    ]
    assert injection.review("/mutate", templates[0]["request"])["patchType"] == "JSONPatch"  # warm caches
    cases = list(generate(SEED, BODIES, templates))
    flood = Flood({"injection": (injection, "/mutate"), "scaling": (scaling.running, "/validate")})
    calls_before = len(emulator.requests)
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(flood.send, cases))
    finally:
        flood.close()  # open keep-alive connections would hold up the services' graceful shutdown
    elapsed = time.monotonic() - started

    figures["malformed"] = {
        "seed": SEED,
        "bodies": len(cases),
        "requests": flood.requests,
        "categories": dict(Counter(c.category for c in cases)),
        "outcomes": {name: dict(counter) for name, counter in flood.outcomes.items()},
        "max_latency_ms": {name: round(s * 1000, 1) for name, s in flood.max_seconds.items()},
        "seconds": round(elapsed, 1),
        "api_calls_during_flood": dict(
            Counter(
                f"{c.user_agent.split('/')[0]} {c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}"
                for c in emulator.requests[calls_before:]
            )
        ),
        "failures": {name: sum(f.startswith(f"{name}:") for f in flood.failures) for name in flood.targets},
    }
    # Still up, and still right.
    for service in (injection, scaling.running):
        assert httpx.get(f"{service.metrics_url}/healthz", timeout=5).text == "ok"
        assert httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 200
    assert injection.review("/mutate", templates[0]["request"])["patchType"] == "JSONPatch"
    assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 4, old_replicas=2))["allowed"] is True
    assert md_replicas(emulator) == 2  # a review alone moves nothing: only a stored mirror does
    crashed = [line for line in EVIDENCE.log_lines if '"msg":"handler failed"' in line]
    figures["malformed"]["handler_exceptions_logged"] = len(crashed)
    for service, webhook in ((injection, "injection"), (scaling.running, "scaling")):
        metrics = httpx.get(f"{service.metrics_url}/metrics", timeout=5).text
        errored = [
            line
            for line in metrics.splitlines()
            if line.startswith(f'slime_webhook_requests_total{{outcome="errored",webhook="{webhook}"}}')
        ]
        assert errored, "errored outcomes are counted"
    assert flood.requests == 2 * len(cases)
    assert not flood.failures, f"{len(flood.failures)} bad answers; first ones:\n" + "\n".join(flood.failures[:10])
