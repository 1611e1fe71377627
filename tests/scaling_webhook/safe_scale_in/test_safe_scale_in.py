"""Safe scale-in against kubemu and a fake slurmrestd (it answers as real slurmrestd 24.11), through the real service.

The scale-in cannot fail open: a hook is released only when Slurm, read for that Machine at that
moment, lets it go; no timeout and no outage releases a busy node; drains SliMe leaves behind are
undone; an administrator's drain is never undone. Nothing is lost either: a released node goes
back to FUTURE, so its record stays for the pool (``releasedNodes: delete`` deletes it).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from common.events import EventRecorder
from common.kube import local_client
from common.metrics import WebhookMetrics
from common.names import (
    DELETE_MACHINE_ANNOTATION,
    HOOK_OWNER,
    LEGACY_PRE_DRAIN_HOOK,
    SCALING_COMPONENT,
    SLURM_NODE_ANNOTATION,
)
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import Mapping, MappingError, parse_mappings
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.safe_scale_in.service import SafeScaleIn, Seen
from scaling_webhook.safe_scale_in.victims import order_candidates
from scaling_webhook.slurm.endpoint import SLURM_API_VERSIONS
from scaling_webhook.slurm.machines import DRAIN_REASON
from scaling_webhook.slurm.slurmrestd import SlurmNode
from testbed.components.capi_sim import MD, MD_NS, MIRROR, Env, PoolInvariant, safe_config_map
from testbed.components.fake_slurmrestd import FakeSlurmrestd
from testbed.components.slurmrestd_dialects import DIALECTS, HEALTH_PATHS, SERVED
from testbed.framework.objects import CAPI, SLIME_NAMESPACE
from testbed.framework.wait import wait_for
from testbed.framework.world import md_events, md_replicas

IDLE, ALLOCATED = ["IDLE", "DYNAMIC_NORM"], ["ALLOCATED", "DYNAMIC_NORM"]


def test_the_scale_to_zero_bounce_keeps_the_node_with_the_long_job(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    e.slurm.start_job("node-001", time.time() + 60)
    e.slurm.start_job("node-002", time.time() + 3600)  # the long one: node X
    e.slurm.start_job("node-003", time.time() + 120)
    e.slurm.finish_jobs("node-001")
    e.slurm.finish_jobs("node-003")
    e.scale(scaling, 1)
    assert sorted(e.annotated()) == ["md-001", "md-003"]
    assert md_replicas(e.emulator, MD_NS, MD) == 1
    assert e.slurm.state("node-002") == ALLOCATED  # X never drained, never marked
    assert "DRAIN" in e.slurm.state("node-001") and "DRAIN" in e.slurm.state("node-003")
    assert e.capi.machine("md-001")["metadata"]["annotations"][SLURM_NODE_ANNOTATION] == "node-001"
    e.capi.step()  # CAPI deletes the marked Machines; the pre-terminate hook holds them
    assert e.hooked("md-001") and e.capi.machine("md-001")["metadata"].get("deletionTimestamp")
    scaling.reconcile()  # nodes drained: back to FUTURE in Slurm, then the hook goes
    e.capi.step()
    assert [m["metadata"]["name"] for m in e.capi.machines()] == ["md-002"]
    assert sorted(e.slurm.returned) == ["node-001", "node-003"] and e.slurm.deleted == []
    assert e.slurm.state("node-001") == ["FUTURE", "DYNAMIC_NORM"]  # the record stays, DRAIN cleared
    assert e.capi.violations == [] and e.slurm.violations == []
    assert scaling.metric("slime_scaling_scale_in_victims_total") == 2
    assert all(claims["sun"] == "slurm" and claims["exp"] - claims["iat"] == 60 for claims in e.slurm.tokens_seen)


def test_too_few_idle_nodes_defers_and_reconciler_finishes(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    for node in ("node-001", "node-002"):
        e.slurm.start_job(node, time.time() + 600)
    e.scale(scaling, 0)
    assert e.annotated() == ["md-003"] and md_replicas(e.emulator, MD_NS, MD) == 2
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "ScaleInDeferred")[:1], what="the deferral event")
    assert (
        event["type"] == "Warning"
        and "2 replica(s) deferred" in event["message"]
        and "md-001 (ALLOCATED)" in event["message"]
    )
    assert (scaling.metric("slime_scaling_scale_in_deferred_total") or 0) >= 2
    e.slurm.finish_jobs("node-001")
    scaling.reconcile()
    assert md_replicas(e.emulator, MD_NS, MD) == 1 and sorted(e.annotated()) == ["md-001", "md-003"]
    e.slurm.finish_jobs("node-002")
    scaling.reconcile()
    assert md_replicas(e.emulator, MD_NS, MD) == 0


def test_slurmrestd_down_no_scale_in_but_scale_up_works(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    e.slurm.stop()
    e.scale(scaling, 1)
    assert e.annotated() == [] and md_replicas(e.emulator, MD_NS, MD) == 3
    (event,) = wait_for(
        lambda: md_events(e.emulator, MD_NS, MD, "SlurmUnavailable")[:1], what="the SlurmUnavailable event"
    )
    assert event["type"] == "Warning" and "cannot reach slurmrestd" in event["message"]
    assert "eyJ" not in event["message"]  # never a token
    scaling.reconcile()
    assert e.annotated() == [] and md_replicas(e.emulator, MD_NS, MD) == 3
    e.scale(scaling, 5)
    assert md_replicas(e.emulator, MD_NS, MD) == 5
    assert (scaling.metric("slime_scaling_slurm_errors_total") or 0) >= 2


def test_slurmrestd_errors_mean_no_scale_in(env: Callable[[int], Env]) -> None:
    e = env(2)
    scaling = e.scaling(apiVersion="v0.0.42")
    e.slurm.fail_status = 500
    e.scale(scaling, 0)
    assert e.annotated() == [] and md_replicas(e.emulator, MD_NS, MD) == 2
    e.slurm.fail_status = None
    scaling.reconcile()
    assert md_replicas(e.emulator, MD_NS, MD) == 0 and sorted(e.annotated()) == ["md-001", "md-002"]
    assert all(path.startswith("/slurm/v0.0.42/") for _, path in e.slurm.calls)


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        (("v0.0.42", "v0.0.43"), "v0.0.43"),  # 25.05
        (("v0.0.44", "v0.0.45"), "v0.0.45"),  # a slurmrestd serving only the newest two
        (SERVED["26.11"], "v0.0.46"),
        (SERVED["26.05"], "v0.0.45"),
        (SERVED["24.11"], "v0.0.42"),
    ],
)
def test_version_probe_uses_the_newest_served(env: Callable[[int], Env], served: tuple[str, ...], chosen: str) -> None:
    e = env(1)
    e.slurm.versions = served
    scaling = e.scaling()
    e.scale(scaling, 0)
    assert md_replicas(e.emulator, MD_NS, MD) == 0
    newer = [v for v in SLURM_API_VERSIONS if v > chosen]
    assert [p for _, p in e.slurm.calls if p.endswith("/ping")][: len(newer) + 1] == [
        f"/slurm/{v}/ping" for v in (*newer, chosen)
    ]
    assert ("GET", f"/slurm/{chosen}/nodes/") in e.slurm.calls


def _token_header(slurm: FakeSlurmrestd) -> dict[str, str]:
    now = int(time.time())
    return {
        "X-SLURM-USER-TOKEN": jwt.encode({"sun": "slurm", "iat": now, "exp": now + 60}, slurm.key, algorithm="HS256")
    }


@pytest.mark.parametrize("slurm", ["26.11"], indirect=True)
def test_safe_scale_in_against_slurm_26_11_without_health_endpoints(
    slurm: FakeSlurmrestd, env: Callable[..., Env]
) -> None:
    """Slurm 26.11's slurmrestd: data parsers v0.0.43 to v0.0.46 only, no /healthz, /readyz, /livez (404, as any
    unknown URL). Safe scale-in speaks v0.0.46, keeps the busy node, releases the idle ones to FUTURE, and never
    asks for a health path."""
    assert slurm.versions == ("v0.0.43", "v0.0.44", "v0.0.45", "v0.0.46")
    for path in HEALTH_PATHS:
        assert httpx.get(f"{slurm.url}{path}", headers=_token_header(slurm), timeout=5).status_code == 404
    asked = len(slurm.calls)
    e = env(3)
    scaling = e.scaling()
    slurm.start_job("node-002", time.time() + 3600)
    e.scale(scaling, 1)
    assert sorted(e.annotated()) == ["md-001", "md-003"] and md_replicas(e.emulator, MD_NS, MD) == 1
    e.capi.step()
    scaling.reconcile()
    e.capi.step()
    assert [m["metadata"]["name"] for m in e.capi.machines()] == ["md-002"]
    assert sorted(slurm.returned) == ["node-001", "node-003"] and slurm.state("node-002") == ALLOCATED
    assert slurm.violations == [] and e.capi.violations == []
    paths = [path for _, path in slurm.calls[asked:]]
    assert paths[0] == "/slurm/v0.0.46/ping" and all(p.startswith("/slurm/v0.0.46/") for p in paths), paths
    assert slurm.health_checks == 0


@pytest.mark.parametrize("slurm", ["26.05"], indirect=True)
def test_slurm_26_05_serves_the_health_paths_the_product_never_uses(
    slurm: FakeSlurmrestd, env: Callable[..., Env]
) -> None:
    """The same scale-in against 26.05, which serves the health paths: SliMe's calls are the same kind (probe, nodes,
    node updates under /slurm/<v>/), none of them a health path."""
    answer = httpx.get(f"{slurm.url}/healthz", headers=_token_header(slurm), timeout=5)
    assert answer.status_code == 204 and slurm.health_checks == 1
    asked = len(slurm.calls)
    e = env(2)
    scaling = e.scaling()
    e.scale(scaling, 0)
    e.capi.step()
    scaling.reconcile()
    assert sorted(slurm.returned) == ["node-001", "node-002"]
    paths = [path for _, path in slurm.calls[asked:]]
    assert paths[:2] == ["/slurm/v0.0.46/ping", "/slurm/v0.0.45/ping"], paths  # v0.0.46 first: 404 on 26.05
    assert all(p.startswith("/slurm/v0.0.45/") for p in paths[1:]) and slurm.health_checks == 1


def test_a_slurmrestd_serving_no_version_slime_speaks_is_named(env: Callable[[int], Env]) -> None:
    e = env(1)
    e.slurm.versions = ("v0.0.40", "v0.0.41")
    scaling = e.scaling()
    e.scale(scaling, 0)
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "SlurmUnavailable")[:1], 15, "the refusal")
    assert f"serves none of {', '.join(SLURM_API_VERSIONS)}" in event["message"]
    assert md_replicas(e.emulator, MD_NS, MD) == 1  # no scale-in while Slurm cannot be read


def test_a_token_slurmrestd_cannot_verify_rereads_the_key_once(env: Callable[[int], Env]) -> None:
    """Real slurmrestd answers 511 (error 1007) to a bad token, not 401: the key is read again."""
    e = env(1)
    scaling = e.scaling(apiVersion="v0.0.42")
    good = e.slurm.key
    e.slurm.key = b"another key"  # the signing key was rotated in Slurm, not yet in the Secret
    e.scale(scaling, 0)
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "SlurmUnavailable")[:1], 15, "the refusal")
    assert "refused the JWT (511) twice" in event["message"]
    e.slurm.key = good
    scaling.reconcile()
    assert md_replicas(e.emulator, MD_NS, MD) == 0


def test_scale_up_reclaims_pending_victims(env: Callable[[int], Env]) -> None:
    e = env(3)
    scaling = e.scaling()
    e.scale(scaling, 1)
    assert sorted(e.annotated()) == ["md-001", "md-002"]  # not deleted yet (CAPI has not acted)
    e.scale(scaling, 2)
    assert e.annotated() == ["md-002"]
    assert e.slurm.state("node-001") == IDLE  # undrained: the drain was ours
    assert md_replicas(e.emulator, MD_NS, MD) == 2
    e.capi.step()
    assert e.capi.counter == 3  # nothing new provisioned
    assert scaling.metric("slime_scaling_reclaimed_total") == 1
    wait_for(lambda: md_events(e.emulator, MD_NS, MD, "Reclaimed"), what="the Reclaimed event")


def _between_the_scales(e: Env) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The API calls from the mirror's /scale to the MachineDeployment's, and those after it (verb, resource, sub).

    A pass already under way when the mirror is scaled (the first pass's hooks wake another) may make its
    upkeep's calls (a Machine list, the JWT Secret) in between; the exact calls of a scale-up are checked
    on a SafeScaleIn of its own below (``standalone``)."""
    calls = [(r.verb, r.resource, r.subresource) for r in e.emulator.requests]
    mirror_scaled = calls.index(("patch", "deployments", "scale"))
    md_written = calls.index(("patch", "machinedeployments", "scale"))
    return calls[mirror_scaled + 1 : md_written], calls[md_written + 1 :]


