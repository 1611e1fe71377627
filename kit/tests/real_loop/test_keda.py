"""KEDA + HPA + Prometheus, real: pending jobs in real Slurm move the mirror, and the leader the
MachineDeployment.

The chart is installed with ``keda.enabled=true`` on the tier's real API server, beside real
KEDA v2.21.0, kube-controller-manager's HPA controller, Debian's Prometheus and real Slurm 26.05
(testbed/scenarios/keda.py says what each is and where it stands in). Two mappings on one
partition: ``jobs`` (the chart's PromQL query over Slurm's job counts) and ``nodes``
(``keda.demand=nodes``: KEDA's metrics-api trigger on the scaling webhook's ``/demand/batch``).
The scaling webhook is the chart's pod; every scale KEDA or the HPA makes goes through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testbed.framework.objects import SLIME_NAMESPACE
from testbed.scenarios import summary
from testbed.scenarios.keda import (
    JOBS,
    MAX_REPLICAS,
    NODE,
    NODES,
    PARTITION,
    STARTUP_REFUSALS,
    Loop,
    loop,
    mirror_name,
    refused_scales,
    webhook_requests,
)
from testbed.scenarios.prepare import part

pytestmark = [pytest.mark.real_loop, pytest.mark.real_parts("keda"), pytest.mark.timeout(900)]

MIRROR_GATE = "slime/never-scheduled"  # the chart's scheduling gate on every mirror pod
SCALE_SECONDS = 120.0  # generous: Prometheus scrapes every 1 s, KEDA polls every 2 s, the HPA syncs every 5 s


@pytest.fixture(scope="module")
def keda_loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    prepared = part("keda")
    with loop(prepared, tmp_path_factory.mktemp("keda-loop")) as running:
        yield running


def _ready(obj: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or []
    )


def test_keda_accepts_the_charts_scaled_objects_and_makes_their_hpas(keda_loop: Loop) -> None:
    loop = keda_loop
    for demand in (JOBS, NODES):
        loop.wait_for(lambda d=demand: _ready(loop.scaled_object(d)), 60, f"ScaledObject {mirror_name(demand)} Ready")
        loop.wait_for(lambda d=demand: loop.hpa(d) is not None, 60, f"KEDA's HPA for {mirror_name(demand)}")
        hpa = loop.hpa(demand)
        assert hpa is not None
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": mirror_name(demand),
        }
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, MAX_REPLICAS)
        assert hpa["spec"]["metrics"][0]["type"] == "External"
    # KEDA's admission webhook validated both as helm created them (through kube-apiserver, by the same
    # ExternalName routing as SliMe's webhooks), admitted both, and no call failed open.
    admissions = loop.install_admissions
    assert admissions.get(("CREATE", "false", "200")) == 2, admissions
    assert all(rejected == "false" and code == "200" for _, rejected, code in admissions), (
        admissions
    )  # none refused, none failed open
    triggers = {d: loop.scaled_object(d)["spec"]["triggers"][0] for d in (JOBS, NODES)}
    assert triggers[JOBS]["type"] == "prometheus" and triggers[NODES]["type"] == "metrics-api"
    # Nothing is pending yet: the pools stay at 0. Each mirror starts at the API server's default of 1
    # until the scaling leader adopts its MachineDeployment's 0 (one mapping after the other, a moment
    # after the pod starts), so wait for both adoption marks before reading the replicas.
    for demand in (JOBS, NODES):
        loop.wait_for(lambda d=demand: loop.adopted(d), 60, f"{mirror_name(demand)} adopted")
    assert [loop.mirror_replicas(d) for d in (JOBS, NODES)] == [0, 0]
    assert [loop.md_replicas(d) for d in (JOBS, NODES)] == [0, 0]


def test_pending_jobs_in_real_slurm_move_the_mirror_and_the_machine_deployment(keda_loop: Loop) -> None:
    loop = keda_loop
    query = loop.scaled_object(JOBS)["spec"]["triggers"][0]["metadata"]["query"]
    for _ in range(3):
        loop.submit(1)
    # Slurm -> the metrics endpoint -> Prometheus: the chart's own query says 3.
    loop.wait_for(lambda: loop.prometheus.value(query) == 3, 60, f"Prometheus: {query} == 3")
    # KEDA activates the ScaledObject (0 -> 1), the HPA takes it to 3; the leader follows with the MachineDeployment.
    loop.wait_for(lambda: loop.mirror_replicas(JOBS) == 3, SCALE_SECONDS, "the jobs mirror at 3")
    loop.wait_for(lambda: loop.md_replicas(JOBS) == 3, 60, "md-jobs at 3")
    assert loop.external_metric(JOBS) == 3  # what the HPA controller reads through kube-apiserver's aggregator
    # Every scale (KEDA's 0 -> 1, the HPA's 1 -> 3) went through the chart's scaling webhook, which refused none.
    calls = webhook_requests(loop.cp, "scaling.webhook.slime")
    assert calls.get(("UPDATE", "false", "200"), 0) >= 2, calls
    assert set(calls) - STARTUP_REFUSALS == {("UPDATE", "false", "200")}, calls  # none failed open
    assert not refused_scales(loop.cp)  # the only refusals: a scale in the moment before the webhook had listed
    hpa = loop.hpa(JOBS)
    assert hpa is not None and hpa["status"]["desiredReplicas"] == 3  # the HPA took it past KEDA's activation to 1


def test_a_pending_four_node_job_makes_the_nodes_mirror_four(keda_loop: Loop) -> None:
    loop = keda_loop
    loop.cancel_all()
    job = loop.submit(4)
    loop.wait_for(lambda: loop.slurm.jobs()[job]["state_reason"] != "None", 30, f"job {job} scheduled once")
    reason = loop.slurm.jobs()[job]["state_reason"]
    # The scaling webhook's pod reads real slurmrestd: 4 nodes for the one pending job.
    demand_url = f"http://127.0.0.1:{loop.release.values['scaling']['metricsPort']}/demand/{PARTITION}"
    loop.wait_for(lambda: httpx.get(demand_url, timeout=5).json().get("nodes") == 4, 60, f"{demand_url} says 4")
    loop.wait_for(
        lambda: loop.mirror_replicas(NODES) == 4, SCALE_SECONDS, f"the nodes mirror at 4 (job {job}: {reason})"
    )
    loop.wait_for(lambda: loop.md_replicas(NODES) == 4, 60, "md-nodes at 4")
    assert loop.external_metric(NODES) == 4
    calls = webhook_requests(loop.cp, "scaling.webhook.slime")
    assert set(calls) - STARTUP_REFUSALS == {("UPDATE", "false", "200")}, calls  # none failed open
    assert not refused_scales(loop.cp)  # none refused, but before the webhook had listed
    # The same Slurm state through the job count asks 1: the difference keda.demand=nodes makes.
    loop.wait_for(lambda: loop.external_metric(JOBS) == 1, 60, "the jobs trigger's metric at 1")
    # KEDA dialled the chart's URL as rendered; the port it names is the Service's metrics port (what kube-proxy
    # forwards).
    url = loop.scaled_object(NODES)["spec"]["triggers"][0]["metadata"]["url"]
    service = loop.release.service_name("scaling")
    assert (
        url
        == f"http://{service}.{SLIME_NAMESPACE}.svc:{loop.release.values['scaling']['metricsPort']}/demand/{PARTITION}"
    )
    ports = loop.api.get("v1", "Service", SLIME_NAMESPACE, service)["spec"]["ports"]  # type: ignore[index]
    assert {"name": "metrics", "port": loop.release.values["scaling"]["metricsPort"]}.items() <= next(
        p for p in ports if p["name"] == "metrics"
    ).items()


def _unscheduled_by_the_gate(pod: dict[str, Any]) -> bool:
    """Still an API object only: no Node, and the scheduling gate is what holds it (the API server's condition)."""
    gated = [g["name"] for g in pod["spec"].get("schedulingGates") or []] == [MIRROR_GATE]
    conditions = (pod.get("status") or {}).get("conditions") or []
    held = any(c["type"] == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in conditions)
    return gated and held and not pod["spec"].get("nodeName")


def test_mirror_pods_are_counted_but_never_scheduled(keda_loop: Loop) -> None:
    """Issue 34: a replica of a mirror costs no node. kube-scheduler runs here with a Node it may bind to: an
    ungated pod lands on it within seconds, while every mirror pod of the nodes pool (at 4 after the test
    before) stays unbound behind the chart's scheduling gate, and still counts in the mirror's ``/scale``."""
    loop = keda_loop
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "scheduler-probe", "namespace": SLIME_NAMESPACE},
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]},
    }
    loop.api.create(probe)
    try:
        loop.wait_for(
            lambda: (
                (loop.api.get("v1", "Pod", SLIME_NAMESPACE, "scheduler-probe") or {})["spec"].get("nodeName") == NODE
            ),
            60,
            f"kube-scheduler binds an ungated pod to {NODE}",
        )
    finally:
        loop.api.delete("v1", "Pod", SLIME_NAMESPACE, "scheduler-probe")
    assert loop.mirror_replicas(NODES) == 4
    loop.wait_for(lambda: len(loop.mirror_pods(NODES)) == 4, 60, "the nodes mirror's ReplicaSet made 4 pods")
    pods = loop.mirror_pods(NODES)
    assert all(_unscheduled_by_the_gate(p) for p in pods), [(p["spec"], p["status"]) for p in pods]
    scale = loop.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, mirror_name(NODES))
    assert scale is not None and scale["status"]["replicas"] == 4  # what the HPA reads through /scale
    assert not scale["status"].get("readyReplicas")  # none runs
    sizes = sorted(len(json.dumps(p, separators=(",", ":"))) for p in pods)
    summary.line(
        "mirror pods", f"one gated mirror pod as the API server returns it: {sizes[len(sizes) // 2]} bytes of JSON"
    )


