"""The KEDA part of the whole loop (issue 15, item 2): real Slurm -> Prometheus -> KEDA -> HPA -> mirror ->
MachineDeployment.

Everything here is the real program except where metal or a cluster network would be needed:

- **Slurm 24.11** (slurmctld, slurmrestd; :mod:`testbed.real.slurm`) with partition ``batch``.
  The pool's hosts are known to Slurm as FUTURE node records (``scontrol create NodeName=bm-[1-4]
  State=FUTURE``): real Slurm refuses at submission a job asking more nodes than its partition has
  records for (tests/real_slurm/test_demand.py), so jobs can only queue for hosts Slurm knows of.
  No host boots here: the jobs stay pending, which is what scales the pool.
- **The Slurm metrics endpoint**: :mod:`testbed.real.slurm_metrics`, Slurm 25.11's
  ``/metrics/partitions`` text computed from the real 24.11 state (24.11 has no such endpoint).
- **Prometheus** (Debian's, :mod:`testbed.real.prometheus`) scraping it every second, behind a
  ``monitoring/prometheus`` Service of type ExternalName ``localhost``, so the chart's
  ``keda.serverAddress`` names it as an operator would: ``http://prometheus.monitoring.svc:<port>``.
- **KEDA v2.21.0** (:mod:`testbed.real.keda`): operator, metrics adapter and admission webhooks
  from the Go module proxy, installed from KEDA's own manifests, the adapter reached by
  kube-apiserver through its APIService; kube-controller-manager's HPA controller reads it.
- **The chart**, installed with ``helm`` (``keda.enabled=true``), its two webhooks run as the
  chart's pods (podman, as in the real-Kubernetes tier). Two mappings on the same partition: one
  scales on jobs (the chart's PromQL query), one on nodes (``keda.demand=nodes``: the metrics-api
  trigger on the scaling webhook's ``/demand/batch``, which reads the real slurmrestd).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.names import ADOPTED_ANNOTATION
from testbed.audit import EVIDENCE
from testbed.ports import free_port
from testbed.real import keda as keda_mod
from testbed.real import prometheus as prometheus_mod
from testbed.real import story as k8s
from testbed.real.controlplane import ControlPlane, ControlPlaneError
from testbed.real.keda import Keda, KedaBinaries
from testbed.real.objects import RealApi
from testbed.real.prometheus import Prometheus, PrometheusBinaries
from testbed.real.release import Release, tier_values
from testbed.real.slurm import Slurm, SlurmConfig, SlurmRoot, prepare_root
from testbed.real.slurm_metrics import PATH as METRICS_PATH
from testbed.real.slurm_metrics import SlurmMetrics
from testbed.world import SLIME_NAMESPACE, SlurmCluster, ensure_namespace, machine_deployment

Progress = Callable[[str], None]
PARTITION = "batch"
MD_NAMESPACE = "metal3"
POOL_HOSTS = "bm-[1-4]"  # FUTURE node records: the most hosts the pools can have (maxReplicaCount 4)
MAX_REPLICAS = 4
JOBS, NODES = "jobs", "nodes"  # the two mappings: mirror-<x>, md-<x>
MONITORING = "monitoring"
SCALED_OBJECT_WEBHOOK = "vscaledobject.kb.io"  # KEDA's admission webhook for ScaledObjects


@dataclass(frozen=True)
class Prepared:
    keda: KedaBinaries
    prometheus: PrometheusBinaries
    slurm_root: SlurmRoot


def prepare(progress: Progress) -> Prepared:
    """Build KEDA (the largest Go build of the tiers), fetch Debian's Prometheus, make the Slurm root."""
    return Prepared(keda_mod.build(progress), prometheus_mod.binaries(progress), prepare_root(progress))


def mirror_name(demand: str) -> str:
    return f"mirror-{demand}"


def md_name(demand: str) -> str:
    return f"md-{demand}"


@dataclass
class Loop:
    cp: ControlPlane
    api: RealApi
    slurm: Slurm
    slinky: SlurmCluster
    metrics: SlurmMetrics
    prometheus: Prometheus
    keda: Keda
    stack: k8s.Stack
    workdir: Path
    install_admissions: dict[tuple[str, str, str], float]  # KEDA's ScaledObject webhook during helm install
    jobs: list[int] = field(default_factory=list)

    @property
    def release(self) -> Release:
        return self.stack.release

    def mirror_replicas(self, demand: str) -> int | None:
        obj = self.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, mirror_name(demand))
        return None if obj is None else obj["spec"].get("replicas")

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

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait; a timeout shows the end of the webhooks' and KEDA's logs (none of them holds a key)."""
        try:
            self.stack.wait_for(condition, timeout, what)
        except ControlPlaneError as exc:
            tails = "\n".join(
                f"--- KEDA {name} ---\n" + "\n".join(text.splitlines()[-15:]) for name, text in self.keda.logs().items()
            )
            raise AssertionError(f"{exc}\n{tails}") from None


def webhook_requests(cp: ControlPlane, webhook: str) -> dict[tuple[str, str, str], float]:
    """``apiserver_admission_webhook_request_total`` of one webhook by (operation, rejected, HTTP code), plus
    ``("fail-open", "", "")``: calls kube-apiserver could not complete and let through (failurePolicy Ignore)."""
    counts: dict[tuple[str, str, str], float] = {}
    for line in cp.metrics().splitlines():
        if f'name="{webhook}"' not in line:
            continue
        labels = dict(part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(","))
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("apiserver_admission_webhook_request_total{"):
            key = (labels["operation"].strip('"'), labels["rejected"].strip('"'), labels["code"].strip('"'))
        elif line.startswith("apiserver_admission_webhook_fail_open_count{"):
            key = ("fail-open", "", "")
        else:
            continue
        counts[key] = counts.get(key, 0.0) + value
    return counts


def _quantity(text: str) -> float:
    """A Kubernetes quantity as the metrics API writes it (``3``, ``2500m``, ``1k``)."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)