def test_a_scale_up_writes_the_machine_deployment_before_the_upkeep(env: Callable[[int], Env]) -> None:
    """Between the mirror's scale and the MachineDeployment's there is no read of the MachineDeployment: the
    scale-up is decided from the watched MachineDeployment and Machines. The upkeep (hooks, releases, undrains)
    runs after the write, in the same pass, from the Machine cache and one slurmrestd read: it lists no Machine."""
    e = env(2)
    scaling = e.scaling()
    e.emulator.clear_requests()
    e.scale(scaling, 4)
    assert md_replicas(e.emulator, MD_NS, MD) == 4
    between, after = _between_the_scales(e)
    assert ("get", "machinedeployments", "") not in between, between
    assert ("list", "machines", "") not in between + after
    assert scaling.metric("slime_scaling_scale_up_fallbacks_total") == 0


def test_a_scale_up_reclaims_pending_victims_from_the_machine_cache(env: Callable[[int], Env]) -> None:
    """Right after a scale-down marked its victims, a scale-up takes one back with no read before its writes:
    the reconciler waited for the Machine cache to show the marks it made. The replicas are raised first, the
    mark taken off after: never fewer replicas than unmarked Machines, so Cluster API deletes none of them."""
    e = env(3)
    scaling = e.scaling()
    e.scale(scaling, 1)
    assert sorted(e.annotated()) == ["md-001", "md-002"]
    e.emulator.clear_requests()
    e.scale(scaling, 2)
    assert e.annotated() == ["md-002"] and md_replicas(e.emulator, MD_NS, MD) == 2
    assert e.slurm.state("node-001") == IDLE  # undrained: the drain was ours
    between, after = _between_the_scales(e)
    assert ("get", "machinedeployments", "") not in between, between
    assert ("patch", "machines", "") not in between and ("patch", "machines", "") in after
    assert scaling.metric("slime_scaling_reclaimed_total") == 1


