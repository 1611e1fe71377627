"""``helm upgrade`` under a steady stream of admissions: no admission fails while both webhooks roll.

The chart is installed as the tier installs it (chart-generated TLS, ``admissionAuth``, a
mapping; kube-apiserver restarted with the client certificate), on a control plane of the test's
own. Here the webhooks' pods are not started by the tier but by the real Deployment and
ReplicaSet controllers, and run by :class:`testbed.components.kubelet.Kubelet`, which plays the node's
kubelet (binding, readiness probes written to the Pod's ``Ready`` condition, ``preStop`` exec hook,
SIGTERM, SIGKILL at the grace period's end, removal of the Pod object) and kube-proxy (each
webhook Service's port on 127.0.0.1 hands new connections to ready, non-terminating pods, each
listening on a loopback address of its own, ``status.podIP``, which the pods get as ``SLIME_HOST``;
endpoint changes arrive :data:`testbed.components.kubelet.PROPAGATION_SECONDS` late, as in a cluster).
The webhook Services are routed to ``localhost`` by a post-renderer (``Release(routed_at_render=True)``),
so the upgrade never turns them back into ClusterIP Services, which kube-apiserver would dial.

The upgrade is what a release changes: a new image tag. ``image.tag`` moves to a new tag that
names the same built image (``podman tag``), so both Deployments' pod templates change and both
roll (``maxSurge: 1``, ``maxUnavailable: 0``: the new pod must be Ready before the old one is
deleted; then its ``preStop`` sleep keeps it serving while its endpoint disappears).

Meanwhile :class:`testbed.components.load.Load` sends admissions through kube-apiserver, one after the
other, alternating: an injection (a metaData Secret created as CAPM3's manager, which must be
stored with the join data) and a scaling one (a dry-run PATCH of the mirror's ``/scale``). The test
waits until both rollouts are over (every pod of each Deployment runs the new image and is Ready,
the old pods' containers stopped and their Pod objects gone), lets the load run a few seconds more,
and asserts that no admission failed, as the client saw it and as kube-apiserver counted its
webhook calls, and that the pods serving (those the Service proxies route to) are the new ones.
The figure is printed as JSON (``SLIME_REAL_UPGRADE_FIGURES=/path.json`` also writes it); docs/operations.md,
"Upgrading", quotes it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.components.controlplane import ControlPlane
from testbed.components.image import podman
from testbed.components.kubelet import Kubelet, ServiceProxy
from testbed.components.load import WEBHOOKS, Load, failed_calls, webhook_counters
from testbed.components.release import COMPONENTS, Release, tier_values
from testbed.framework.audit import EVIDENCE
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment
from testbed.framework.wait import wait_for
from testbed.framework.world import ensure_namespace, seed_metal3
from testbed.scenarios import stack as k8s

pytestmark = [pytest.mark.real_k8s, pytest.mark.timeout(600)]

OPT_IN = {"slurm-controller-namespace": "slurm"}
START_BOUND_SECONDS = 180.0  # the first pods of both Deployments Ready, through the kubelet's probes
ROLLOUT_BOUND_SECONDS = 180.0  # a bound, not a figure: two pods start and two stop (preStop 10 s) per rollout
LOAD_LEAD_SECONDS, LOAD_TAIL_SECONDS = 3.0, 5.0  # admissions flow before the upgrade and after the rollout
# Each pod listens on its own address (status.podIP), as it does on a pod network.
POD_IP_ENV = [{"name": "SLIME_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def _selector(release: Release, component: str) -> str:
    labels = release.deployment(component)["spec"]["selector"]["matchLabels"]
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _pods(cp: ControlPlane, namespace: str, selector: str) -> list[dict[str, Any]]:
    return cp.api.list("v1", "pods", namespace, label_selector=selector)


def _rolled_out(cp: ControlPlane, release: Release, component: str, image: str) -> bool:
    """The Deployment's rollout is complete and only its new pods are left: every Pod object runs ``image`` and is
    Ready, none is terminating, as many as the Deployment wants."""
    name = release.deployment(component)["metadata"]["name"]
    deployment = cp.api.get("apps/v1", "deployments", release.namespace, name) or {}
    status, wanted = deployment.get("status") or {}, deployment["spec"]["replicas"]
    if status.get("observedGeneration", 0) < deployment["metadata"]["generation"]:
        return False
    if not status.get("updatedReplicas") == status.get("availableReplicas") == status.get("replicas") == wanted:
        return False
    pods = _pods(cp, release.namespace, _selector(release, component))
    return len(pods) == wanted and all(
        p["spec"]["containers"][0]["image"] == image
        and not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions", []))
        for p in pods
    )


def test_helm_upgrade_under_load_fails_no_admission(tmp_path: Path) -> None:
    cp = k8s.start_control_plane(tmp_path / "control-plane")
    old_image = k8s.PREPARED.image or "localhost/slime:process"
    repository, _, tag = old_image.rpartition(":")
    new_tag = f"{tag}-upgrade"
    new_image = f"{repository}:{new_tag}"
    if k8s.RUNNER == "pod":  # the new release's tag, naming the same image (pullPolicy Never: it must be here)
        podman("tag", old_image, new_image)
    try:
        api = cp.api
        for namespace in (k8s.MD_NAMESPACE, "slurm"):
            ensure_namespace(api, namespace)
        k8s.seed_management_cluster(api)
        api.create(
            machine_deployment(
                k8s.MD_NAME, k8s.MD_NAMESPACE, replicas=k8s.MD_START, version="v1beta2", cluster=k8s.CLUSTER, full=True
            )
        )
        _, data = seed_metal3(api, template_labels=OPT_IN, index=60)
        mapping = {
            "mirror": {"name": k8s.MIRROR, "namespace": SLIME_NAMESPACE},
            "machineDeployment": {"name": k8s.MD_NAME, "namespace": k8s.MD_NAMESPACE},
            "partition": "batch",
            "maxReplicas": 10,
        }
        values = tier_values(old_image, [mapping], injection={"extraEnv": POD_IP_ENV}, scaling={"extraEnv": POD_IP_ENV})
        release = Release(cp, SLIME_NAMESPACE, values, tmp_path, routed_at_render=True)
        release.install()
        cp.restart_apiserver(release.admission_configuration(tmp_path / "admission"))
        proxies = {c: ServiceProxy(release.port(c)) for c in COMPONENTS}
        selectors = {c: _selector(release, c) for c in COMPONENTS}
        with Kubelet(cp, release.namespace, selectors, tmp_path, runner=k8s.RUNNER, proxies=proxies) as kubelet:
            _run(cp, release, kubelet, proxies, data, old_image, new_image, new_tag)
    finally:
        cp.stop()
        if k8s.RUNNER == "pod":
            podman("untag", new_image, new_image, check=False)


def _run(
    cp: ControlPlane,
    release: Release,
    kubelet: Kubelet,
    proxies: dict[str, ServiceProxy],
    data: dict[str, Any],
    old_image: str,
    new_image: str,
    new_tag: str,
) -> None:
    def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
        def holds() -> bool:
            if condition():
                return True
            assert not kubelet.errors, f"the kubelet failed while waiting for {what}: {kubelet.errors[:3]}"
            return False

        wait_for(holds, timeout, what, interval=0.2, diagnostics=lambda: f"kubelet errors {kubelet.errors[:3]}")

    wait(
        lambda: all(_rolled_out(cp, release, c, old_image) and proxies[c].endpoints() for c in COMPONENTS),
        START_BOUND_SECONDS,
        "both webhooks' first pods Ready and routed",
    )
    wait(
        lambda: (
            (cp.api.get("apps/v1", "deployments", release.namespace, k8s.MIRROR) or {})["spec"].get("replicas")
            == k8s.MD_START
        ),
        60,
        "the mirror to adopt the MachineDeployment (scales are then consistent)",
    )
    before = {c: {m.name for m in kubelet.serving(c)} for c in COMPONENTS}
    assert all(len(names) == 1 for names in before.values()), before
    counters_before = webhook_counters(cp)
    load = Load(cp, data, release.namespace, k8s.MIRROR, max_seconds=ROLLOUT_BOUND_SECONDS + 60)
    loader = load.start()
    try:
        time.sleep(LOAD_LEAD_SECONDS)
        assert loader.is_alive() and sum(load.sent.values()) > 0, f"the load is not flowing: {load.failures[:3]}"
        sent_before = dict(load.sent)
        release.values["image"]["tag"] = new_tag
        upgraded = time.monotonic()
        release.upgrade()
        helm_seconds = time.monotonic() - upgraded
        wait(
            lambda: (
                all(_rolled_out(cp, release, c, new_image) for c in COMPONENTS)
                and all(m.gone for m in kubelet.pods.values() if m.name in before[m.component])
            ),
            ROLLOUT_BOUND_SECONDS,
            "both rollouts to finish (new pods Ready, old pods stopped and gone)",
        )
        rollout_seconds = time.monotonic() - upgraded
        sent_during = {c: load.sent[c] - sent_before[c] for c in COMPONENTS}
        time.sleep(LOAD_TAIL_SECONDS)  # admissions keep flowing to the new pods
    finally:
        load.stop.set()
        loader.join(timeout=60)
    delta = {k: v - counters_before.get(k, 0.0) for k, v in webhook_counters(cp).items()}
    after = {c: kubelet.serving(c) for c in COMPONENTS}
    figure = _figure(
        kubelet, before, after, proxies, load, sent_during, delta, upgraded, (rollout_seconds, helm_seconds)
    )
    _verdict(cp, release, kubelet, before, after, proxies, load, sent_during, delta, figure, new_image)


def _figure(
    kubelet: Kubelet,
    before: dict[str, set[str]],
    after: dict[str, list[Any]],
    proxies: dict[str, ServiceProxy],
    load: Load,
    sent_during: dict[str, int],
    delta: dict[str, float],
    upgraded: float,
    seconds: tuple[float, float],
) -> dict[str, Any]:
    """The upgrade's figure, printed as JSON (docs/operations.md, "Upgrading", quotes it)."""
    old_pods = [m for m in kubelet.pods.values() if m.name in before[m.component]]
    rollout_seconds, helm_seconds = seconds
    figure = {
        "runner": k8s.RUNNER,
        "admissions_sent": dict(load.sent),
        "admissions_sent_during_rollout": sent_during,
        "failed_admissions": dict(load.failed),
        "rollout_seconds": round(rollout_seconds, 1),
        "helm_upgrade_seconds": round(helm_seconds, 1),
        "old_pods_stop_seconds": {
            m.component: {
                "pre_stop": round(m.times.get("terminate_pre_stop", 0.0), 1),
                "sigterm_to_exit": round(m.times.get("terminate_stop", 0.0), 1),
            }
            for m in old_pods
        },
        "new_pods_ready_seconds_after_upgrade": {
            m.component: round(m.times["ready"] - upgraded, 1) for m in (p for ps in after.values() for p in ps)
        },
        "connections_refused_by_service_proxies": {c: proxies[c].refused for c in COMPONENTS},
        "apiserver_webhook_calls": {k.split(":", 1)[1]: v for k, v in sorted(delta.items()) if v},
        "failures": load.failures[:10],
    }
    text = json.dumps(figure)
    print(f"\n[helm upgrade under load] {text}")
    EVIDENCE.add_line(f"helm upgrade under load: {text}")
    if os.environ.get("SLIME_REAL_UPGRADE_FIGURES"):
        Path(os.environ["SLIME_REAL_UPGRADE_FIGURES"]).write_text(json.dumps(figure, indent=1))
    return figure