def values(image: str, prometheus_port: int, slurm: Slurm) -> dict[str, Any]:
    def mapping(demand: str) -> dict[str, Any]:
        return {
            "mirror": {"name": mirror_name(demand), "namespace": SLIME_NAMESPACE},
            "machineDeployment": {"name": md_name(demand), "namespace": MD_NAMESPACE},
            "partition": PARTITION,
            "keda": {"demand": demand, "maxReplicaCount": MAX_REPLICAS},
        }

    return tier_values(
        image,
        [mapping(JOBS), mapping(NODES)],
        keda={
            "enabled": True,
            "serverAddress": f"http://prometheus.{MONITORING}.svc:{prometheus_port}",
            "pollingInterval": 2,
        },
        scaling={
            "nodeDemand": {
                "slurmrestd": slurm.restd_url,
                "jwtSecret": {"namespace": "slurm", "name": "slurm-auth-jwths256"},
            },
            "extraArgs": ["--demand-interval-seconds=1"],
        },
    )


@contextlib.contextmanager
def loop(prepared: Prepared, workdir: Path) -> Iterator[Loop]:
    """The whole KEDA loop, started in order and stopped in reverse (by PID, container ID), even on failure."""
    with contextlib.ExitStack() as stack:
        cp = k8s.start_control_plane(workdir / "control-plane")
        stack.callback(cp.stop)
        api = RealApi(cp)
        for namespace in (MD_NAMESPACE, "slurm", MONITORING):
            ensure_namespace(api, namespace)
        slinky = k8s.seed_management_cluster(api)
        # Slurm with the keys of Slinky's Secrets; slurmctld and slurmrestd on 127.0.0.1.
        slurm = Slurm(
            prepared.slurm_root,
            workdir / "slurm",
            SlurmConfig(address="127.0.0.1", port=free_port(30000, 32767), partition=PARTITION),
            slurm_key=slinky.key,
            jwt_key=slinky.jwt_key,
        )
        stack.callback(_close_slurm, slurm)
        slurm.start()
        slurm.scontrol("create", f"NodeName={POOL_HOSTS}", "CPUs=2", "State=FUTURE")
        metrics = SlurmMetrics(slurm.restd_url, slurm.jwt_key).start()
        stack.callback(metrics.stop)
        prometheus = Prometheus(
            workdir / "prometheus", prepared.prometheus, {"slurm": (METRICS_PATH, [metrics.address])}
        ).start()
        stack.callback(prometheus.stop)
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "prometheus", "namespace": MONITORING},
                "spec": {
                    "type": "ExternalName",
                    "externalName": "localhost",
                    "ports": [{"name": "web", "port": prometheus.port, "protocol": "TCP"}],
                },
            }
        )
        keda = Keda(cp, prepared.keda, workdir / "keda")
        stack.callback(_stop_keda, keda)
        # KEDA first: the chart checks that the cluster serves keda.sh/v1alpha1 ScaledObject, and
        # KEDA's admission webhook must be there to validate the chart's ScaledObjects as they are created.
        keda.install()
        keda.start()
        for demand in (JOBS, NODES):
            api.create(
                machine_deployment(
                    md_name(demand), MD_NAMESPACE, replicas=0, version="v1beta2", cluster=k8s.CLUSTER, full=True
                )
            )
        release = Release(
            cp,
            SLIME_NAMESPACE,
            values(k8s.PREPARED.image or "localhost/slime:process", prometheus.port, slurm),
            workdir,
        )
        release.install()
        install_admissions = webhook_requests(
            cp, SCALED_OBJECT_WEBHOOK
        )  # read before the restart below resets the counters
        keda.resolve()  # the chart's Services, now ExternalName localhost, resolve for KEDA
        cp.restart_apiserver(release.admission_configuration(workdir / "admission"))
        webhooks = k8s.Stack(cp, release, api, slinky, workdir)
        stack.callback(webhooks.stop_webhooks)
        for component in ("injection", "scaling"):
            webhooks.start_webhook(component)
        yield Loop(cp, api, slurm, slinky, metrics, prometheus, keda, webhooks, workdir, install_admissions)


def _close_slurm(slurm: Slurm) -> None:
    slurm.close()
    for name, text in slurm.logs().items():
        EVIDENCE.add_text(f"keda loop slurm {name}", text)


def _stop_keda(keda: Keda) -> None:
    keda.stop()
    for name, text in keda.logs().items():  # the session's secret scan: no key in KEDA's logs
        EVIDENCE.add_text(f"keda {name}", text)