Standalone = tuple[SafeScaleIn, Mapping, ScalingMetrics]


@pytest.fixture
def standalone(env: Callable[[int], Env], tmp_path: Path) -> Iterator[Callable[[int], tuple[Env, Standalone]]]:
    """``standalone(n)``: the pool of ``env(n)`` with a SafeScaleIn of its own and no reconciler, so a test
    decides what the caches are said to hold (:class:`Seen`) and nothing else writes meanwhile."""
    made: list[tuple[SafeScaleIn, EventRecorder]] = []

    def make(replicas: int) -> tuple[Env, Standalone]:
        e = env(replicas)
        client = local_client(e.emulator.write_kubeconfig(tmp_path / "kubeconfig"), SCALING_COMPONENT)
        metrics = ScalingMetrics(WebhookMetrics())
        events = EventRecorder(client, SCALING_COMPONENT, metrics.event_result).start()
        safe = SafeScaleIn(client, MachineDeploymentScaler(client, timeout=2.0), events, metrics)
        made.append((safe, events))
        (mapping,) = parse_mappings(safe_config_map(e.slurm.url)["data"], SLIME_NAMESPACE)
        return e, (safe, mapping, metrics)

    yield make
    for safe, events in made:
        events.stop()
        safe.reads.close()
        safe.client.close()


def _md_version(e: Env) -> str:
    md = e.emulator.get(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD)
    assert md is not None
    return str(md["metadata"]["resourceVersion"])


def _api_calls(e: Env) -> list[tuple[str, str, str, int]]:
    """The resource calls made (not discovery; not Events, which a thread posts whenever it gets to them)."""
    return [
        (r.verb, r.resource, r.subresource, r.status_code)
        for r in e.emulator.requests
        if not r.non_resource and r.resource != "events"
    ]


def _fallbacks(metrics: ScalingMetrics) -> float | None:
    return metrics.webhook.registry.get_sample_value("slime_scaling_scale_up_fallbacks_total")


def test_a_scale_up_from_the_caches_reads_nothing_before_its_write(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """No GET of the MachineDeployment, no list of its Machines: the one call is the conditional write."""
    e, (safe, mapping, metrics) = standalone(2)
    seen = Seen(2, _md_version(e), e.capi.machines())
    e.emulator.clear_requests()
    assert safe.apply(mapping, 4, seen=seen).replicas == 4
    assert _api_calls(e) == [("patch", "machinedeployments", "scale", 200)]
    assert md_replicas(e.emulator, MD_NS, MD) == 4 and _fallbacks(metrics) == 0


def test_a_scale_up_from_the_caches_reclaims_the_cached_pending_victims(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    e, (safe, mapping, _) = standalone(3)
    safe.apply(mapping, 1)
    seen = Seen(1, _md_version(e), e.capi.machines())
    e.emulator.clear_requests()
    assert safe.apply(mapping, 2, seen=seen).reclaimed == ["md-001"]
    assert _api_calls(e) == [("patch", "machinedeployments", "scale", 200), ("patch", "machines", "", 200)]
    assert e.annotated() == ["md-002"] and e.slurm.state("node-001") == IDLE


def test_a_scale_up_from_a_stale_cache_is_refused_and_redone_from_fresh_reads(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """The cache saw the MachineDeployment at 2; someone set it to 3 since. The conditional write is refused
    (409) and the scale-up is done again as without the cache: fresh read, unconditional write, fresh list."""
    e, (safe, mapping, metrics) = standalone(2)
    seen = Seen(2, _md_version(e), e.capi.machines())
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"replicas": 3}})
    e.emulator.clear_requests()
    outcome = safe.apply(mapping, 4, seen=seen)
    assert md_replicas(e.emulator, MD_NS, MD) == 4
    assert (outcome.previous, outcome.replicas) == (3, 4)
    calls = _api_calls(e)
    assert calls == [
        ("patch", "machinedeployments", "scale", 409),
        ("get", "machinedeployments", "", 200),
        ("patch", "machinedeployments", "scale", 200),
        ("list", "machines", "", 200),
    ]
    assert _fallbacks(metrics) == 1


def test_a_refused_scale_up_does_not_reclaim_twice(standalone: Callable[[int], tuple[Env, Standalone]]) -> None:
    """The write comes before the reclaim, so a refused write takes nothing back; the redo takes back one Machine
    for one replica more (the other stays marked for deletion)."""
    e, (safe, mapping, metrics) = standalone(3)
    assert sorted(safe.apply(mapping, 1).victims) == ["md-001", "md-002"]
    seen = Seen(1, _md_version(e), e.capi.machines())
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"metadata": {"labels": {"edited": "by-hand"}}})
    outcome = safe.apply(mapping, 2, seen=seen)
    assert (outcome.reclaimed, outcome.replicas) == (["md-001"], 2)
    assert e.annotated() == ["md-002"] and md_replicas(e.emulator, MD_NS, MD) == 2
    assert _fallbacks(metrics) == 1


