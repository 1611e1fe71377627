"""API faults: every admission is answered, naming the cause when it must refuse; writes are retried.

Scaling: an admission reads only watch caches, so faults of the API server do not reach it; the
leader's MachineDeployment ``/scale`` PATCH fails with 500, 403 or 409, hangs longer than its
budget, or meets a dropped connection, and the write is retried (1 s, doubling) until it lands.
A stopped API server: admissions are still answered from the caches; once it is back the watches
reconnect and a stored mirror moves the pool again.

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
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import SLIME_NAMESPACE, metadata_secret
from testbed.framework.reviews import scale_request, secret_request
from testbed.framework.wait import wait_for
from testbed.scenarios.reliability import Services, md_replicas, seed_injection_cluster, seed_scaling_cluster, timed

MD_SCALE = r"/machinedeployments/[^/]+/scale$"
PATCH_BUDGET = 1.0  # --patch-timeout-seconds of the service under test
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
    ("500", dict(status=500)),
    ("403", dict(status=403)),
    ("409", dict(status=409)),
    ("dropped connection", dict(close_connection=True)),
    (
        "slower than the budget",
        dict(delay_seconds=8.0),
    ),  # the reconciler's write budget is max(--patch-timeout-seconds, 5 s)
]


@pytest.mark.slow
def test_scaling_faults_delay_the_write_never_the_answer(
    emulator: Emulator, services: Services, figures: dict[str, Any]
) -> None:
    seed_scaling_cluster(emulator)
    scaling = services.scaling(emulator, patch_timeout_seconds=PATCH_BUDGET)
    answered: dict[str, float] = {}
    landed: dict[str, float] = {}
    replicas = 2
    for label, fault in SCALING_FAULTS:
        replicas += 1
        handle = emulator.add_fault(Fault(method="PATCH", path_regex=MD_SCALE, **fault))
        errors = scaling.metric("slime_scaling_reconcile_errors_total") or 0
        emulator.patch(
            "apps/v1", "deployments", SLIME_NAMESPACE, "mirror-a", {"spec": {"replicas": replicas}}
        )  # stored
        wait_for(
            lambda e=errors: (scaling.metric("slime_scaling_reconcile_errors_total") or 0) > e,
            10,
            f"{label}: the failed write",
        )
        response, seconds = timed(
            lambda r=replicas: scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", r + 1, old_replicas=r))
        )
        assert response["allowed"] is True, response  # answered from the caches while the writes fail
        answered[label] = seconds
        assert md_replicas(emulator) == replicas - 1
        handle.remove()
        started = time.monotonic()
        wait_for(lambda r=replicas: md_replicas(emulator) == r, 10, f"{label}: the retried write")
        landed[label] = time.monotonic() - started

    # The API server stops: admissions are still answered; once it is back, the pool follows again.
    port = emulator.port
    emulator.stop()
    response, seconds = timed(
        lambda: scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 9, old_replicas=replicas))
    )
    assert response["allowed"] is True, response
    answered["API server stopped"] = seconds
    emulator.start()
    assert emulator.port == port
    emulator.patch("apps/v1", "deployments", SLIME_NAMESPACE, "mirror-a", {"spec": {"replicas": 1}})
    started = time.monotonic()
    wait_for(lambda: md_replicas(emulator) == 1, 20, "the watches to reconnect and the pool to follow")
    landed["API server back"] = time.monotonic() - started
    figures["scaling_faults"] = {
        "admission_ms": {k: round(v * 1000, 1) for k, v in answered.items()},
        "write_landed_after_fault_removed_s": {k: round(v, 2) for k, v in landed.items()},
    }


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
        response,
        "cannot inject Slurm join data into Secret metal3/m3m-0-metadata: cannot read slurmctld pods in slurm (local) "
        "from cluster local",
        cause,
    )
    handle.remove()
    started = time.monotonic()
    wait_for(lambda: service.review("/mutate", request).get("patchType") == "JSONPatch", 10, "recovery after the fault")
    figures.setdefault("injection_cold_faults", {})[label] = {
        "denied_in_ms": round(seconds * 1000, 1),
        "message": message,
        "recovered_in_s": round(time.monotonic() - started, 2),
    }


@pytest.mark.slow
def test_injection_metal3_list_failing_is_not_ready_and_denies_naming_the_cluster(
    emulator: Emulator, services: Services
) -> None:
    _, data = seed_injection_cluster(emulator)
    handle = emulator.add_fault(Fault(verb="list", path_regex=r"/metal3datas$", status=500))
    service = services.injection(emulator, ready=False, cache_sync_timeout_seconds=SYNC_TIMEOUT)
    wait_for(
        lambda: "metal3datas" in httpx.get(f"{service.metrics_url}/readyz", timeout=5).text,
        10,
        "a readiness failure naming the cache",
    )
    assert httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 503
    response, seconds = timed(lambda: service.review("/mutate", secret_request(metadata_secret(data))))
    denied(response, "cannot inject Slurm join data into Secret metal3/m3m-0-metadata", "cluster local")
    handle.remove()
    wait_for(
        lambda: httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 200,
        10,
        "readiness after the fault",
    )


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
            body = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {**request, "uid": f"gone-{i}"},
            }
            answer, seconds = timed(lambda b=body: client.post(f"{service.url}/mutate", json=b))
            worst = max(worst, seconds)
            response = answer.json()["response"]
            assert response["uid"] == f"gone-{i}" and response.get("patchType") == "JSONPatch", response
    assert httpx.get(f"{service.metrics_url}/readyz", timeout=5).status_code == 200
    emulator.start()
    assert service.review("/mutate", request)["patchType"] == "JSONPatch"
    figures["injection_api_gone"] = {"admissions": 200, "patched": 200, "max_latency_ms": round(worst * 1000, 1)}
    assert slurm.key  # registered for the final key check by seed_injection_cluster
