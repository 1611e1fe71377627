"""The whole loop, real: Slurm → Prometheus/`/demand` → KEDA → HPA → mirror → scaling webhook → Cluster API →
injected node joins Slurm → job starts.

Everything is the real program except the metal:

- kube-apiserver, etcd, kube-controller-manager (with the HPA controller and the aggregation
  layer), :mod:`testbed.components.controlplane`;
- cert-manager issuing the chart's PKI (:mod:`testbed.components.certmanager`), the webhook pods'
  secret volumes refreshed as kubelet does;
- KEDA's operator, metrics adapter and admission webhooks (:mod:`testbed.components.keda`),
  Debian's Prometheus (:mod:`testbed.components.prometheus`) scraping Slurm 25.11's partition
  metrics computed from the real Slurm state (:mod:`testbed.components.slurm_metrics`);
- Slurm (slurmctld, slurmrestd; :mod:`testbed.components.slurm`), the pool's hosts declared as
  FUTURE node records named after the BareMetalHosts (docs/install.md: Slurm only queues jobs for
  nodes it has records of);
- the chart installed with ``helm`` (certManager, KEDA with ``keda.demand=nodes``, safe scale-in,
  capacity-aware scale-up, authenticated admission), both webhooks as the chart's pods;
- Cluster API's core manager, CAPM3 and the baremetal-operator in test mode, CAPM3 creating every
  ``metaData`` Secret as its own ServiceAccount;
- the hosts (:mod:`testbed.components.ironic`, :mod:`testbed.components.host`): when BMO reports one
  provisioned, its config drive is built as Ironic builds it and it boots with real cloud-init in a
  network namespace, which runs the documented user-data: its ``slurmd -Z`` joins with the join
  data the injection webhook filled in. No Ironic, no BMC, no kubelet (no Node, no nodeRef).

:func:`whole_loop` assembles the CAPI site of :mod:`testbed.scenarios.capi` with Prometheus,
cert-manager and KEDA added (one :class:`~testbed.scenarios.site.SiteBuilder`), and stops it in
reverse, even on failure. The story run on it is :mod:`testbed.scenarios.story`'s.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.names import ADOPTED_ANNOTATION
from testbed.components import capi, certmanager, keda, metal3, prometheus
from testbed.components.cloudinit import USER_DATA
from testbed.components.debian_root import SlurmRoot, prepare_root
from testbed.components.host import PACKAGES
from testbed.components.release import tier_values
from testbed.framework.objects import SLIME_NAMESPACE
from testbed.framework.progress import Progress, quiet
from testbed.framework.wait import waiter
from testbed.scenarios.capi import CapiParts, metal3_pool
from testbed.scenarios.metal3_cluster import ClusterSpec
from testbed.scenarios.site import JWT_SECRET, MONITORING, Metal3Site, building
from testbed.scenarios.stack import TRANSIENT, image

PARTITION = "batch"
MIRROR = "mirror-batch"
SPEC = ClusterSpec(pool="md-batch", hostname_object="baremetalhost")  # node names = host names = FUTURE records
POLL_SECONDS = 0.2
KEDA_POLLING_SECONDS = 2  # short here so the story takes a minute, not several
KEDA_COOLDOWN_SECONDS = 15


@dataclass(frozen=True)
class Parts:
    """What the loop needs built or fetched, besides the real-Kubernetes tier's parts
    (:func:`testbed.scenarios.stack.prepare`)."""

    certmanager: certmanager.CertManagerBuild
    keda: keda.KedaBinaries
    prometheus: prometheus.PrometheusBinaries
    capi: capi.CapiBuild
    metal3: metal3.Metal3Build
    root: SlurmRoot  # Slurm and cloud-init: the hosts' image, and slurmctld's root


def prepare(progress: Progress) -> Parts:
    """Build or fetch every part (each is cached by version, so a second call takes seconds)."""
    return Parts(
        certmanager.build(progress),
        keda.build(progress),
        prometheus.binaries(progress),
        capi.build(progress),
        metal3.build(progress),
        prepare_root(progress, extra_packages=PACKAGES),
    )


@dataclass
class Loop(Metal3Site):
    """The whole loop's site, and what its story reads."""

    jobs: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.wait_for = waiter(interval=POLL_SECONDS, diagnostics=self.diagnostics, retry_on=TRANSIENT)

    def mirror_replicas(self) -> int:
        mirror = self.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, MIRROR)
        return int(((mirror or {}).get("spec") or {}).get("replicas") or 0)

    def demand(self) -> dict[str, Any] | None:
        """``/demand/<partition>`` of the scaling webhook's pod (KEDA reads the same through the Service)."""
        answer = httpx.get(f"http://127.0.0.1:{self.release.metrics_port('scaling')}/demand/{PARTITION}", timeout=5)
        return answer.json() if answer.status_code == 200 else None

    def slurm_jobs(self) -> dict[int, dict[str, Any]]:
        """Slurm's jobs through slurmrestd (the same API SliMe reads)."""
        answer = self.slurm.rest("GET", f"/slurm/{self.slurm.root.api_version}/jobs/")
        answer.raise_for_status()
        return {int(j["job_id"]): j for j in answer.json().get("jobs") or []}

    def slurm_nodes(self) -> dict[str, set[str]]:
        answer = self.slurm.rest("GET", f"/slurm/{self.slurm.root.api_version}/nodes/")
        answer.raise_for_status()
        return {n["name"]: set(n.get("state") or []) for n in answer.json().get("nodes") or []}

    def submit(self, nodes: int, release: str) -> int:
        """A job of ``nodes`` nodes that runs until :meth:`finish` ``release`` (one task per node, in the shared
        directory)."""
        wrap = f"srun -N{nodes} sh -c 'while [ ! -e /srv/slime/{release} ]; do sleep 0.2; done'"
        job = self.slurm.sbatch(f"-N{nodes}", "-p", PARTITION, "--wrap", wrap)
        self.jobs.append(job)
        return job

    def finish(self, release: str) -> None:
        (self.slurm.shared / release).touch()

    def adopted(self) -> bool:
        mirror = self.api.get("apps/v1", "Deployment", SLIME_NAMESPACE, MIRROR) or {}
        return bool(((mirror.get("metadata") or {}).get("annotations") or {}).get(ADOPTED_ANNOTATION))

    def keda_polled(self) -> bool:
        """KEDA's ScaledObject says Ready and not Active: a poll of its trigger ran and answered (an error sets Ready
        False)."""
        conditions = {c.get("type"): c for c in self._scaled_conditions()}
        ready, active = conditions.get("Ready") or {}, conditions.get("Active") or {}
        return (
            ready.get("status") == "True"
            and active.get("status") == "False"
            and active.get("reason") == "ScalerNotActive"
        )

    def _scaled_conditions(self) -> list[dict[str, Any]]:
        scaled = self.api.get("keda.sh/v1alpha1", "scaledobjects", SLIME_NAMESPACE, MIRROR) or {}
        conditions: list[dict[str, Any]] = (scaled.get("status") or {}).get("conditions") or []
        return conditions

    def diagnostics(self) -> str:
        try:
            demand = json.dumps(self.demand())
        except httpx.HTTPError as exc:
            demand = f"unreadable ({type(exc).__name__})"
        conditions = [(c.get("type"), c.get("status"), c.get("reason")) for c in self._scaled_conditions()]
        waiting = {
            job: (j.get("job_state"), j.get("state_reason"), (j.get("node_count") or {}).get("number"))
            for job, j in self.slurm_jobs().items()
            if "COMPLETED" not in (j.get("job_state") or [])
        }
        lines = [
            f"mirror {self.mirror_replicas()}; /demand/{PARTITION} {demand}; ScaledObject conditions {conditions}",
            f"jobs not completed (state, reason, nodes) {waiting}",
        ]
        return "\n".join([*lines, super().diagnostics()])

    def key_leaks(self) -> list[str]:
        """The names of the logs that hold slurm.key or the JWT key, raw or base64 (none may)."""
        secrets = [self.slinky.key, self.slinky.jwt_key]
        needles = [n for secret in secrets for n in (secret, base64.b64encode(secret)) if len(secret) >= 16]
        return [name for name, text in self.logs().items() if any(n.decode("latin-1") in text for n in needles)]