def test_a_scale_up_lists_the_machines_while_their_cache_has_not_listed(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    e, (safe, mapping, metrics) = standalone(2)
    e.emulator.clear_requests()
    outcome = safe.apply(mapping, 3, seen=Seen(2, _md_version(e), machines=None))
    assert outcome.replicas == 3 and md_replicas(e.emulator, MD_NS, MD) == 3
    calls = _api_calls(e)
    assert calls == [("patch", "machinedeployments", "scale", 200), ("list", "machines", "", 200)]
    assert _fallbacks(metrics) == 0


def test_an_admins_drain_is_never_undone(env: Callable[[int], Env]) -> None:
    """An admin drains an idle node for maintenance; scale-downs leave it for last, and a reclaim keeps its drain."""
    e = env(3)
    scaling = e.scaling()
    e.slurm.admin_drain("node-001", "maintenance: disk swap")
    e.scale(scaling, 2)
    assert e.annotated() == ["md-002"]  # an idle node goes before the admin's
    e.slurm.start_job("node-002", time.time() + 600)  # (reclaim below gives node-002 back; jobs land on it)
    e.scale(scaling, 3)
    e.slurm.start_job("node-003", time.time() + 600)
    e.scale(scaling, 2)  # the only idle node now is the admin's
    assert e.annotated() == ["md-001"]
    e.scale(scaling, 3)  # reclaimed: the mark goes, the admin's drain stays
    assert e.annotated() == []
    node = e.slurm.nodes["node-001"]
    assert node.drain and node.reason == "maintenance: disk swap" and node.reason_set_by_user == "root"
    assert "node-001" not in e.slurm.undrains


def test_a_drain_left_behind_is_undone_when_no_scale_in_needs_it(env: Callable[[int], Env]) -> None:
    """A scale-in drained a node and stopped before marking its Machine: the node must not stay drained for good."""
    e = env(2)
    scaling = e.scaling()
    # The fault must not meet the first pass's hooks: a failed hook patch ends the pass before any scale-in, so
    # nothing is drained (readiness comes before that pass ends; under -n 2 the fault once landed first).
    wait_for(lambda: e.hooked("md-001") and e.hooked("md-002"), 10, "the pre-terminate hooks of the first reconcile")
    # Marking the victim keeps failing (the API hiccups) through every pass, the background ones too.
    e.emulator.add_fault(_patch_fault("md-001", times=1000))
    e.scale(scaling, 1)
    assert e.slurm.nodes["node-001"].drain and e.annotated() == []
    e.scale(scaling, 2)  # the scale-in is no longer needed
    scaling.reconcile()
    assert not e.slurm.nodes["node-001"].drain and "node-001" in e.slurm.undrains
    assert scaling.metric("slime_scaling_orphan_drains_undone_total") == 1
    wait_for(lambda: md_events(e.emulator, MD_NS, MD, "OrphanDrainUndone"), what="the event")


def _patch_fault(machine: str, times: int):  # type: ignore[no-untyped-def]
    from kubemu import Fault

    return Fault(method="PATCH", path_regex=rf"/machines/{machine}$", status=500, times=times)


def test_pre_drain_hook_waits_for_the_drain(env: Callable[[int], Env]) -> None:
    e = env(2)
    scaling = e.scaling()
    # The leader's first pass adds the hooks; the service answers /readyz before that pass ends
    # (under load this showed: once in about 20 runs the hooks were not there yet at readiness).
    wait_for(lambda: e.hooked("md-001") and e.hooked("md-002"), 10, "the pre-terminate hooks of the first reconcile")
    e.slurm.start_job("node-001", time.time() + 60)
    e.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-001")  # someone deletes it directly
    scaling.reconcile()
    assert e.slurm.state("node-001") == ["ALLOCATED", "DRAIN", "DYNAMIC_NORM"] and e.hooked("md-001")
    e.capi.step()
    assert e.capi.machine("md-001") is not None  # held
    e.slurm.finish_jobs("node-001")
    scaling.reconcile()
    assert "node-001" in e.slurm.returned and not e.hooked("md-001")
    e.capi.step()
    assert e.capi.machine("md-001") is None and e.capi.violations == []


def test_a_machine_cluster_api_creates_gets_the_hook_on_its_watch_event(env: Callable[[int], Env]) -> None:
    """No resync (it is an hour here) and no scale: the new Machine's own watch event wakes the reconciler.

    Without it, a Machine deleted before the next pass (30 s by default) would not be held, even
    if its node had joined Slurm and taken a job meanwhile.
    """
    e = env(1)
    e.scaling()
    created = e.capi.add_machine()  # Cluster API creates a Machine (a scale-up by someone, or a replacement)
    wait_for(lambda: e.hooked(created), 5, f"the pre-terminate hook on {created}")


def test_a_drain_timeout_warns_and_never_releases_a_busy_node(env: Callable[[int], Env]) -> None:
    e = env(2)
    scaling = e.scaling(drainTimeoutSeconds=2)
    e.slurm.start_job("node-001", time.time() + 3600)
    e.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-001")
    scaling.reconcile()
    assert e.hooked("md-001")
    time.sleep(3.1)  # deletionTimestamp has a one-second resolution
    scaling.reconcile()
    scaling.reconcile()
    assert e.hooked("md-001") and "node-001" not in e.slurm.returned  # still held: it runs a job
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "DrainOverdue"), what="the DrainOverdue Warning")
    assert event["type"] == "Warning" and "md-001" in event["message"] and "never released" in event["message"]
    assert scaling.metric("slime_scaling_drain_overdue_total") == 1  # warned once, not every pass
    e.slurm.finish_jobs("node-001")
    scaling.reconcile()
    assert not e.hooked("md-001") and "node-001" in e.slurm.returned


def test_nothing_is_released_while_slurmrestd_is_unreachable(env: Callable[[int], Env]) -> None:
    e = env(2)
    scaling = e.scaling(drainTimeoutSeconds=1)
    e.slurm.start_job("node-001", time.time() + 3600)
    e.emulator.delete("cluster.x-k8s.io/v1beta1", "Machine", MD_NS, "md-001")
    scaling.reconcile()
    e.slurm.stop()
    time.sleep(2.1)
    for _ in range(3):
        scaling.reconcile()
    assert e.hooked("md-001")
    e.capi.step()
    assert e.capi.machine("md-001") is not None and e.capi.violations == []


def test_a_victim_that_joins_after_it_was_chosen_is_drained_and_waited_for(env: Callable[[int], Env]) -> None:
    """The release race: a node that joins between a read of Slurm and its Machine's release must not be lost."""
    e = env(1)
    scaling = e.scaling()
    e.capi.add_machine(join=False, provisioned=True)  # md-002: provisioned, slurmd not joined yet
    e.emulator.patch("cluster.x-k8s.io/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"replicas": 2}})
    e.scale(scaling, 1)  # md-002 (no Slurm node) is a victim, after the idle node? no: md-001 is idle, so md-001
    victims = e.annotated()
    assert victims == ["md-001"]
    # Now the other way round: md-002 is the only candidate, and joins while it is held.
    e.slurm.start_job("node-001", time.time() + 3600)
    e.scale(scaling, 2)
    e.scale(scaling, 1)
    assert e.annotated() == ["md-002"]
    e.capi.step()
    joined = threading.Event()

    def join_after_the_first_read() -> None:
        if not joined.is_set():
            e.capi.provision("md-002")  # slurmd joins right after SliMe read the node list
            joined.set()

    e.slurm.after_nodes_read = join_after_the_first_read
    scaling.reconcile()
    # The fake runs the hook after its answer is sent, in its own thread: the pass may return before the join.
    assert joined.wait(10), "the node list was never read"
    # The background reconciler may run a pass too (the deletion's watch event): it sees the node that
    # joined, drains it and, drained and idle, may release it (back to FUTURE in Slurm first, the hook off
    # the Machine after). Never released undrained. Under the fake's lock no pass can release the node
    # between the look and the job that makes it busy.
    with e.slurm.lock:
        listed = "node-002" in e.slurm.nodes
        if listed:
            e.slurm.start_job("node-002", time.time() + 3600)  # a job lands on the node that just joined
    if not listed:
        assert "node-002" in e.slurm.drains, "a provisioned Machine was released before its node was drained"
        return
    scaling.reconcile()
    assert e.hooked("md-002") and e.slurm.nodes["node-002"].drain
    e.capi.step()
    assert e.capi.violations == []


def test_a_never_provisioned_victim_is_released_with_its_evidence(env: Callable[[int], Env]) -> None:
    e = env(1)
    scaling = e.scaling()
    e.slurm.start_job("node-001", time.time() + 3600)
    e.capi.add_machine(join=False, provisioned=False)  # md-002: its host never provisioned
    e.emulator.patch("cluster.x-k8s.io/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"replicas": 2}})
    e.scale(scaling, 2)
    e.scale(scaling, 1)
    assert e.annotated() == ["md-002"]
    e.capi.step()
    scaling.reconcile()
    assert not e.hooked("md-002")
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "ReleasedNeverJoined"), what="the release event")
    assert "never joined Slurm and its infrastructure was never provisioned" in event["message"]


