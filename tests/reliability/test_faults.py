"""API faults on the admission paths: every admission is answered within its budget, naming the cause.

Scaling: the MachineDeployment ``/scale`` PATCH fails with 500, 403 or 409, hangs longer than the
patch budget, or meets a stopped API server (connection refused). Each admission is denied within
budget + margin with the MachineDeployment and the cause in the message, and the next admission
after the fault succeeds.

Injection: faults while the per-namespace caches are cold (the first admission waits at most
``--cache-sync-timeout-seconds``, then denies naming the cache and the cluster), a management
cluster whose Metal3 list fails (not ready; denied naming the cluster), and an API server that goes
away while the caches are warm (admissions keep being answered from the cache).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from kubemu import Emulator, Fault
from testbed.reviews import scale_request, secret_request
from testbed.wait import wait_for
from testbed.world import SLIME_NAMESPACE, metadata_secret
from tests.reliability.support import EVIDENCE, Services, md_replicas, seed_injection_cluster, seed_scaling_cluster, timed

MD_SCALE = r"/machinedeployments/[^/]+/scale$"
PATCH_BUDGET = 1.0  # --patch-timeout-seconds of the service under test
MARGIN = 0.5  # TLS, thread hand-off and a noisy machine
SYNC_TIMEOUT = 1.0  # --cache-sync-timeout-seconds of the injection service under test


def denied(response: dict[str, Any], *fragments: str) -> str:
    assert response["allowed"] is False, response
    message = response["status"]["message"]
    EVIDENCE.add_text("fault denial", message)
    for fragment in fragments:
        assert fragment in message, message
    assert response["status"]["code"] != 500, response
    return message


SCALING_FAULTS = [
    ("500", dict(status=500), 503, "the API server answered 500"),
    ("403", dict(status=403), 403, "forbidden: injected fault (403)"),
    ("409", dict(status=409), 409, "the API server answered 409"),
    ("dropped connection", dict(close_connection=True), 503, "cannot reach the API server"),
    ("slower than the budget", dict(delay_seconds=PATCH_BUDGET + 2.0), 503, f"the API server did not answer within {PATCH_BUDGET:g}s"),
]


@pytest.mark.slow
def test_scaling_faults_on_the_hot_path_are_denied_within_budget(emulator: Emulator, services: Services, figures: dict[str, Any]) -> None:
    seed_scaling_cluster(emulator)
    scaling = services.scaling(emulator, patch_timeout_seconds=PATCH_BUDGET)
    latencies: dict[str, float] = {}
    replicas = 2
    for label, fault, code, cause in SCALING_FAULTS:
        for _ in range(3):
            handle = emulator.add_fault(Fault(method="PATCH", path_regex=MD_SCALE, **fault))
            response, seconds = timed(lambda r=replicas + 10: scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", r)))
            handle.remove()
            denied(response, "cannot scale MachineDeployment metal3/md-a to", "from mirror slime/mirror-a", cause)
            assert response["status"]["code"] == code, response
            assert seconds < PATCH_BUDGET + MARGIN, f"{label}: answered in {seconds:.2f}s"
            latencies[label] = max(latencies.get(label, 0.0), seconds)
            replicas += 1
            assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", replicas))["allowed"] is True  # recovered
            assert md_replicas(emulator) == replicas

    # Connection refused: the API server is down.
    port = emulator.port
    emulator.stop()
    for _ in range(3):
        response, seconds = timed(lambda: scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 1)))
        denied(response, "cannot scale MachineDeployment metal3/md-a to 1 replicas", "cannot reach the API server")
        assert response["status"]["code"] == 503
        assert seconds < PATCH_BUDGET + MARGIN, f"connection refused: answered in {seconds:.2f}s"
        latencies["connection refused"] = max(latencies.get("connection refused", 0.0), seconds)
    emulator.start()
    assert emulator.port == port
    assert scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 1))["allowed"] is True
    assert md_replicas(emulator) == 1
    figures["scaling_faults_max_latency_ms"] = {k: round(v * 1000, 1) for k, v in latencies.items()}
    figures["scaling_faults_budget_ms"] = int((PATCH_BUDGET + MARGIN) * 1000)


COLD_FAULTS = [
    ("500", dict(status=500), "500 InternalError"),
    ("403", dict(status=403), "403 Forbidden"),
    ("slower than the sync timeout", dict(delay_seconds=SYNC_TIMEOUT + 3.0), f"no answer within {SYNC_TIMEOUT:g}s"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("label", "fault", "cause"), COLD_FAULTS, ids=[f[0] for f in COLD_FAULTS])
def test_injection_cold_cache_fault_denies_within_sync_timeout_naming_the_cluster(
    emulator: Emulator, services: Services, figures: dict[str, Any], label: str, fault: dict[str, Any], cause: str
) -> None:
    _, data = seed_injection_cluster(emulator)
    handle = emulator.add_fault(Fault(verb="list", path_regex=r"/namespaces/slurm/pods$", **fault))
    service = services.injection(emulator, cache_sync_timeout_seconds=SYNC_TIMEOUT)
    request = secret_request(metadata_secret(data))
    response, seconds = timed(lambda: service.review("/mutate", request))
    message = denied(
        response, "cannot inject Slurm join data into Secret metal3/m3m-0-metadata: cannot read slurmctld pods in slurm (local) from cluster local", cause
    )
    assert seconds < SYNC_TIMEOUT + MARGIN + 0.5, f"answered in {seconds:.2f}s: {message}"
    handle.remove()
    started = time.monotonic()
    wait_for(lambda: service.review("/mutate", request).get("patchType") == "JSONPatch", 10, "recovery after the fault")
    figures.setdefault("injection_cold_faults", {})[label] = {
        "denied_in_ms": round(seconds * 1000, 1),
        "message": message,
        "recovered_in_s": round(time.monotonic() - started, 2),
    }


@pytest.mark.slow
def test_injection_metal3_list_failing_is_not_ready_and_denies_naming_the_cluster(emulator: Emulator, services: Services) -> None:
    _, data = seed_injection_cluster(emulator)
    handle = emulator.add_fault(Fault(verb="list", path_regex=r"/metal3datas$", status=500))
    service = services.injection(emulator, ready=False, cache_sync_timeout_seconds=SYNC_TIMEOUT)
    wait_for(lambda: "metal3datas" in httpx.get(f"{service.metrics_url}/readyz", timeout=5).text, 10, "a readiness failure naming the cache")
    assert httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 503
    response, seconds = timed(lambda: service.review("/mutate", secret_request(metadata_secret(data))))
    denied(response, "cannot inject Slurm join data into Secret metal3/m3m-0-metadata", "cluster local")
    assert seconds < SYNC_TIMEOUT + MARGIN + 0.5
    handle.remove()
    wait_for(lambda: httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 200, 10, "readiness after the fault")


@pytest.mark.slow
def test_injection_keeps_answering_from_warm_caches_while_the_api_server_is_gone(
    emulator: Emulator, services: Services, figures: dict[str, Any]
) -> None:
    slurm, data = seed_injection_cluster(emulator)
    service = services.injection(emulator)
    request = secret_request(metadata_secret(data))
    assert service.review("/mutate", request)["patchType"] == "JSONPatch"  # warms every cache
    emulator.stop()
    worst = 0.0
    with service.client() as client:
        for i in range(200):
            body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {**request, "uid": f"gone-{i}"}}
            answer, seconds = timed(lambda b=body: client.post(f"{service.url}/mutate", json=b))
            worst = max(worst, seconds)
            response = answer.json()["response"]
            assert response["uid"] == f"gone-{i}" and response.get("patchType") == "JSONPatch", response
    assert httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 200
    emulator.start()
    assert service.review("/mutate", request)["patchType"] == "JSONPatch"
    figures["injection_api_gone"] = {"admissions": 200, "patched": 200, "max_latency_ms": round(worst * 1000, 1)}
    assert slurm.key  # registered for the final key check by seed_injection_cluster
