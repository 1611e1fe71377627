"""The scaling webhook loses an admission, or races another replica: the reconciler restores MD == mirror.

- Killed between admission and patch: a real ``scaling-webhook`` process receives a mirror
  scale, its MachineDeployment PATCH hangs in the API server, and the process is SIGKILLed. With
  ``failurePolicy: Ignore`` (the chart's choice) the API server persists the mirror anyway. A new
  replica's reconciler heals the drift at start.
- A patch that lands after its admission was denied for slowness (the mirror is not persisted):
  the reconciler sets the MachineDeployment back to the mirror.
- Two replicas on the same API server, interleaved admissions (each persisted by the emulated API
  server in whatever order the threads reach it) and reconcile passes: after a final pass of both,
  MachineDeployment replicas == mirror replicas, every round.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubemu import Emulator, Fault
from testbed.pki import Pki
from testbed.reviews import scale_request
from testbed.services import Scaling
from testbed.wait import wait_for
from testbed.world import SLIME_NAMESPACE
from tests.reliability.support import EVIDENCE, REPO_ROOT, Services, md_replicas, mirror_replicas, seed_scaling_cluster, timed

MD_SCALE = r"/machinedeployments/[^/]+/scale$"
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def persist_mirror(emulator: Emulator, replicas: int) -> None:
    """What kube-apiserver does after the validating webhooks allowed (or, failing open, ignored) a scale."""
    emulator.patch("apps/v1", "deployments", SLIME_NAMESPACE, "mirror-a", {"spec": {"replicas": replicas}})


@pytest.mark.slow
def test_service_killed_between_admission_and_patch_is_healed_by_a_new_reconciler(
    emulator: Emulator, pki: Pki, tmp_path: Path, services: Services, figures: dict[str, Any]
) -> None:
    seed_scaling_cluster(emulator)  # mirror 2, MachineDeployment 2
    port, metrics_port = free_port(), free_port()
    log_file = tmp_path / "scaling-webhook.log"
    command = [
        sys.executable, "-m", "scaling_webhook.main", "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
        "--cert-file", str(pki.cert_file), "--key-file", str(pki.key_file), "--namespace", SLIME_NAMESPACE,
        "--kubeconfig", emulator.write_kubeconfig(tmp_path / "kubeconfig"), "--resync-seconds", "3600", "--patch-timeout-seconds", "5",
    ]
    with log_file.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: _ready(metrics_port), 20, "the scaling-webhook process to be ready")
        hang = Fault(method="PATCH", path_regex=MD_SCALE, delay_seconds=30, close_connection=True, times=1)
        emulator.add_fault(hang)
        outcome: list[Any] = []

        def admission() -> None:
            body = {**REVIEW, "request": {"uid": "doomed", **scale_request(SLIME_NAMESPACE, "mirror-a", 5)}}
            context = ssl.create_default_context(cafile=str(pki.ca_file))
            try:
                outcome.append(httpx.post(f"https://127.0.0.1:{port}/validate", json=body, verify=context, timeout=10))
            except httpx.HTTPError as exc:
                outcome.append(exc)

        sender = threading.Thread(target=admission)
        sender.start()
        wait_for(lambda: hang.times == 0, 10, "the MachineDeployment PATCH to be in flight")
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        sender.join(15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        EVIDENCE.log_lines.extend(log_file.read_text(errors="replace").splitlines())
    assert outcome and isinstance(outcome[0], httpx.HTTPError), f"the admission should have died with the process: {outcome}"
    persist_mirror(emulator, 5)  # failurePolicy Ignore: the API server stores the scale anyway
    assert (mirror_replicas(emulator), md_replicas(emulator)) == (5, 2), "the patch must not have landed"

    started = time.monotonic()
    services.scaling(emulator)  # a new replica: its reconciler runs at start
    wait_for(lambda: md_replicas(emulator) == 5, 10, "the new reconciler to heal the MachineDeployment")
    figures["killed_between_admission_and_patch"] = {"mirror": 5, "machine_deployment_before": 2,
                                                     "healed_in_s_after_new_replica_start": round(time.monotonic() - started, 2)}


def _ready(metrics_port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_patch_landing_after_a_slow_denial_is_healed(
    emulator_factory: Callable[..., Emulator], services: Services, figures: dict[str, Any]
) -> None:
    slow = threading.Event()

    def slow_scale(attrs: Any) -> None:  # the API server applies the write, but late (a slow etcd, say)
        if slow.is_set() and attrs.resource == "machinedeployments" and attrs.subresource == "scale":
            slow.clear()
            time.sleep(1.5)

    emulator = seed_scaling_cluster(emulator_factory(admission=slow_scale))
    scaling = services.scaling(emulator, patch_timeout_seconds=0.5)
    slow.set()
    response, seconds = timed(lambda: scaling.review(scale_request(SLIME_NAMESPACE, "mirror-a", 7)))
    assert response["allowed"] is False and "did not answer within 0.5s" in response["status"]["message"], response
    assert seconds < 1.0
    wait_for(lambda: md_replicas(emulator) == 7, 5, "the late patch to land")  # drift: the denied mirror scale is not persisted
    assert mirror_replicas(emulator) == 2
    corrected = scaling.service.reconcile_once()
    assert len(corrected) == 1 and md_replicas(emulator) == 2
    figures["late_patch_after_denial"] = {"denied_in_ms": round(seconds * 1000, 1), "drift": "MachineDeployment 7, mirror 2",
                                          "healed_by": "one reconcile pass"}


@pytest.mark.slow
def test_two_replicas_racing_reach_the_same_end_state(emulator: Emulator, services: Services, figures: dict[str, Any]) -> None:
    seed_scaling_cluster(emulator)
    replicas = [services.scaling(emulator), services.scaling(emulator)]
    rng = random.Random(7)
    rounds, drifted_rounds, admissions = 12, 0, 0
    lock = threading.Lock()

    def api_server_scale(replica: Scaling, value: int) -> None:
        nonlocal admissions
        response = replica.review(scale_request(SLIME_NAMESPACE, "mirror-a", value))
        assert response["allowed"] is True, response
        persist_mirror(emulator, value)
        with lock:
            admissions += 1

    with ThreadPoolExecutor(6) as pool:
        for _ in range(rounds):
            jobs = [pool.submit(api_server_scale, rng.choice(replicas), rng.randrange(0, 30)) for _ in range(8)]
            jobs.insert(rng.randrange(len(jobs)), pool.submit(replicas[0].service.reconcile_once))
            jobs.insert(rng.randrange(len(jobs)), pool.submit(replicas[1].service.reconcile_once))
            for job in jobs:
                job.result()
            if md_replicas(emulator) != mirror_replicas(emulator):
                drifted_rounds += 1
            final = [pool.submit(r.service.reconcile_once) for r in replicas]
            for job in final:
                job.result()
            assert md_replicas(emulator) == mirror_replicas(emulator), "the replicas disagree after a final pass of both"
            assert [r.service.reconcile_once() for r in replicas] == [[], []], "a settled state must stay settled"
    figures["two_replicas_racing"] = {"rounds": rounds, "admissions": admissions, "rounds_with_drift_before_final_pass": drifted_rounds,
                                      "rounds_equal_after_final_pass": rounds}