@pytest.mark.parametrize("kubelet", [False, True], ids=["hosts-without-a-node", "hosts-with-a-kubelet"])
def test_randomized_simulation_never_removes_a_busy_node(env: Callable[..., Env], kubelet: bool) -> None:
    """Both bootstrap styles, with CAPI v1.14's rules: a host without a kubelet never gets a nodeRef, so a
    pre-drain hook would not hold its Machine; SliMe's pre-terminate hook holds it either way."""
    rng = random.Random(20240611)
    e = env(4, kubelet=kubelet)
    scaling = e.scaling()
    annotated_busy: list[str] = []
    for _ in range(100):
        for name, node in list(e.slurm.nodes.items()):  # jobs start on usable nodes, others end
            if node.jobs and rng.random() < 0.4:
                e.slurm.finish_jobs(name)
            elif not node.jobs and not node.drain and rng.random() < 0.4:
                e.slurm.start_job(name, time.time() + rng.randint(10, 1000))
        e.scale(scaling, rng.randint(0, 6))
        for machine in e.capi.machines():
            if (machine["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION):
                node = e.slurm.nodes.get(e.capi.node_of(machine))
                if node is not None and node.busy and not node.drain:
                    annotated_busy.append(machine["metadata"]["name"])
        if rng.random() < 0.3:
            scaling.reconcile()
        live = e.capi.live()
        if live and rng.random() < 0.1:  # someone else deletes a Machine: a rolling update, a remediation
            e.emulator.delete(f"{CAPI}/v1beta1", "Machine", MD_NS, rng.choice(live)["metadata"]["name"])
        e.capi.step()
    assert annotated_busy == []
    assert scaling.metric("slime_scaling_scale_in_victims_total") > 0  # the scenario did exercise scale-in
    assert e.slurm.violations == [] and e.capi.violations == []
    for name in list(e.slurm.nodes):
        e.slurm.finish_jobs(name)
    for _ in range(4):
        scaling.reconcile()
        e.capi.step()
    mirror = e.emulator.get("apps/v1", "Deployment", "slime-system", "mirror-deployment")["spec"]["replicas"]
    assert md_replicas(e.emulator, MD_NS, MD) == mirror
    live = [m for m in e.capi.machines() if not m["metadata"].get("deletionTimestamp")]
    assert len(live) == mirror


# --- what a released node becomes in Slurm (releasedNodes) ----------------------------------------


def _partition_nodes(slurm: FakeSlurmrestd) -> int:
    """The partition's node count, as slurmrestd lists it (what Slurm checks a job's node count
    against at submission)."""
    now = int(time.time())
    token = jwt.encode({"sun": "slurm", "iat": now, "exp": now + 60}, slurm.key, algorithm="HS256")
    newest = slurm.versions[-1]
    answer = httpx.get(f"{slurm.url}/slurm/{newest}/partitions/", headers={"X-SLURM-USER-TOKEN": token}, timeout=5)
    (partition,) = answer.json()["partitions"]
    return int(partition["nodes"]["total"])


@pytest.mark.parametrize("slurm", sorted(DIALECTS), indirect=True)
def test_scale_in_to_zero_keeps_the_pools_records_and_its_hosts_take_them_again(
    slurm: FakeSlurmrestd, env: Callable[..., Env]
) -> None:
    """The pool's hosts were declared FUTURE; after a scale-in to 0 Slurm still has their records, and they come back.
    On 24.11 the drain reason outlives the drain until the node next runs a job; 26.05 clears it."""
    for host in ("bm-1", "bm-2"):
        slurm.declare_future(host)  # scontrol create NodeName=bm-[1-2] State=FUTURE
    e = env(2, hosts=("bm-1", "bm-2"))
    assert sorted(slurm.nodes) == ["bm-1", "bm-2"] and slurm.future == {}  # each slurmd -Z took its record
    scaling = e.scaling()
    e.scale(scaling, 0)
    e.capi.step()
    scaling.reconcile()
    e.capi.step()
    assert e.capi.machines() == [] and md_replicas(e.emulator, MD_NS, MD) == 0
    assert slurm.nodes == {} and sorted(slurm.returned) == ["bm-1", "bm-2"] and slurm.deleted == []
    assert slurm.state("bm-1") == slurm.state("bm-2") == ["FUTURE", "DYNAMIC_NORM"]
    assert _partition_nodes(slurm) == 2  # a 2-node job is still accepted and queues
    events = wait_for(
        lambda: (found := md_events(e.emulator, MD_NS, MD, "SlurmNodeReturnedToFuture")) and len(found) == 2 and found,
        what="two SlurmNodeReturnedToFuture events",
    )
    assert all("drained and idle, returned to FUTURE: Slurm keeps its record" in event["message"] for event in events)
    assert md_events(e.emulator, MD_NS, MD, "SlurmNodeDeleted") == []
    e.scale(scaling, 2)  # the pool grows again: the hosts boot, their slurmd -Z take the records
    e.capi.step()
    assert sorted(slurm.nodes) == ["bm-1", "bm-2"] and slurm.future == {}
    left_reason = DRAIN_REASON if slurm.dialect.reason_outlives_drain else ""
    assert slurm.state("bm-1") == IDLE and slurm.nodes["bm-1"].reason == left_reason  # no DRAIN either way
    scaling.reconcile()
    assert all(e.hooked(m["metadata"]["name"]) for m in e.capi.machines())
    e.scale(scaling, 1)  # an old reason without DRAIN is not a drain of ours: an idle node like any other
    assert e.annotated() == ["md-003"] and slurm.violations == [] and e.capi.violations == []


def test_released_nodes_delete_deletes_the_record(env: Callable[..., Env]) -> None:
    e = env(2)
    scaling = e.scaling(releasedNodes="delete")
    e.scale(scaling, 0)
    e.capi.step()
    scaling.reconcile()
    e.capi.step()
    assert e.capi.machines() == [] and sorted(e.slurm.deleted) == ["node-001", "node-002"] and e.slurm.returned == []
    assert (
        e.slurm.state("node-001") is None and _partition_nodes(e.slurm) == 0
    )  # a job for the pool would now be refused
    events = wait_for(
        lambda: (found := md_events(e.emulator, MD_NS, MD, "SlurmNodeDeleted")) and len(found) == 2 and found,
        what="two SlurmNodeDeleted events",
    )
    assert all("drained and idle, deleted from Slurm (releasedNodes: delete)" in event["message"] for event in events)


def test_a_node_someone_deletes_during_the_release_is_released_as_gone(env: Callable[..., Env]) -> None:
    e = env(1)
    scaling = e.scaling()
    e.scale(scaling, 0)
    e.capi.step()

    def an_admin_deletes_it() -> None:  # scontrol delete nodename=node-001, right after SliMe read that node
        e.slurm.after_node_read = None
        with e.slurm.lock:
            e.slurm.nodes.pop("node-001", None)

    e.slurm.after_node_read = an_admin_deletes_it
    scaling.reconcile()
    assert not e.hooked("md-001") and e.slurm.returned == []
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "ReleasedNeverJoined")[:1], what="the release event")
    assert "already gone from Slurm (removed by someone else): no record left to keep" in event["message"]