def values(loop: Loop, hosts: int) -> dict[str, Any]:
    """The chart as an operator would install it for one Metal3 pool that KEDA scales on node demand."""
    mapping = {
        "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
        "machineDeployment": {"name": SPEC.pool, "namespace": SPEC.namespace},
        "partition": PARTITION,
        # The HPA's scale-down window as short as KEDA's cooldown: with its default 300 s, a story run
        # again within 5 minutes started its 1-node job at the previous story's 4 (chart values.yaml).
        "keda": {
            "demand": "nodes",
            "minReplicaCount": 0,
            "maxReplicaCount": hosts,
            "pollingInterval": KEDA_POLLING_SECONDS,
            "cooldownPeriod": KEDA_COOLDOWN_SECONDS,
            "scaleDownStabilizationSeconds": KEDA_COOLDOWN_SECONDS,
        },
        "config": {
            "capacityAware": True,
            "safeScaleIn": {"slurmrestd": loop.slurm.restd_url, "jwtSecret": f"{SPEC.slurm_namespace}/{JWT_SECRET}"},
        },
    }
    return tier_values(
        image(),
        [mapping],
        certManager={"enabled": True},
        keda={"enabled": True, "serverAddress": f"http://prometheus.{MONITORING}.svc:{loop.prometheus.port}"},
        scaling={
            "safeScaleIn": {"enabled": True, "jwtSecrets": [{"name": JWT_SECRET, "namespace": SPEC.slurm_namespace}]},
            "capacityAware": {"enabled": True},
            "extraArgs": ["--demand-interval-seconds=1"],
        },
    )


