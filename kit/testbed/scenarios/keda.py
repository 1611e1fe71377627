"""The KEDA part of the whole loop: real Slurm -> Prometheus -> KEDA -> HPA -> mirror ->
MachineDeployment.

Everything here is the real program except where metal or a cluster network would be needed:

- **Slurm** (slurmctld, slurmrestd; :mod:`testbed.components.slurm`) with partition ``batch``.
  The pool's hosts are known to Slurm as FUTURE node records (``scontrol create NodeName=bm-[1-4]
  State=FUTURE``): real Slurm refuses at submission a job asking more nodes than its partition has
  records for (kit/tests/real_slurm/test_demand.py), so jobs can only queue for hosts Slurm knows of.
  No host boots here: the jobs stay pending, which is what scales the pool.
- **The Slurm metrics endpoint**: :mod:`testbed.components.slurm_metrics`, Slurm 25.11's
  ``/metrics/partitions`` text computed from the real Slurm state.
- **Prometheus** (Debian's, :mod:`testbed.components.prometheus`) scraping it every second, behind a
  ``monitoring/prometheus`` Service of type ExternalName ``localhost``, so the chart's
  ``keda.serverAddress`` names it as an operator would: ``http://prometheus.monitoring.svc:<port>``.
- **KEDA** (:mod:`testbed.components.keda`): operator, metrics adapter and admission webhooks
  from the Go module proxy, installed from KEDA's own manifests, the adapter reached by
  kube-apiserver through its APIService; kube-controller-manager's HPA controller reads it.
- **kube-scheduler** and one Node object with no kubelet behind it (:data:`NODE`): the scheduler binds
  any pod it may to that Node, so a mirror pod left unbound is one its scheduling gate kept back.
- **The chart**, installed with ``helm`` (``keda.enabled=true``), its two webhooks run as the
  chart's pods (podman, as in the real-Kubernetes tier). Two mappings on the same partition: one
  scales on jobs (the chart's PromQL query), one on nodes (``keda.demand=nodes``: the metrics-api
  trigger on the scaling webhook's ``/demand/batch``, which reads the real slurmrestd).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.names import ADOPTED_ANNOTATION
from testbed.components.controlplane import ControlPlane
from testbed.components.debian_root import SlurmRoot, prepare_root
from testbed.components.keda import KedaBinaries
from testbed.components.keda import build as build_keda
from testbed.components.prometheus import PrometheusBinaries, binaries
from testbed.components.release import tier_values
from testbed.components.slurm import SlurmConfig
from testbed.framework.metrics import samples
from testbed.framework.objects import SLIME_NAMESPACE, machine_deployment
from testbed.framework.ports import free_port
from testbed.scenarios.site import JWT_SECRET, MONITORING, Site, building
from testbed.scenarios.stack import CLUSTER, image

PARTITION = "batch"
MD_NAMESPACE = "metal3"
POOL_HOSTS = "bm-[1-4]"  # FUTURE node records: the most hosts the pools can have (maxReplicaCount 4)
MAX_REPLICAS = 4
JOBS, NODES = "jobs", "nodes"  # the two mappings: mirror-<x>, md-<x>
SCALED_OBJECT_WEBHOOK = "vscaledobject.kb.io"  # KEDA's admission webhook for ScaledObjects
NODE = "node-without-kubelet"  # kube-scheduler's one Node


@dataclass(frozen=True)
class KedaParts:
    keda: KedaBinaries
    prometheus: PrometheusBinaries
    slurm_root: SlurmRoot


def prepare(progress: Any) -> KedaParts:
    """Build KEDA (the largest Go build of the tiers), fetch Debian's Prometheus, make the Slurm root."""
    return KedaParts(build_keda(progress), binaries(progress), prepare_root(progress))


def mirror_name(demand: str) -> str:
    return f"mirror-{demand}"


def md_name(demand: str) -> str:
    return f"md-{demand}"