def test_a_node_gone_since_the_passs_list_is_released_on_the_fresh_read(env: Callable[..., Env]) -> None:
    """The pass's list shows the node drained and idle; the read that decides the release shows it gone."""
    e = env(1)
    scaling = e.scaling()
    e.scale(scaling, 0)
    e.capi.step()

    def an_admin_deletes_it() -> None:  # right after SliMe read the node list, before it reads the node
        e.slurm.after_nodes_read = None
        with e.slurm.lock:
            e.slurm.nodes.pop("node-001", None)

    e.slurm.after_nodes_read = an_admin_deletes_it
    scaling.reconcile()
    assert not e.hooked("md-001") and e.slurm.returned == [] and e.slurm.deleted == []
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "ReleasedNeverJoined")[:1], what="the release event")
    assert event["message"] == "Machine md-001: Slurm node node-001 is gone; deletion may proceed"


def test_a_future_slurm_refuses_holds_the_machine_until_slurm_shows_the_node_gone(env: Callable[..., Env]) -> None:
    """Someone returns the node to FUTURE between SliMe's fresh read of the node and its own request:
    Slurm refuses (2180), nothing is released that pass."""
    e = env(1)
    scaling = e.scaling()
    e.scale(scaling, 0)
    e.capi.step()

    def an_admin_returns_it_to_future() -> None:  # scontrol update nodename=node-001 state=future
        e.slurm.after_node_read = None
        e.slurm.admin_future("node-001")

    e.slurm.after_node_read = an_admin_returns_it_to_future
    scaling.reconcile()
    (event,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "SlurmUnavailable")[:1], 15, "the refusal")
    assert "not releasing Machine md-001" in event["message"] and "(Invalid node state transition)" in event["message"]
    assert (scaling.metric("slime_scaling_slurm_errors_total") or 0) >= 1
    scaling.reconcile()
    assert not e.hooked(
        "md-001"
    )  # the next read shows the node gone (FUTURE is not listed): its recorded node joined and left
    assert e.slurm.state("node-001") == ["FUTURE", "DYNAMIC_NORM"] and e.capi.violations == []


# --- pure parts -------------------------------------------------------------------------------


def _machine(name: str, host: str, deleting: bool = False, provisioned: bool = True) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "2024-01-01T00:00:00Z"} if deleting else {})}
    return {
        "metadata": meta,
        "status": {"infrastructureReady": provisioned, "addresses": [{"type": "InternalIP", "address": host}]},
    }


def test_order_candidates() -> None:
    nodes = [
        SlurmNode("n1", address="10.0.0.1", states=frozenset({"IDLE"})),
        SlurmNode("n2", address="10.0.0.2", states=frozenset({"MIXED"})),
        SlurmNode("n3", address="10.0.0.3", states=frozenset({"IDLE", "DRAIN"}), reason=DRAIN_REASON),
        SlurmNode("n4", address="10.0.0.4", states=frozenset({"ALLOCATED", "DRAIN"})),
        SlurmNode("n5", address="10.0.0.5", states=frozenset({"IDLE", "COMPLETING"})),
        SlurmNode("n6", address="10.0.0.6", states=frozenset({"IDLE", "DRAIN"}), reason="maintenance"),
        SlurmNode("n7", address="10.0.0.7", states=frozenset({"DOWN", "NOT_RESPONDING"})),
        SlurmNode("n8", address="10.0.0.8", states=frozenset({"DOWN", "ALLOCATED", "NOT_RESPONDING"})),
    ]
    machines = [_machine(f"m{i}", f"10.0.0.{i}") for i in range(1, 9)]
    machines += [
        _machine("m9", "10.0.0.9", provisioned=False),
        _machine("ma", "10.0.0.10"),
        _machine("m0", "10.0.0.1", deleting=True),
    ]
    eligible, ineligible = order_candidates(machines, nodes)
    # not provisioned < DOWN < drained by us < idle < provisioned but not joined < an admin's drain
    assert [c.machine for c in eligible] == ["m9", "m7", "m3", "m1", "ma", "m6"]
    assert {c.machine: c.why for c in ineligible} == {
        "m0": "already deleting",
        "m2": "MIXED",
        "m4": "ALLOCATED",
        "m5": "COMPLETING",
        "m8": "ALLOCATED",
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            "{slurmrestd: 'ftp://x', jwtSecret: a/b}",
            "safeScaleIn.slurmrestd: 'ftp://x' is not an http:// or https:// URL",
        ),
        (
            "{slurmrestd: 'http://x:6820', jwtSecret: b}",
            "safeScaleIn.jwtSecret: 'b' is not of the form <namespace>/<name>",
        ),
        ("{slurmrestd: 'http://x', jwtSecret: a/b, apiVersion: v0.0.41}", "apiVersion: 'v0.0.41' is not supported"),
        (
            "{slurmrestd: 'http://x', jwtSecret: a/b, drainTimeoutSeconds: 0}",
            "drainTimeoutSeconds: must be a positive number",
        ),
        ("{slurmrestd: 'http://x'}", "safeScaleIn: missing key jwtSecret"),
        ("{slurmrestd: 'http://x', jwtSecret: a/b, foo: 1}", "safeScaleIn: unknown key(s) foo"),
        (
            "{slurmrestd: 'http://x', jwtSecret: a/b, releasedNodes: keep}",
            "safeScaleIn.releasedNodes: 'keep' is not one of future, delete",
        ),
        (
            "{slurmrestd: 'http://x', jwtSecret: a/b, releasedNodes: true}",
            "safeScaleIn.releasedNodes: True is not one of future, delete",
        ),
    ],
)
def test_config_validation(options: str, message: str) -> None:
    with pytest.raises(MappingError) as error:
        parse_mappings(
            {"mappings": f"- {{mirror: a/m, machineDeployment: b/md, maxReplicas: 100, safeScaleIn: {options}}}"},
            "slime",
        )
    assert message in str(error.value)


def test_config_defaults() -> None:
    table = parse_mappings(
        {
            "mappings": "- {mirror: a/m, machineDeployment: b/md, maxReplicas: 100, safeScaleIn: "
            "{slurmrestd: 'http://slurm-restapi.slurm:6820/', jwtSecret: slurm/k}}"
        },
        "slime",
    )
    (mapping,) = table
    config = mapping.safe_scale_in
    assert config is not None and config.slurmrestd == "http://slurm-restapi.slurm:6820"
    # No drain timeout unless an operator sets one (and then it only warns).
    assert (config.jwt_key, config.api_version, config.drain_timeout_seconds, config.token_user) == (
        "jwt_hs256.key",
        None,
        None,
        "slurm",
    )
    # A released node's record is kept (FUTURE) unless the mapping says delete.
    assert config.released_nodes == "future"
    (deleting,) = parse_mappings(
        {
            "mappings": "- {mirror: a/m, machineDeployment: b/md, maxReplicas: 100, safeScaleIn: "
            "{slurmrestd: 'http://x', jwtSecret: a/b, releasedNodes: delete}}"
        },
        "slime",
    )
    assert deleting.safe_scale_in is not None and deleting.safe_scale_in.released_nodes == "delete"
    assert (
        parse_mappings({"mappings": "- {mirror: a/m, machineDeployment: b/md, maxReplicas: 100}"}, "slime")
        .get("a", "m")
        .safe_scale_in
        is None
    )


