"""Without KEDA, real: a plain HPA with ``minReplicas: 0`` takes a mirror 0 -> N -> 0 on SliMe's node demand.

docs/install.md ("Without KEDA") says a site without KEDA can drive a mirror with an HPA from
Kubernetes 1.37 (``HPAScaleToZero`` beta, on by default), given an adapter serving the
``slime_demand_nodes`` gauge as an External metric. Here: the tiers' real kube-apiserver and
kube-controller-manager, real Slurm, the chart's pods with that section's values, and the test
adapter of testbed/components/metrics_adapter.py in prometheus-adapter's place
(testbed/scenarios/hpa.py says what is real and what stands in).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from testbed.scenarios.hpa import METRIC, POOL, HpaLoop, hpa_loop
from testbed.scenarios.keda import NOT_LISTED_YET, PARTITION, mirror_name, webhook_requests
from testbed.scenarios.prepare import part

pytestmark = [pytest.mark.real_loop, pytest.mark.real_parts("slurm-26.05"), pytest.mark.timeout(600)]

SCALE_SECONDS = 90.0  # the demand poll every 1 s, the HPA controller syncs every 5 s
HPA_CONTROLLER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HpaLoop]:
    with hpa_loop(part("slurm-26.05"), tmp_path_factory.mktemp("hpa-loop")) as running:
        yield running


def test_the_hpa_takes_an_idle_pool_to_zero_itself(loop: HpaLoop) -> None:
    """Kubernetes 1.37 stores ``minReplicas: 0`` (HPAScaleToZero, beta, on by default). The pool starts at 1 and the
    mirror adopts it; with no demand the HPA takes the mirror to 0 and says so (``ScaledToZero=True``), which is
    what lets it scale up from 0 later; the MachineDeployment follows."""
    hpa = loop.hpa_object()
    assert hpa is not None and hpa["spec"]["minReplicas"] == 0
    loop.wait_for(lambda: loop.adopted(POOL), 60, f"{mirror_name(POOL)} adopted")
    loop.wait_for(lambda: loop.mirror_replicas(POOL) == 0, SCALE_SECONDS, "the HPA takes the idle mirror to 0")
    loop.wait_for(lambda: loop.hpa_condition("ScaledToZero") == "True", 60, "the HPA's ScaledToZero condition")
    loop.wait_for(lambda: loop.md_replicas(POOL) == 0, 60, "the MachineDeployment at 0")


def test_pending_nodes_take_the_mirror_from_zero_to_n_and_back_through_the_hpa_alone(loop: HpaLoop) -> None:
    job = loop.submit(3)
    demand_url = f"http://127.0.0.1:{loop.release.values['scaling']['metricsPort']}/demand/{PARTITION}"
    loop.wait_for(lambda: httpx.get(demand_url, timeout=5).json().get("nodes") == 3, 60, f"{demand_url} says 3")
    # The HPA controller reads the gauge through kube-apiserver's aggregator and the adapter, and scales from 0.
    loop.wait_for(lambda: loop.mirror_replicas(POOL) == 3, SCALE_SECONDS, f"the mirror at 3 (job {job})")
    loop.wait_for(lambda: loop.md_replicas(POOL) == 3, 60, "the MachineDeployment at 3")
    assert any(f"/{METRIC}?" in path for path in loop.adapter.requests)  # asked through the aggregator
    loop.cancel_all()
    loop.wait_for(lambda: loop.mirror_replicas(POOL) == 0, SCALE_SECONDS, "the mirror back at 0")
    loop.wait_for(lambda: loop.md_replicas(POOL) == 0, 60, "the MachineDeployment back at 0")
    scales = [
        e
        for e in loop.cp.audit_events()
        if (e.get("objectRef") or {}).get("subresource") == "scale"
        and e["objectRef"].get("name") == mirror_name(POOL)
        and e.get("verb") in ("update", "patch")
        and e.get("stage") == "ResponseComplete"
    ]
    writers = {e["user"]["username"] for e in scales}
    assert writers == {HPA_CONTROLLER}, writers  # no KEDA: the HPA controller wrote every scale, 1 -> 0 -> 3 -> 0
    # Admitted, but for the HPA's first try: 1 -> 0 a moment after the chart's pod started, refused until the
    # webhook had listed the mirror and MachineDeployment (it never guesses); the HPA tried again.
    refused = [e["responseStatus"] for e in scales if e["responseStatus"].get("code") != 200]
    assert all(NOT_LISTED_YET in s.get("message", "") for s in refused), refused
    assert sum(1 for e in scales if e["responseStatus"].get("code") == 200) >= 3, scales  # 1 -> 0, 0 -> 3, 3 -> 0
    calls = webhook_requests(loop.cp, "scaling.webhook.slime")
    assert ("fail-open", "", "") not in calls, calls
    hpa = loop.hpa_object()
    assert hpa is not None and hpa["status"].get("desiredReplicas") == 0