@dataclass
class Loop(Site):
    """Two pools on one partition, one scaled on jobs (the chart's PromQL), one on nodes (``/demand``)."""

    install_admissions: dict[tuple[str, str, str], float] = field(default_factory=dict)  # during helm install
    jobs: list[int] = field(default_factory=list)

    def mirror_replicas(self, demand: str) -> int | None:
        obj = self.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, mirror_name(demand))
        return None if obj is None else obj["spec"].get("replicas")

    def mirror_pods(self, demand: str) -> list[dict[str, Any]]:
        """The mapping's mirror's Pod objects (its ReplicaSet makes them), by the chart's ``slime/mirror`` label."""
        return self.api.list("v1", "pods", SLIME_NAMESPACE, label_selector=f"slime/mirror={mirror_name(demand)}")

    def adopted(self, demand: str) -> bool:
        """The scaling leader's adoption mark on the mirror (it then holds the MachineDeployment's replicas)."""
        obj = self.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, mirror_name(demand))
        annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        return annotations.get(ADOPTED_ANNOTATION) == f"{MD_NAMESPACE}/{md_name(demand)}"

    def md_replicas(self, demand: str) -> int | None:
        obj = self.api.get("cluster.x-k8s.io/v1beta2", "MachineDeployment", MD_NAMESPACE, md_name(demand))
        return None if obj is None else obj["spec"].get("replicas")

    def scaled_object(self, demand: str) -> dict[str, Any]:
        obj = self.api.get("keda.sh/v1alpha1", "scaledobjects", SLIME_NAMESPACE, mirror_name(demand))
        assert obj is not None, f"no ScaledObject {mirror_name(demand)}"
        return obj

    def hpa(self, demand: str) -> dict[str, Any] | None:
        """The HPA KEDA made for the mapping's ScaledObject (``keda-hpa-<name>``)."""
        return self.api.get(
            "autoscaling/v2", "horizontalpodautoscalers", SLIME_NAMESPACE, f"keda-hpa-{mirror_name(demand)}"
        )

    def external_metric(self, demand: str) -> float | None:
        """The value the HPA controller reads: ``external.metrics.k8s.io`` through kube-apiserver and KEDA's adapter."""
        hpa = self.hpa(demand)
        if hpa is None:
            return None
        metric = hpa["spec"]["metrics"][0]["external"]["metric"]["name"]
        items = self.keda.external_metric(SLIME_NAMESPACE, metric, mirror_name(demand))
        return _quantity(items[0]["value"]) if items else None

    def submit(self, nodes: int) -> int:
        job = self.slurm.sbatch(f"-N{nodes}", "-p", PARTITION, "--wrap", "srun hostname")
        self.jobs.append(job)
        return job

    def cancel_all(self) -> None:
        if self.jobs:
            self.slurm.client(["scancel", *map(str, self.jobs)])
            self.jobs.clear()


def webhook_requests(cp: ControlPlane, webhook: str) -> dict[tuple[str, str, str], float]:
    """``apiserver_admission_webhook_request_total`` of one webhook by (operation, rejected, HTTP code), plus
    ``("fail-open", "", "")``: calls kube-apiserver could not complete and let through (failurePolicy Ignore)."""
    text = cp.api.metrics()
    counts: dict[tuple[str, str, str], float] = {}
    for labels, value in samples(text, "apiserver_admission_webhook_request_total"):
        if labels.get("name") == webhook:
            key = (labels["operation"], labels["rejected"], labels["code"])
            counts[key] = counts.get(key, 0.0) + value
    for labels, value in samples(text, "apiserver_admission_webhook_fail_open_count"):
        if labels.get("name") == webhook:
            counts[("fail-open", "", "")] = counts.get(("fail-open", "", ""), 0.0) + value
    return counts