def test_a_pre_drain_hook_alone_does_not_hold_a_machine_without_a_node(env: Callable[..., Env]) -> None:
    """What CAPI v1.14 does (and the stand-in with it): the hook SliMe before 0.2 set lets a busy host go."""
    e = env(1)
    e.slurm.start_job("node-001", time.time() + 600)
    e.emulator.patch(
        f"{CAPI}/v1beta1",
        "Machine",
        MD_NS,
        "md-001",
        {"metadata": {"annotations": {LEGACY_PRE_DRAIN_HOOK: HOOK_OWNER}}},
    )
    e.emulator.delete(f"{CAPI}/v1beta1", "Machine", MD_NS, "md-001")
    assert e.capi.step() == ["md-001"]
    assert e.capi.violations == ["deprovisioned md-001 while node node-001 ran jobs"]


def test_the_legacy_pre_drain_hook_is_replaced_by_the_pre_terminate_hook(env: Callable[..., Env]) -> None:
    e = env(2)
    for name in ("md-001", "md-002"):
        e.emulator.patch(
            f"{CAPI}/v1beta1",
            "Machine",
            MD_NS,
            name,
            {"metadata": {"annotations": {LEGACY_PRE_DRAIN_HOOK: HOOK_OWNER}}},
        )
    scaling = e.scaling()
    wait_for(lambda: all(e.hooked(n) for n in ("md-001", "md-002")), 10, "the pre-terminate hooks")
    for machine in e.capi.machines():
        assert LEGACY_PRE_DRAIN_HOOK not in machine["metadata"]["annotations"]
    e.slurm.start_job("node-001", time.time() + 600)
    e.scale(scaling, 0)
    e.capi.step()
    assert e.capi.violations == [] and e.hooked("md-001")  # busy: held by the new hook, no nodeRef needed


# --- the order of writes: Cluster API deletes exactly the marked Machines ---------------------------------------


def test_a_scale_up_that_meets_a_scale_in_in_progress_never_leaves_unmarked_surplus(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """A scale-in marked two victims and lowered the replicas; before Cluster API deletes them, a reservation
    raises the mirror. Taking the marks off first would leave, write by write, fewer replicas than unmarked
    Machines: the replicas are raised first, in one conditional write, and the marks come off after."""
    e, (safe, mapping, _) = standalone(3)
    invariant = PoolInvariant(e.emulator).install()
    assert sorted(safe.apply(mapping, 1).victims) == ["md-001", "md-002"]
    outcome = safe.apply(mapping, 3, seen=Seen(1, _md_version(e), e.capi.machines()))
    assert (outcome.replicas, sorted(outcome.reclaimed)) == (3, ["md-001", "md-002"])
    assert invariant.broken == []
    e.capi.step()
    assert e.capi.removed == [] and e.capi.violations == []


def test_a_partial_scale_up_reclaims_only_what_the_replicas_leave_room_for(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    e, (safe, mapping, _) = standalone(4)
    invariant = PoolInvariant(e.emulator).install()
    assert len(safe.apply(mapping, 1).victims) == 3
    outcome = safe.apply(mapping, 2, seen=Seen(1, _md_version(e), e.capi.machines()))
    assert (outcome.replicas, len(outcome.reclaimed)) == (2, 1)
    assert invariant.broken == [] and len(e.annotated()) == 2
    e.capi.step()
    assert sorted(e.capi.removed) == [] and e.capi.violations == []  # the two marked go, held by their hooks


def test_a_scale_in_while_machines_are_being_created_never_lowers_below_them(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """The MachineDeployment asks for 4; Cluster API has made 2 Machines so far, both busy. A scale-in to 2 must
    not give up the 2 unmade replicas for free: Cluster API may create them between SliMe's read and its write,
    and would then delete 2 unmarked Machines, busy ones among them. Nothing idle to mark: nothing is lowered."""
    e, (safe, mapping, _) = standalone(2)
    invariant = PoolInvariant(e.emulator).install()
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"replicas": 4}})
    for node in ("node-001", "node-002"):
        e.slurm.start_job(node, end=time.time() + 3600)
    outcome = safe.apply(mapping, 2)
    assert outcome.replicas is None and outcome.deferred == 2 and invariant.broken == []
    assert md_replicas(e.emulator, MD_NS, MD) == 4
    e.capi.step()  # the two Machines are made
    assert len(e.capi.live()) == 4 and e.capi.violations == []


def test_a_scale_in_while_machines_are_being_created_marks_before_it_lowers(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    e, (safe, mapping, _) = standalone(2)
    invariant = PoolInvariant(e.emulator).install()
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"replicas": 4}})
    outcome = safe.apply(mapping, 2)  # the two existing Machines are idle: marked, and only then the replicas go
    assert (outcome.replicas, sorted(outcome.victims)) == (2, ["md-001", "md-002"]) and invariant.broken == []
    e.capi.step()  # had Cluster API made the two others before the write, the two marked would go now
    assert sorted(m["metadata"]["name"] for m in e.capi.live()) == ["md-001", "md-002"]
    # It had not: the replicas leave room for the marked ones, so the next upkeep takes them back.
    safe.maintain(mapping, scale_in_pending=False, replicas=2)
    assert e.annotated() == [] and {e.slurm.state(n)[0] for n in ("node-001", "node-002")} == {"IDLE"}
    assert invariant.broken == [] and e.capi.violations == []


def test_the_upkeep_takes_no_mark_back_on_a_machine_deployment_cache_one_write_behind(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """A scale-in marked a victim and lowered the replicas 5 -> 4; the next pass's caches are separate watches:
    the Machines' shows the mark, the MachineDeployment's still shows 5 (one event behind, or the write of a
    replica that held the Lease before). By the caches the replicas leave room for the mark; taking it back
    would leave 5 unmarked Machines for 4 replicas, and Cluster API would delete an unmarked one."""
    e, (safe, mapping, _) = standalone(5)
    invariant = PoolInvariant(e.emulator).install()
    assert len(safe.apply(mapping, 4).victims) == 1 and md_replicas(e.emulator, MD_NS, MD) == 4
    safe.reads.begin_pass()
    safe.maintain(mapping, scale_in_pending=False, machines=e.capi.machines(), replicas=5)
    assert invariant.broken == [] and len(e.annotated()) == 1
    e.capi.step()  # the marked one goes, as the scale-in meant
    assert len(e.capi.live()) == 4 and e.capi.violations == []


def test_the_upkeep_takes_no_mark_back_on_a_machine_cache_that_has_not_seen_a_new_machine(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """The MachineDeployment asks for 5, 4 Machines exist; a scale-in to 4 marks one for the fifth, being created,
    and lowers to 4. Cluster API creates the fifth (it read 5): the surplus is the marked one. The next pass's
    Machine cache has the mark but not the new Machine yet: by it, the mark is one no deletion will follow.
    Taken back, 5 unmarked Machines would be left for 4 replicas."""
    e, (safe, mapping, _) = standalone(4)
    invariant = PoolInvariant(e.emulator).install()
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"replicas": 5}})
    outcome = safe.apply(mapping, 4)
    assert (outcome.replicas, len(outcome.victims)) == (4, 1)
    cached = e.capi.machines()  # the cache as the next pass reads it: the mark, not the Machine made after it
    e.capi.add_machine()
    safe.reads.begin_pass()
    safe.maintain(mapping, scale_in_pending=False, machines=cached, replicas=4)
    assert invariant.broken == [] and e.annotated() == outcome.victims
    e.capi.step()  # the surplus is the marked one: Cluster API deletes it (its hook holds it for Slurm)
    deleting = [m["metadata"]["name"] for m in e.capi.machines() if m["metadata"].get("deletionTimestamp")]
    assert deleting == outcome.victims and len(e.capi.live()) == 4 and e.capi.violations == []