@contextmanager
def whole_loop(workdir: Path, parts: Parts, hosts: int = 4, progress: Progress = quiet) -> Iterator[Loop]:
    """Everything up in order (a line of progress per part), and down in reverse, by PID, namespaces removed, even on
    failure."""
    names = [f"host-{index + 1}" for index in range(hosts)]
    pool = CapiParts(parts.capi, parts.metal3, parts.root)
    with building(Loop(workdir, spec=SPEC), progress) as (loop, build):
        metal3_pool(
            build,
            pool,
            user_data=USER_DATA,
            crds=tuple(parts.certmanager.crds),
            audit_scale_steps=True,
            namespaces=(MONITORING,),
            partition=PARTITION,
            future=",".join(names),
        )
        build.step("Slurm up, the pool's hosts declared as FUTURE records")
        build.prometheus(parts.prometheus)
        build.certmanager(parts.certmanager)
        build.keda(parts.keda)
        build.step("Prometheus, cert-manager and KEDA up")
        build.chart(values(loop, hosts))
        build.authenticated_admission()
        build.webhooks(kubelet_volumes=True)
        build.step("the chart installed with helm: certificates issued by cert-manager, both webhooks serving them")
        build.controllers(parts.capi, parts.root)
        build.hosts(names)
        build.step(f"Cluster API, CAPM3 and BMO up, {hosts} BareMetalHosts registered and available")
        # Steady state before the story, as on a cluster that has run a while: the mirror adopted the
        # pool's 0, and KEDA has polled the node demand once without error (Ready, not Active).
        loop.wait_for(loop.adopted, 60, f"the scaling leader to adopt {SPEC.pool}'s replicas into {MIRROR}")
        loop.wait_for(loop.keda_polled, 120, f"KEDA to poll {MIRROR}'s node demand without error")
        build.step("KEDA polls the node demand; the pool is at 0")
        yield loop