def _verdict(
    cp: ControlPlane,
    release: Release,
    kubelet: Kubelet,
    before: dict[str, set[str]],
    after: dict[str, list[Any]],
    proxies: dict[str, ServiceProxy],
    load: Load,
    sent_during: dict[str, int],
    delta: dict[str, float],
    figure: dict[str, Any],
    new_image: str,
) -> None:
    old_pods = [m for m in kubelet.pods.values() if m.name in before[m.component]]
    assert not load.failures, f"{len(load.failures)} admissions failed during the upgrade: {load.failures[:10]}"
    assert not failed_calls(delta), f"kube-apiserver counted failed or rejected webhook calls: {failed_calls(delta)}"
    for c, webhook in WEBHOOKS.items():
        assert sent_during[c] > 0, f"no {c} admission was sent during the rollout: {figure}"
        assert delta.get(f"apiserver_admission_webhook_request_total:{webhook}:200", 0) >= load.sent[c], (
            f"every {c} admission called the webhook: {figure}"
        )
        serving = after[c]
        assert len(serving) == 1 and serving[0].name not in before[c], f"{c}: the old pod still serves: {serving}"
        assert serving[0].pod is not None and serving[0].pod.running()
        assert proxies[c].endpoints() == [serving[0].ip], f"{c}: the Service routes to {proxies[c].endpoints()}"
        pod = cp.api.get("v1", "pods", release.namespace, serving[0].name) or {}
        assert pod["spec"]["containers"][0]["image"] == new_image
    assert all(m.gone and m.pod is not None and not m.pod.running() for m in old_pods), "the old pods stopped"
    assert all(m.times.get("terminate_pre_stop", 0.0) >= 9.0 for m in old_pods), (
        f"each old pod ran its preStop sleep (10 s) before SIGTERM: {figure['old_pods_stop_seconds']}"
    )
    assert not kubelet.errors, kubelet.errors[:5]
