"""The scaling service under failure: the one writer dies mid-write, someone else moves a pool,
replicas race, forged reviews pour in. The MachineDeployment always returns to the mirror *as
stored*; nothing but a stored mirror moves a pool.

- Leader killed mid-write: a real ``scaling-webhook`` process leads, its MachineDeployment PATCH
  hangs in the API server, and it is SIGKILLed (it cannot give the Lease up). The other replica
  takes the Lease once it expires and sets the MachineDeployment. Figure: seconds from the kill.
- Someone else sets a MachineDeployment: the watch event wakes the leader, which sets it back.
  Figure: the heal time over repeated edits.
- Two replicas, mirror scales through the API (the admission route alternates between them, as a
  Service would): only the Lease holder writes, and every round ends with MD == mirror.
- Forged reviews, sent straight to both replicas with consistent and inconsistent oldObjects and
  replica counts up to 2^63: 0 MachineDeployments move.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from kubemu import Emulator, Fault
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.paths import REPO_ROOT
from testbed.framework.pki import Pki
from testbed.framework.ports import free_port
from testbed.framework.reviews import scale_request
from testbed.framework.wait import wait_for
from testbed.framework.world import scale_mirror
from testbed.scenarios.reliability import Services, md_replicas, mirror_replicas, seed_scaling_cluster

MD_SCALE = r"/machinedeployments/[^/]+/scale$"
QUICK_LEASE = {"lease_duration_seconds": 3, "lease_renew_deadline_seconds": 2, "lease_retry_seconds": 0.5}


def _ready(metrics_port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _lease_holder(emulator: Emulator) -> str:
    lease = emulator.get("coordination.k8s.io/v1", "Lease", SLIME_NAMESPACE, "slime-scaling-webhook")
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


@pytest.mark.slow
def test_the_leader_killed_mid_write_is_replaced_and_the_pool_follows(
    emulator: Emulator, pki: Pki, tmp_path: Path, services: Services, figures: dict[str, Any]
) -> None:
    seed_scaling_cluster(emulator)  # mirror 2, MachineDeployment 2 (already adopted)
    port, metrics_port = free_port(), free_port()
    log_file = tmp_path / "scaling-webhook.log"
    command = [
        sys.executable,
        "-m",
        "scaling_webhook.main",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--cert-file",
        str(pki.cert_file),
        "--key-file",
        str(pki.key_file),
        "--namespace",
        SLIME_NAMESPACE,
        "--kubeconfig",
        emulator.write_kubeconfig(tmp_path / "kubeconfig"),
        "--resync-seconds",
        "3600",
        "--patch-timeout-seconds",
        "5",
        "--lease-duration-seconds",
        "3",
        "--lease-renew-deadline-seconds",
        "2",
        "--lease-retry-seconds",
        "0.5",
    ]
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "POD_NAME": "doomed-leader"},
        )
    try:
        wait_for(
            lambda: _ready(metrics_port) and _lease_holder(emulator).startswith("doomed-leader"),
            20,
            "the process to lead",
        )
        follower = services.scaling(emulator, **QUICK_LEASE)
        assert follower.service.leader is not None and not follower.service.leader.is_leader
        hang = Fault(method="PATCH", path_regex=MD_SCALE, delay_seconds=30, close_connection=True, times=1)
        emulator.add_fault(hang)
        emulator.patch(
            "apps/v1", "deployments", SLIME_NAMESPACE, "mirror-a", {"spec": {"replicas": 5}}
        )  # the scale is stored
        wait_for(lambda: hang.times == 0, 10, "the leader's MachineDeployment PATCH to be in flight")
        process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        EVIDENCE.log_lines.extend(log_file.read_text(errors="replace").splitlines())
    assert md_replicas(emulator) == 2, "the hung patch must not have landed"
    wait_for(lambda: md_replicas(emulator) == 5, 15, "the new leader to set the MachineDeployment")
    healed = time.monotonic() - killed
    assert follower.service.leader.is_leader
    figures["leader_killed_mid_write"] = {
        "mirror": 5,
        "machine_deployment_before": 2,
        "lease_duration_s": 3,
        "healed_in_s_after_kill": round(healed, 2),
    }


@pytest.mark.slow
def test_a_second_writer_is_undone_on_its_watch_event(
    emulator: Emulator, services: Services, figures: dict[str, Any]
) -> None:
    seed_scaling_cluster(emulator)
    scaling = services.scaling(emulator)  # resync: an hour; only the watch can heal fast
    heals = []
    for value in range(3, 23):
        emulator.patch("cluster.x-k8s.io/v1beta1", "MachineDeployment", "metal3", "md-a", {"spec": {"replicas": value}})
        started = time.monotonic()
        wait_for(lambda: md_replicas(emulator) == 2, 5, "the heal")
        heals.append(time.monotonic() - started)
    assert scaling.metric("slime_scaling_writes_total", 'reason="drift"') == 20
    figures["second_writer_undone"] = {
        "edits": len(heals),
        "median_ms": round(statistics.median(heals) * 1000, 1),
        "max_ms": round(max(heals) * 1000, 1),
        "resync_seconds": 3600,
    }


@pytest.mark.slow
def test_two_replicas_racing_leave_one_writer_and_the_same_end_state(
    emulator_factory: Any, services: Services, figures: dict[str, Any]
) -> None:
    from testbed.components.services import ScaleWebhookRoute

    route = ScaleWebhookRoute()
    emulator = seed_scaling_cluster(emulator_factory(admission=route))
    replicas = [services.scaling(emulator, **QUICK_LEASE), services.scaling(emulator, **QUICK_LEASE)]
    for replica in replicas:
        route.add(replica)
    wait_for(
        lambda: sum(bool(r.service.leader and r.service.leader.is_leader) for r in replicas) == 1, 10, "one leader"
    )
    rng = random.Random(7)
    rounds, admissions, conflicts = 12, 0, 0
    lock = threading.Lock()

    def scale(value: int) -> None:
        # Eight writers at once: a review whose oldObject another write has overtaken is refused with
        # 409 (the webhook compares it with the stored mirror), which is the right answer to a race.
        nonlocal admissions, conflicts
        try:
            scale_mirror(emulator, SLIME_NAMESPACE, "mirror-a", value)
        except ApiException as exc:
            if exc.status != 409:
                raise
            with lock:
                conflicts += 1
            return
        with lock:
            admissions += 1

    for _ in range(rounds):
        threads = [threading.Thread(target=scale, args=(rng.randrange(0, 30),)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        wait_for(lambda: md_replicas(emulator) == mirror_replicas(emulator), 5, "MD == mirror after the round")
    writes = [
        int(r.metric("slime_scaling_writes_total", 'reason="mirror"') or 0)
        + int(r.metric("slime_scaling_writes_total", 'reason="drift"') or 0)
        for r in replicas
    ]
    assert sorted(writes)[0] == 0, f"only the Lease holder writes: {writes}"
    assert admissions + conflicts == rounds * 8 and admissions >= rounds, (admissions, conflicts)
    figures["two_replicas_racing"] = {
        "rounds": rounds,
        "admissions": admissions,
        "stale_refused": conflicts,
        "rounds_equal": rounds,
        "writes_by_replica": sorted(writes, reverse=True),
    }


@pytest.mark.slow
def test_forged_reviews_never_move_a_pool(emulator: Emulator, services: Services, figures: dict[str, Any]) -> None:
    seed_scaling_cluster(emulator)
    replicas = [services.scaling(emulator, **QUICK_LEASE), services.scaling(emulator, **QUICK_LEASE)]
    rng = random.Random(20261122)
    answers: dict[str, int] = {}
    forged = 500
    for _ in range(forged):
        replicas_asked = rng.choice([0, 1, 2**31 - 1, 2**31, 2**63, rng.randrange(0, 100)])
        old = rng.choice([2, rng.randrange(0, 100)])  # the stored value, or a guess
        response = rng.choice(replicas).review(
            scale_request(SLIME_NAMESPACE, "mirror-a", replicas_asked, old_replicas=old)
        )
        key = "allowed" if response["allowed"] else f"denied {response['status']['code']}"
        answers[key] = answers.get(key, 0) + 1
    for replica in replicas:
        replica.service.reconcile_once()
    assert (md_replicas(emulator), mirror_replicas(emulator)) == (2, 2)
    figures["forged_scaling_reviews"] = {
        "reviews": forged,
        "answers": dict(sorted(answers.items())),
        "machine_deployments_moved": 0,
    }