HPA = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"  # kube-controller-manager's HPA controller
KEDA_OPERATOR = "system:serviceaccount:keda:keda-operator"


def test_the_default_requester_rule_lets_keda_and_the_hpa_take_a_pool_from_zero_to_n_and_back(keda_loop: Loop) -> None:
    """Issue 30: with keda.enabled the chart sets the requester rule to the pair that writes /scale under KEDA.

    KEDA's operator makes 0 -> 1 and N -> 0, the HPA controller the steps in between
    (kube-controller-manager runs with --use-service-account-credentials here, as kubeadm runs it):
    a rule naming KEDA's operator alone would refuse every 1 -> N step. Here the rule is on, and
    the jobs pool goes 0 -> 2 -> 0 with every scale admitted; the API server's audit log names who
    wrote each one. (Run last in this module: it lowers the jobs mapping's cooldown and window.)
    """
    loop = keda_loop
    deployment = loop.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, loop.release.service_name("scaling"))
    assert deployment is not None
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert KEDA_OPERATOR in env["SLIME_SCALE_REQUESTERS"].split(",") and HPA in env["SLIME_SCALE_REQUESTERS"].split(",")
    for item in loop.release.values["scaling"]["mappings"]:
        if item["keda"]["demand"] == JOBS:  # back to 0 within seconds, not KEDA's 300 s cooldown and the HPA's window
            item["keda"].update({"cooldownPeriod": 2, "scaleDownStabilizationSeconds": 0})
    loop.release.upgrade()
    loop.cancel_all()
    loop.wait_for(lambda: loop.mirror_replicas(JOBS) == 0, SCALE_SECONDS, "the jobs mirror back at 0")
    loop.wait_for(lambda: loop.md_replicas(JOBS) == 0, 60, "md-jobs at 0")
    for _ in range(2):
        loop.submit(1)
    loop.wait_for(lambda: loop.mirror_replicas(JOBS) == 2, SCALE_SECONDS, "the jobs mirror at 2")
    loop.wait_for(lambda: loop.md_replicas(JOBS) == 2, 60, "md-jobs at 2")
    # 0 -> 2 -> 0 with gated mirror pods: at 2, two pods the scheduler (running, with a Node) left unbound.
    loop.wait_for(lambda: len(loop.mirror_pods(JOBS)) == 2, 60, "the jobs mirror's 2 pods")
    assert all(_unscheduled_by_the_gate(p) for p in loop.mirror_pods(JOBS)), loop.mirror_pods(JOBS)
    loop.cancel_all()
    loop.wait_for(lambda: loop.mirror_replicas(JOBS) == 0, SCALE_SECONDS, "the jobs mirror at 0 again")
    loop.wait_for(lambda: loop.md_replicas(JOBS) == 0, 60, "md-jobs at 0 again")
    loop.wait_for(lambda: not loop.mirror_pods(JOBS), 60, "the jobs mirror's pods gone")
    scales = [
        e
        for e in loop.cp.audit_events()
        if (e.get("objectRef") or {}).get("subresource") == "scale"
        and e["objectRef"].get("resource") == "deployments"
        and e["objectRef"].get("name") == mirror_name(JOBS)
        and e.get("verb") in ("update", "patch")
        and e.get("stage") == "ResponseComplete"
    ]
    writers = {e["user"]["username"] for e in scales}
    assert {KEDA_OPERATOR, HPA} <= writers <= {KEDA_OPERATOR, HPA}, writers  # both, and nobody else
    # Every write admitted (refused_scales: but for a scale in the moment before the webhook had listed, and the
    # API server's 409s when KEDA's operator and the HPA controller race on the mirror's resourceVersion, which
    # the loser retries), and none failed open.
    assert any(e["responseStatus"].get("code") == 200 for e in scales), [e["responseStatus"] for e in scales]
    assert not refused_scales(loop.cp)
    calls = webhook_requests(loop.cp, "scaling.webhook.slime")
    assert ("fail-open", "", "") not in calls, calls