# --- what a pass costs: it grows with what changed, not with the Machines held ------------------------------------


def _one_pass(e: Env, safe: SafeScaleIn, mapping: Mapping) -> tuple[int, int]:
    """(slurmrestd requests, API requests) of one upkeep pass over the pool as its watch cache holds it."""
    machines = e.capi.machines()
    e.slurm.calls.clear()
    e.emulator.clear_requests()
    safe.reads.begin_pass()
    safe.maintain(mapping, scale_in_pending=False, machines=machines, replicas=0)
    return len(e.slurm.calls), len(_api_calls(e))


@pytest.mark.parametrize("held", [2, 6])
def test_a_pass_over_held_machines_reads_slurm_once_whatever_their_number(
    standalone: Callable[[int], tuple[Env, Standalone]], held: int
) -> None:
    """``held`` Machines are held by their hooks, their nodes still running the jobs that landed as they were
    drained: each pass reads Slurm's node list once and lists no Machine, for 2 held as for 6."""
    e, (safe, mapping, _) = standalone(held)
    assert len(safe.apply(mapping, 0).victims) == held
    e.capi.step()
    for node in list(e.slurm.nodes):
        e.slurm.start_job(node, end=time.time() + 3600)
    _one_pass(e, safe, mapping)  # the first pass may write (hooks already there: it should not)
    costs = [_one_pass(e, safe, mapping) for _ in range(3)]
    assert costs == [(1, 0)] * 3, costs
    assert all(e.hooked(f"md-{i:03d}") for i in range(1, held + 1)) and e.capi.violations == []


def test_a_release_reads_the_node_it_releases_and_nothing_more(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """Six held, two of them drained and idle: the pass reads the list once, and each of the two once more,
    by name, right before its release."""
    e, (safe, mapping, _) = standalone(6)
    safe.apply(mapping, 0)
    e.capi.step()
    for node in ("node-003", "node-004", "node-005", "node-006"):
        e.slurm.start_job(node, end=time.time() + 3600)
    e.slurm.calls.clear()
    safe.reads.begin_pass()
    safe.maintain(mapping, scale_in_pending=False, machines=e.capi.machines(), replicas=0)
    reads = [path for method, path in e.slurm.calls if method == "GET"]
    assert len([p for p in reads if "/nodes" in p]) == 1
    assert sorted(p.rsplit("/", 1)[1] for p in reads if "/node/" in p) == ["node-001", "node-002"]
    assert not e.hooked("md-001") and not e.hooked("md-002") and e.hooked("md-003")


# --- leaving safe scale-in: nothing of SliMe's is left holding a Machine ---------------------------------------


def _opt_out(e: Env, remove_mapping: bool) -> None:
    """The operator turns safeScaleIn off for the pool, or removes its mapping."""
    mappings = (
        ""
        if remove_mapping
        else f"- {{mirror: {SLIME_NAMESPACE}/{MIRROR}, machineDeployment: {MD_NS}/{MD}, maxReplicas: 100}}\n"
    )
    e.emulator.patch("v1", "ConfigMap", SLIME_NAMESPACE, "scaling-webhook-configmap", {"data": {"mappings": mappings}})


@pytest.mark.parametrize("remove_mapping", [False, True], ids=["opt-in-turned-off", "mapping-removed"])
def test_a_pool_leaving_safe_scale_in_is_released_and_a_busy_node_is_waited_for(
    env: Callable[..., Env], remove_mapping: bool
) -> None:
    e = env(4)
    scaling = e.scaling()
    e.scale(scaling, 2)  # md-001 and md-002 are drained, marked and (below) deleted: held by the hook
    e.capi.step()
    e.slurm.start_job("node-002", end=time.time() + 3600)  # a job landed as it was drained: busy
    _opt_out(e, remove_mapping)
    wait_for(
        lambda: (
            scaling.service.source.table.get(SLIME_NAMESPACE, MIRROR) is None
            or scaling.service.source.table.get(SLIME_NAMESPACE, MIRROR).safe_scale_in is None
        ),
        what="the new mappings",
    )
    scaling.reconcile()
    assert not e.hooked("md-001") and e.hooked("md-002")  # idle: let go; busy: still held
    assert not e.hooked("md-003") and not e.hooked("md-004")  # live Machines: no hook any more
    assert scaling.metric("slime_scaling_pools_leaving") == 1
    (waiting,) = wait_for(lambda: md_events(e.emulator, MD_NS, MD, "SafeScaleInOffWaiting")[:1], what="the Event")
    assert "still held: md-002 (Slurm node node-002 is ALLOCATED+DRAIN+DYNAMIC_NORM)" in waiting["message"]
    # Deleting a Machine of the formerly safe pool completes: nothing holds it.
    e.emulator.delete(f"{CAPI}/v1beta1", "Machine", MD_NS, "md-003")
    assert "md-003" in e.capi.step() and "md-002" not in e.capi.removed
    e.slurm.finish_jobs("node-002")
    scaling.reconcile()
    assert not e.hooked("md-002") and scaling.metric("slime_scaling_pools_leaving") == 0
    assert "md-002" in e.capi.step()
    assert scaling.metric("slime_scaling_pools_released_total") == 1
    assert e.capi.violations == [] and e.slurm.violations == []
    wait_for(lambda: md_events(e.emulator, MD_NS, MD, "SafeScaleInOff"), what="the released Event")


def test_releasing_a_pool_keeps_the_marks_cluster_api_is_about_to_delete_and_resumes_the_rest(
    standalone: Callable[[int], tuple[Env, Standalone]],
) -> None:
    """Victims marked and counted out of the replicas keep their marks (Cluster API deletes them next: without
    the marks it would pick others, busy ones maybe); victims the replicas still count are unmarked and their
    drains undone."""
    e, (safe, mapping, _) = standalone(4)
    assert len(safe.apply(mapping, 2).victims) == 2  # marked, replicas 2, not deleted yet
    e.emulator.patch(f"{CAPI}/v1beta1", "MachineDeployment", MD_NS, MD, {"spec": {"replicas": 3}})  # one counted again
    report = safe.release_pool(mapping)
    assert report.done and len(report.kept_marks) == 1 and len(report.undrained) == 1
    assert e.annotated() == report.kept_marks and not any(e.hooked(f"md-{i:03d}") for i in range(1, 5))
    e.capi.step()
    assert e.capi.removed == report.kept_marks and e.capi.violations == []
