"""Without KEDA: a plain HPA with ``minReplicas: 0`` on a mirror, driven by SliMe's node demand (docs/install.md).

What is real: kube-apiserver and kube-controller-manager (its HPA controller) of the tiers'
Kubernetes, which from 1.37 admits ``minReplicas: 0`` with an External metric (``HPAScaleToZero``,
beta and on by default); real Slurm 26.05 (slurmctld, slurmrestd) with the pool's FUTURE records;
the chart installed with ``keda.enabled=false`` and docs/install.md's values (``safeScaleIn.enabled``
for the chart's rule on the JWT Secret; the mapping's ``nodeDemand`` names its slurmrestd itself:
see :func:`values`), both webhooks as the chart's pods. What stands in: the adapter serving ``external.metrics.k8s.io``
(:mod:`testbed.components.metrics_adapter`), in prometheus-adapter's place, answering the
``slime_demand_nodes`` gauge the scaling pod publishes, as docs/install.md's ``externalRules``
query would through Prometheus. No host boots: jobs stay pending, which is what scales the pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from testbed.components.debian_root import SlurmRoot
from testbed.components.release import tier_values
from testbed.components.slurm import SlurmConfig
from testbed.framework.metrics import samples
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment
from testbed.framework.ports import free_port
from testbed.scenarios.keda import MAX_REPLICAS, MD_NAMESPACE, PARTITION, POOL_HOSTS, Loop, md_name, mirror_name
from testbed.scenarios.site import JWT_SECRET, building
from testbed.scenarios.stack import CLUSTER, image

POOL = "hpa"  # the one mapping: mirror-hpa, md-hpa
METRIC = "slime_demand_nodes"


@dataclass
class HpaLoop(Loop):
    """One pool on ``batch``, its mirror scaled by a plain HPA on the node-demand gauge."""

    def demand_gauge(self, metric: str, selector: dict[str, str]) -> float | None:
        """What the adapter answers: the scaling pod's gauge for the selected partition (None: withdrawn)."""
        port = self.release.values["scaling"]["metricsPort"]
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return None
        found = [v for labels, v in samples(text, metric) if all(labels.get(k) == x for k, x in selector.items())]
        return max(found) if found else None

    def diagnostics(self) -> str:
        hpa = self.hpa_object() or {}
        asked = self.adapter.requests[-3:] if self.has("adapter") else []
        return "\n".join(
            [f"HPA status {hpa.get('status')}", f"the adapter's last reads {asked}", super().diagnostics()]
        )

    def hpa_object(self) -> dict[str, Any] | None:
        return self.api.get("autoscaling/v2", "horizontalpodautoscalers", SLIME_NAMESPACE, mirror_name(POOL))

    def hpa_condition(self, kind: str) -> str:
        """The status ("True", "False", "" when absent) of one of the HPA's conditions."""
        conditions = ((self.hpa_object() or {}).get("status") or {}).get("conditions") or []
        return next((str(c.get("status")) for c in conditions if c.get("type") == kind), "")


def values(loop: HpaLoop) -> dict[str, Any]:
    """docs/install.md's values without KEDA, for the tier's Slurm."""
    jwt = f"slurm/{JWT_SECRET}"
    mapping = {
        "mirror": {"name": mirror_name(POOL), "namespace": SLIME_NAMESPACE},
        "machineDeployment": {"name": md_name(POOL), "namespace": MD_NAMESPACE},
        "partition": PARTITION,
        "maxReplicas": MAX_REPLICAS,
        # nodeDemand names its slurmrestd itself: docs/install.md's example takes it from a safeScaleIn block,
        # which here would hold the pool at 1 for ever (no Cluster API makes the Machine its replicas count).
        "config": {"nodeDemand": {"partition": PARTITION, "slurmrestd": loop.slurm.restd_url, "jwtSecret": jwt}},
    }
    return tier_values(
        image(),
        [mapping],
        keda={"enabled": False},
        scaling={
            "safeScaleIn": {"enabled": True, "jwtSecrets": [{"namespace": "slurm", "name": JWT_SECRET}]},
            "extraArgs": ["--demand-interval-seconds=1"],
        },
    )


def hpa() -> dict[str, Any]:
    """docs/install.md's HPA, with no scale-down window (the test waits for 0, not for 300 s)."""
    metric = {"name": METRIC, "selector": {"matchLabels": {"partition": PARTITION}}}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": mirror_name(POOL), "namespace": SLIME_NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": mirror_name(POOL)},
            "minReplicas": 0,
            "maxReplicas": MAX_REPLICAS,
            "metrics": [
                {
                    "type": "External",
                    "external": {"metric": metric, "target": {"type": "AverageValue", "averageValue": "1"}},
                }
            ],
            "behavior": {
                "scaleUp": {"policies": [{"type": "Pods", "value": MAX_REPLICAS, "periodSeconds": 15}]},
                "scaleDown": {"stabilizationWindowSeconds": 0},
            },
        },
    }


@contextmanager
def hpa_loop(slurm_root: SlurmRoot, workdir: Path) -> Iterator[HpaLoop]:
    """The loop without KEDA, started in order and stopped in reverse, even on failure."""
    with building(HpaLoop(workdir)) as (result, build):
        build.control_plane()
        build.namespaces(MD_NAMESPACE, "slurm")
        build.slinky()
        config = SlurmConfig(address="127.0.0.1", port=free_port(30000, 32767), partition=PARTITION)
        build.slurm(slurm_root, config, future_nodes=POOL_HOSTS)
        # At 1, not 0: kube-controller-manager's HPA scales a target up from 0 only when it took it to 0 itself
        # (its ScaledToZero condition; docs/install.md, "Without KEDA"). The mirror adopts 1, the HPA takes it to 0.
        md = machine_deployment(md_name(POOL), MD_NAMESPACE, replicas=1, version="v1beta2", cluster=CLUSTER, full=True)
        result.api.create(md)
        build.chart(values(result))
        build.authenticated_admission()
        build.webhooks()
        build.external_metrics(result.demand_gauge)
        result.api.create(hpa())
        yield result
