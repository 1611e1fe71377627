"""ScaleAdmission over kubemu's watches: no call when warm, one fresh mirror read on a mismatch, outcomes counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.admission import AdmissionResponse
from common.kube import local_client
from common.metrics import WebhookMetrics
from kubemu import Emulator, Fault
from scaling_webhook.admission import ScaleAdmission
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import MappingTable, parse_mappings
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.watches import MappedObjects
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment, mirror
from testbed.framework.reviews import scale_request

KEDA = "system:serviceaccount:keda:keda-operator"


class Flow:
    def __init__(self, emulator: Emulator, kubeconfig: str, mappings: str, allowed: frozenset[str]) -> None:
        self.emulator = emulator
        self.client = local_client(kubeconfig)
        self.scaler = MachineDeploymentScaler(self.client, timeout=2.0)
        self.objects = MappedObjects(self.client, self.scaler, lambda: None)
        self.table: MappingTable = parse_mappings({"mappings": mappings}, SLIME_NAMESPACE)
        self.metrics = ScalingMetrics(WebhookMetrics())
        self.admission = ScaleAdmission(lambda: self.table, self.objects, self.scaler, self.metrics, allowed)

    def follow(self) -> None:
        self.objects.follow(self.table, timeout=5.0)

    def review(self, replicas: int, old: int, name: str = "mirror-a") -> AdmissionResponse:
        return asyncio.run(self.admission(scale_request(SLIME_NAMESPACE, name, replicas, old_replicas=old)))

    def count(self, outcome: str) -> float:
        value = self.metrics.webhook.registry.get_sample_value("slime_scaling_decisions_total", {"outcome": outcome})
        return value or 0.0

    def calls(self) -> list[str]:
        """API calls since the last clear, but the informers' own watches (they open in the background)."""
        return [f"{r.verb} {r.path}" for r in self.emulator.requests if r.verb != "watch"]

    def mirror_reads(self) -> int:
        return self.emulator.count_requests(verb="get", resource="deployments", name="mirror-a")


MakeFlow = Callable[..., Flow]


@pytest.fixture
def make_flow(emulator: Emulator, tmp_path: Path) -> Iterator[MakeFlow]:
    made: list[Flow] = []
    emulator.create(mirror("mirror-a", replicas=2))
    emulator.create(machine_deployment("md-a", "metal3", replicas=2))

    def make(
        mappings: str = "- {mirror: slime-system/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 100}",
        allowed: frozenset[str] = frozenset(),
    ) -> Flow:
        flow = Flow(emulator, emulator.write_kubeconfig(tmp_path / f"kc-{len(made)}"), mappings, allowed)
        made.append(flow)
        return flow

    yield make
    for flow in made:
        flow.objects.stop()
        flow.client.close()


def test_an_unmapped_scale_is_allowed_with_no_call(make_flow: MakeFlow, emulator: Emulator) -> None:
    flow = make_flow()
    flow.follow()
    emulator.clear_requests()
    response = flow.review(5, 1, name="someone-elses-deployment")
    assert response.allowed and response.message == ""
    assert (flow.count("unmapped"), flow.calls()) == (1, [])


def test_a_warm_consistent_scale_is_accepted_with_no_call(make_flow: MakeFlow, emulator: Emulator) -> None:
    flow = make_flow()
    flow.follow()
    emulator.clear_requests()
    response = flow.review(4, 2)
    assert response.allowed
    assert response.message == "MachineDeployment metal3/md-a follows the stored mirror to 4"
    assert flow.calls() == [], "an admission writes nothing and, warm, reads nothing"
    assert (flow.count("accepted"), flow.count("denied")) == (1, 0)


def test_a_requester_not_allowed_is_denied_with_no_call(make_flow: MakeFlow, emulator: Emulator) -> None:
    flow = make_flow(allowed=frozenset({"system:serviceaccount:other:scaler"}))
    flow.follow()
    emulator.clear_requests()
    response = flow.review(4, 2)
    assert not response.allowed and f"requester {KEDA} may not scale" in response.message
    assert (flow.count("denied"), flow.calls()) == (1, [])


def test_before_the_caches_have_listed_it_is_a_retry(make_flow: MakeFlow) -> None:
    flow = make_flow()
    response = flow.review(4, 2)  # never followed: nothing listed
    assert (response.allowed, response.code) == (False, 503)
    assert "has not listed the mirror and MachineDeployment yet" in response.message


def test_a_stale_cache_is_checked_against_one_fresh_read(make_flow: MakeFlow, emulator: Emulator) -> None:
    emulator.add_fault(Fault(verb="watch", path_regex="/deployments$", delay_seconds=30))  # the mirror cache lags
    flow = make_flow()
    flow.follow()
    emulator.patch("apps/v1", "Deployment", SLIME_NAMESPACE, "mirror-a", {"spec": {"replicas": 3}})
    assert flow.objects.mirror(next(iter(flow.table)))["spec"]["replicas"] == 2  # type: ignore[index]
    emulator.clear_requests()
    response = flow.review(5, 3)  # kube-apiserver sends the stored mirror (3); the cache still says 2
    assert response.allowed, response.message
    assert flow.mirror_reads() == 1
    forged = flow.review(5, 7)  # an oldObject the API server does not hold either
    assert (forged.allowed, forged.code) == (False, 409)
    assert "is not the stored mirror's (3)" in forged.message
    assert flow.mirror_reads() == 2
    assert (flow.count("accepted"), flow.count("denied")) == (1, 1)


def test_a_fresh_read_that_fails_is_a_retry(make_flow: MakeFlow, emulator: Emulator) -> None:
    flow = make_flow()
    flow.follow()
    emulator.add_fault(Fault(method="GET", path_regex="/deployments/mirror-a$", status=500))
    response = flow.review(5, 9)  # a mismatch: read again, and the read fails
    assert (response.allowed, response.code) == (False, 503)


def test_a_capped_scale_is_counted(make_flow: MakeFlow) -> None:
    flow = make_flow("- {mirror: slime-system/mirror-a, machineDeployment: metal3/md-a, maxReplicas: 3}")
    flow.follow()
    response = flow.review(10, 2)
    assert response.allowed and "capped at maxReplicas 3" in response.message
    assert flow.metrics.webhook.registry.get_sample_value("slime_scaling_capped_admissions_total") == 1