# The scaling webhook's answer to a scale it cannot check yet (its watches have not listed the mirror and the
# MachineDeployment, a moment after its pod starts): refused with 503, never guessed; KEDA and the HPA retry.
NOT_LISTED_YET = "the webhook has not listed the mirror and MachineDeployment yet"
# And its answer to a review whose old object is not the stored mirror (409): KEDA's write racing the leader's
# adoption of the mirror (1 -> the MachineDeployment's 0) a moment after the pod starts; the writer retries.
STALE_REVIEW = "is not the stored mirror's"
# How apiserver_admission_webhook_request_total counts those two answers.
STARTUP_REFUSALS = {("UPDATE", "true", "503"), ("UPDATE", "true", "409")}


def refused_scales(cp: ControlPlane) -> list[dict[str, Any]]:
    """The answers to every refused mirror ``/scale`` write in the audit log, but for the webhook's two answers in
    the moment after its pod starts (:data:`NOT_LISTED_YET`, :data:`STALE_REVIEW`); an API server 409 "Operation
    cannot be fulfilled", the loser of a KEDA/HPA race, is no refusal either."""
    refused = []
    for event in cp.audit_events():
        ref = event.get("objectRef") or {}
        if ref.get("subresource") != "scale" or ref.get("resource") != "deployments":
            continue
        if event.get("verb") not in ("update", "patch") or event.get("stage") != "ResponseComplete":
            continue
        status = event.get("responseStatus") or {}
        message = str(status.get("message", ""))
        conflict = status.get("reason") == "Conflict" and "admission webhook" not in message
        startup = NOT_LISTED_YET in message or STALE_REVIEW in message
        if status.get("code") != 200 and not startup and not conflict:
            refused.append(status)
    return refused


def _quantity(text: str) -> float:
    """A Kubernetes quantity as the metrics API writes it (``3``, ``2500m``, ``1k``)."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)


def values(loop: Loop) -> dict[str, Any]:
    def mapping(demand: str) -> dict[str, Any]:
        return {
            "mirror": {"name": mirror_name(demand), "namespace": SLIME_NAMESPACE},
            "machineDeployment": {"name": md_name(demand), "namespace": MD_NAMESPACE},
            "partition": PARTITION,
            "keda": {"demand": demand, "maxReplicaCount": MAX_REPLICAS},
        }

    server = f"http://prometheus.{MONITORING}.svc:{loop.prometheus.port}"
    return tier_values(
        image(),
        [mapping(JOBS), mapping(NODES)],
        keda={"enabled": True, "serverAddress": server, "pollingInterval": 2},
        scaling={
            "nodeDemand": {"slurmrestd": loop.slurm.restd_url, "jwtSecret": {"namespace": "slurm", "name": JWT_SECRET}},
            "extraArgs": ["--demand-interval-seconds=1"],
        },
    )


@contextmanager
def loop(parts: KedaParts, workdir: Path) -> Iterator[Loop]:
    """The whole KEDA loop, started in order and stopped in reverse (by PID, container ID), even on failure."""
    with building(Loop(workdir)) as (result, build):
        build.control_plane()
        build.scheduler(NODE)
        build.namespaces(MD_NAMESPACE, "slurm", MONITORING)
        build.slinky()
        # Slurm with the keys of Slinky's Secrets; slurmctld and slurmrestd on 127.0.0.1.
        config = SlurmConfig(address="127.0.0.1", port=free_port(30000, 32767), partition=PARTITION)
        build.slurm(parts.slurm_root, config, future_nodes=POOL_HOSTS)
        build.prometheus(parts.prometheus)
        build.keda(parts.keda)
        for demand in (JOBS, NODES):
            md = machine_deployment(
                md_name(demand), MD_NAMESPACE, replicas=0, version="v1beta2", cluster=CLUSTER, full=True
            )
            result.api.create(md)
        build.chart(values(result))
        # Read before the API server restart below resets the counters.
        result.install_admissions = webhook_requests(result.cp, SCALED_OBJECT_WEBHOOK)
        build.authenticated_admission()
        build.webhooks()
        yield result
