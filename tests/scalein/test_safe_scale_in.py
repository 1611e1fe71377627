"""Safe scale-in against kubemu and a fake slurmrestd, through the real service."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from scaling_webhook.mappings import MappingError, parse_mappings
from scaling_webhook.safe_scale_in.slurmrestd import SlurmNode
from scaling_webhook.safe_scale_in.victims import DELETE_MACHINE, order_candidates
from testbed.wait import wait_for
from testbed.world import md_events, md_replicas
from tests.scalein.sim import MD, MD_NS, Env


def test_thesis_bounce_keeps_the_node_with_the_long_job(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    e.slurm.start_job("node-001", time.time() + 60)
    e.slurm.start_job("node-002", time.time() + 3600)  # the long one: node X
    e.slurm.start_job("node-003", time.time() + 120)
    e.slurm.finish_jobs("node-001")
    e.slurm.finish_jobs("node-003")
    response = e.scale(scaling, 1)
    assert response["allowed"], response
    assert sorted(e.annotated()) == ["md-001", "md-003"]
    assert md_replicas(e.emulator, MD_NS, MD) == 1
    assert e.slurm.state("node-002") == ["ALLOCATED"]  # X never drained, never marked
    assert "DRAIN" in e.slurm.state("node-001") and "DRAIN" in e.slurm.state("node-003")
    e.capi.step()  # CAPI deletes the marked Machines; the pre-drain hook holds them
    assert e.hooked("md-001") and e.capi.machine("md-001")["metadata"].get("deletionTimestamp")
    scaling.service.reconcile_once()  # nodes drained: Slurm DELETE, then the hook goes
    e.capi.step()
    assert [m["metadata"]["name"] for m in e.capi.machines()] == ["md-002"]
    assert sorted(e.slurm.deleted) == ["node-001", "node-003"]
    assert e.capi.violations == [] and e.slurm.violations == []
    assert scaling.metric("slime_scaling_scale_in_victims_total") == 2
    assert all(claims["sun"] == "slurm" and claims["exp"] - claims["iat"] == 60 for claims in e.slurm.tokens_seen)


def test_too_few_idle_nodes_defers_and_reconciler_finishes(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    for node in ("node-001", "node-002"):
        e.slurm.start_job(node, time.time() + 600)
    response = e.scale(scaling, 0)
    assert response["allowed"] and "deferred" in response["status"]["message"]
    assert e.annotated() == ["md-003"] and md_replicas(e.emulator, MD_NS, MD) == 2
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "ScaleInDeferred"), what="the deferral event")
    assert event["type"] == "Warning" and "2 replica(s) deferred" in event["message"] and "md-001 (ALLOCATED)" in event["message"]
    assert scaling.metric("slime_scaling_scale_in_deferred_total") == 2
    e.slurm.finish_jobs("node-001")
    scaling.service.reconcile_once()
    assert md_replicas(e.emulator, MD_NS, MD) == 1 and sorted(e.annotated()) == ["md-001", "md-003"]
    e.slurm.finish_jobs("node-002")
    scaling.service.reconcile_once()
    assert md_replicas(e.emulator, MD_NS, MD) == 0


def test_slurmrestd_down_no_scale_in_but_scale_up_works(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    e.slurm.stop()
    response = e.scale(scaling, 1)
    assert response["allowed"], response
    assert e.annotated() == [] and md_replicas(e.emulator, MD_NS, MD) == 3
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "SlurmUnavailable")[:1], what="the SlurmUnavailable event")
    assert event["type"] == "Warning" and "cannot reach slurmrestd" in event["message"]
    assert "eyJ" not in event["message"]  # never a token
    scaling.service.reconcile_once()
    assert e.annotated() == [] and md_replicas(e.emulator, MD_NS, MD) == 3
    assert e.scale(scaling, 5)["allowed"]
    assert md_replicas(e.emulator, MD_NS, MD) == 5
    assert (scaling.metric("slime_scaling_slurm_errors_total") or 0) >= 2


def test_slurmrestd_errors_mean_no_scale_in(env: Callable[[int], Env]) -> None:
    e = env(2)
    scaling = e.scaling(apiVersion="v0.0.42")
    e.slurm.fail_status = 500
    assert e.scale(scaling, 0)["allowed"]
    assert e.annotated() == [] and md_replicas(e.emulator, MD_NS, MD) == 2
    e.slurm.fail_status = None
    scaling.service.reconcile_once()
    assert md_replicas(e.emulator, MD_NS, MD) == 0 and sorted(e.annotated()) == ["md-001", "md-002"]
    assert all(path.startswith("/slurm/v0.0.42/") for _, path in e.slurm.calls)


def test_version_probe_uses_the_newest_served(env: Callable[[int], Env]) -> None:
    e = env(1)
    e.slurm.versions = ("v0.0.42", "v0.0.43")
    scaling = e.scaling()
    assert e.scale(scaling, 0)["allowed"]
    assert md_replicas(e.emulator, MD_NS, MD) == 0
    assert ("GET", "/slurm/v0.0.44/ping") in e.slurm.calls and ("GET", "/slurm/v0.0.43/nodes/") in e.slurm.calls


def test_scale_up_reclaims_pending_victims(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    assert e.scale(scaling, 1)["allowed"]
    assert sorted(e.annotated()) == ["md-001", "md-002"]  # not deleted yet (CAPI has not acted)
    assert e.scale(scaling, 2)["allowed"]
    assert e.annotated() == ["md-002"]
    assert e.slurm.state("node-001") == ["IDLE"]  # undrained
    assert md_replicas(e.emulator, MD_NS, MD) == 2
    e.capi.step()
    assert e.capi.counter == 3  # nothing new provisioned
    assert scaling.metric("slime_scaling_reclaimed_total") == 1
    wait_for(lambda: md_events(e.emulator, MD_NS, MD, "Reclaimed"), what="the Reclaimed event")


def test_pre_drain_hook_waits_for_the_drain(env: Callable[[int], Env]) -> None:
    e = env(2)
    scaling = e.scaling()
    assert e.hooked("md-001") and e.hooked("md-002")  # the first reconcile added the hook
    e.slurm.start_job("node-001", time.time() + 60)
    e.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-001")  # someone deletes it directly
    scaling.service.reconcile_once()
    assert e.slurm.state("node-001") == ["ALLOCATED", "DRAIN"] and e.hooked("md-001")
    e.capi.step()
    assert e.capi.machine("md-001") is not None  # held
    e.slurm.finish_jobs("node-001")
    scaling.service.reconcile_once()
    assert "node-001" in e.slurm.deleted and not e.hooked("md-001")
    e.capi.step()
    assert e.capi.machine("md-001") is None and e.capi.violations == []


def test_pre_drain_hook_timeout(env: Callable[[int], Env]) -> None:
    e = env(2)
    scaling = e.scaling(drainTimeoutSeconds=2)
    e.slurm.start_job("node-001", time.time() + 3600)
    e.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-001")
    scaling.service.reconcile_once()
    assert e.hooked("md-001")
    time.sleep(3.1)  # deletionTimestamp has a one-second resolution
    scaling.service.reconcile_once()
    assert not e.hooked("md-001") and "node-001" not in e.slurm.deleted
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "DrainTimeout"), what="the DrainTimeout event")
    assert event["type"] == "Warning" and "md-001" in event["message"]


def test_randomized_simulation_never_removes_a_busy_node(env: Callable[[int], Env]) -> None:
    rng = random.Random(20240611)
    e = env(4)
    scaling = e.scaling()
    scaling.service.reconciler.settle_seconds = 0
    annotated_busy: list[str] = []
    for _ in range(100):
        for name, node in list(e.slurm.nodes.items()):  # jobs start on usable nodes, others end
            if node.jobs and rng.random() < 0.4:
                e.slurm.finish_jobs(name)
            elif not node.jobs and not node.drain and rng.random() < 0.4:
                e.slurm.start_job(name, time.time() + rng.randint(10, 1000))
        assert e.scale(scaling, rng.randint(0, 6))["allowed"]
        for machine in e.capi.machines():
            if (machine["metadata"].get("annotations") or {}).get(DELETE_MACHINE):
                node = e.slurm.nodes.get(e.capi.node_of(machine))
                if node is not None and node.busy and not node.drain:
                    annotated_busy.append(machine["metadata"]["name"])
        if rng.random() < 0.3:
            scaling.service.reconcile_once()
        e.capi.step()
    assert annotated_busy == []
    assert scaling.metric("slime_scaling_scale_in_victims_total") > 0  # the scenario did exercise scale-in
    assert e.slurm.violations == [] and e.capi.violations == []
    for name in list(e.slurm.nodes):
        e.slurm.finish_jobs(name)
    for _ in range(4):
        scaling.service.reconcile_once()
        e.capi.step()
    mirror = e.emulator.get("apps/v1", "Deployment", "slime", "mirror-deployment")["spec"]["replicas"]
    assert md_replicas(e.emulator, MD_NS, MD) == mirror
    live = [m for m in e.capi.machines() if not m["metadata"].get("deletionTimestamp")]
    assert len(live) == mirror


# --- pure parts -------------------------------------------------------------------------------


def _machine(name: str, host: str, deleting: bool = False) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "2024-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "status": {"addresses": [{"type": "InternalIP", "address": host}]}}


def test_order_candidates() -> None:
    nodes = [
        SlurmNode("n1", address="10.0.0.1", states=frozenset({"IDLE"})),
        SlurmNode("n2", address="10.0.0.2", states=frozenset({"MIXED"})),
        SlurmNode("n3", address="10.0.0.3", states=frozenset({"IDLE", "DRAIN"})),
        SlurmNode("n4", address="10.0.0.4", states=frozenset({"ALLOCATED", "DRAIN"})),
        SlurmNode("n5", address="10.0.0.5", states=frozenset({"IDLE", "COMPLETING"})),
    ]
    machines = [_machine(f"m{i}", f"10.0.0.{i}") for i in range(1, 6)]
    machines += [_machine("m9", "10.0.0.9"), _machine("m0", "10.0.0.1", deleting=True)]
    eligible, ineligible = order_candidates(machines, nodes)
    assert [c.machine for c in eligible] == ["m9", "m3", "m1"]
    assert {c.machine: c.why for c in ineligible} == {
        "m0": "already deleting", "m2": "MIXED", "m4": "ALLOCATED", "m5": "COMPLETING"}


@pytest.mark.parametrize(("options", "message"), [
    ("{slurmrestd: 'ftp://x', jwtSecret: a/b}", "safeScaleIn.slurmrestd: 'ftp://x' is not an http:// or https:// URL"),
    ("{slurmrestd: 'http://x:6820', jwtSecret: b}", "safeScaleIn.jwtSecret: 'b' is not of the form <namespace>/<name>"),
    ("{slurmrestd: 'http://x', jwtSecret: a/b, apiVersion: v0.0.41}", "apiVersion: 'v0.0.41' is not supported"),
    ("{slurmrestd: 'http://x', jwtSecret: a/b, drainTimeoutSeconds: 0}", "drainTimeoutSeconds: must be a positive number"),
    ("{slurmrestd: 'http://x'}", "safeScaleIn: missing key jwtSecret"),
    ("{slurmrestd: 'http://x', jwtSecret: a/b, foo: 1}", "safeScaleIn: unknown key(s) foo"),
])
def test_config_validation(options: str, message: str) -> None:
    with pytest.raises(MappingError) as error:
        parse_mappings({"mappings": f"- {{mirror: a/m, machineDeployment: b/md, safeScaleIn: {options}}}"}, "slime")
    assert message in str(error.value)


def test_config_defaults() -> None:
    table = parse_mappings({"mappings": "- {mirror: a/m, machineDeployment: b/md, safeScaleIn: "
                                        "{slurmrestd: 'http://slurm-restapi.slurm:6820/', jwtSecret: slurm/k}}"}, "slime")
    (mapping,) = table
    config = mapping.safe_scale_in
    assert config is not None and config.slurmrestd == "http://slurm-restapi.slurm:6820"
    assert (config.jwt_key, config.api_version, config.drain_timeout_seconds, config.token_user) == ("jwt_hs256.key", None, 3600.0, "slurm")
    assert parse_mappings({"mappings": "- {mirror: a/m, machineDeployment: b/md}"}, "slime").get("a", "m").safe_scale_in is None
