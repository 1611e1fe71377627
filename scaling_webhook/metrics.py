"""The scaling webhook's own instruments, registered on the service's WebhookMetrics registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from common.admission import bounded
from common.metrics import LATENCY_BUCKETS, WebhookMetrics

DECISION_OUTCOMES = ("accepted", "dry_run", "unmapped", "denied")
WRITE_REASONS = ("mirror", "drift", "adopt")
WAIT_REASONS = ("paused", "autoscaler", "capped", "capacity", "missing")


REQUESTER_LABELS = 32


class ScalingMetrics:
    def __init__(self, metrics: WebhookMetrics) -> None:
        registry = metrics.registry
        self.webhook = metrics
        self.requesters = Counter(
            "slime_scaling_requests_by_requester_total",
            "Scales of mapped mirrors by requester (request.userInfo.username; the first 32 names, then other).",
            ["requester"],
            registry=registry,
        )
        self._requesters: set[str] = set()
        self.decisions = Counter(
            "slime_scaling_decisions_total",
            "Scale admissions by outcome (accepted, dry_run, unmapped, denied).",
            ["outcome"],
            registry=registry,
        )
        self.outcome = {o: self.decisions.labels(o) for o in DECISION_OUTCOMES}
        self.capped_admissions = Counter(
            "slime_scaling_capped_admissions_total",
            "Accepted mirror scales above the mapping's maxReplicas (the MachineDeployment stops at maxReplicas).",
            registry=registry,
        )
        self.patch_seconds = Histogram(
            "slime_scaling_patch_seconds",
            "Time of one MachineDeployment /scale patch by the reconciler.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.writes = Counter(
            "slime_scaling_writes_total",
            "Writes by the leader: MachineDeployments set from a stored mirror change (mirror) or back from a drift "
            "(drift), mirrors adopted from their MachineDeployment (adopt).",
            ["reason"],
            registry=registry,
        )
        self.write = {r: self.writes.labels(r) for r in WRITE_REASONS}
        self.waiting = Gauge(
            "slime_scaling_waiting_mappings",
            "Mappings whose MachineDeployment is not set to its mirror now, by why: paused (MachineDeployment or "
            "Cluster), autoscaler (a cluster-autoscaler node group), capped (mirror above maxReplicas), capacity (an "
            "increase beyond the BareMetalHosts that can take it, capacityAware mappings), missing (mirror or "
            "MachineDeployment absent).",
            ["reason"],
            registry=registry,
        )
        self.capacity_shortfall = Gauge(
            "slime_scaling_capacity_shortfall_replicas",
            "Replicas that capacityAware mappings' mirrors ask for and no available BareMetalHost can take yet "
            "(summed over mappings).",
            registry=registry,
        )
        self.leader = Gauge(
            "slime_scaling_leader",
            "1 when this replica holds the Lease and is the one writer, else 0.",
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "slime_scaling_reconcile_errors_total",
            "Mappings the reconciler could not check or correct (API errors).",
            registry=registry,
        )
        self.config_valid = Gauge(
            "slime_scaling_config_valid",
            "1 when the scaling ConfigMap was parsed, 0 when it is invalid (the last good mappings stay in use).",
            registry=registry,
        )
        self.config_errors = Counter(
            "slime_scaling_config_errors_total",
            "Invalid versions of the scaling ConfigMap seen.",
            registry=registry,
        )
        self.mappings = Gauge(
            "slime_scaling_mappings",
            "Mirror -> MachineDeployment mappings in use.",
            registry=registry,
        )
        self.events = Counter(
            "slime_scaling_events_total",
            "Kubernetes Events recorded on MachineDeployments, by result (success, failure).",
            ["result"],
            registry=registry,
        )
        # Safe scale-in (opt-in per mapping).
        self.scale_in_victims = Counter(
            "slime_scaling_scale_in_victims_total",
            "Machines drained in Slurm and marked for deletion (cluster.x-k8s.io/delete-machine) by safe scale-in.",
            registry=registry,
        )
        self.scale_in_deferred = Counter(
            "slime_scaling_scale_in_deferred_total",
            "Replicas a scale-down could not remove yet because too few Slurm nodes were idle.",
            registry=registry,
        )
        self.reclaimed = Counter(
            "slime_scaling_reclaimed_total",
            "Machines marked for deletion that a scale-up took back (undrained, mark removed).",
            registry=registry,
        )
        self.scale_up_fallbacks = Counter(
            "slime_scaling_scale_up_fallbacks_total",
            "Safe scale-in scale-ups decided from the watch caches whose conditional /scale write the API server "
            "refused (409: the MachineDeployment had changed since the cache saw it), redone from fresh reads.",
            registry=registry,
        )
        self.drain_overdue = Counter(
            "slime_scaling_drain_overdue_total",
            "Held Machines whose Slurm node was still busy or not drained after drainTimeoutSeconds (each is warned "
            "about, never released).",
            registry=registry,
        )
        self.pools_released = Counter(
            "slime_scaling_pools_released_total",
            "Pools that left safe scale-in (mapping removed or opt-in turned off) and were released: every hook and "
            "mark of SliMe taken off, its drains resumed.",
            registry=registry,
        )
        self.pools_leaving = Gauge(
            "slime_scaling_pools_leaving",
            "Pools that left safe scale-in whose deleting Machines SliMe still holds, each until Slurm reports its "
            "node idle.",
            registry=registry,
        )
        self.orphans_undrained = Counter(
            "slime_scaling_orphan_drains_undone_total",
            "Nodes drained by SliMe whose Machine was neither marked nor deleting, undrained because no scale-in "
            "needed them.",
            registry=registry,
        )
        # Machine health (opt-in per mapping: slurmHealth).
        self.unhealthy_machines = Gauge(
            "slime_scaling_unhealthy_machines",
            "Machines of a slurmHealth pool judged unhealthy in the last pass, by pool (mapping: the "
            "MachineDeployment's namespace/name) and reason (NeverRegistered, NodeLost).",
            ["mapping", "reason"],
            registry=registry,
        )
        self.remediations = Counter(
            "slime_scaling_remediations_total",
            "Unhealthy Machines deleted for their MachineSet to replace (slurmHealth.remediate), by reason.",
            ["reason"],
            registry=registry,
        )
        self.remediation_short_circuits = Counter(
            "slime_scaling_remediation_short_circuits_total",
            "Passes in which a pool had more unhealthy Machines than slurmHealth.maxUnhealthy, so none was "
            "remediated (a site-wide outage must not delete the site).",
            registry=registry,
        )
        self.slurm_errors = Counter(
            "slime_scaling_slurm_errors_total",
            "Failed slurmrestd calls (unreachable, errors, signing key unreadable).",
            registry=registry,
        )
        self.config_valid.set(1)

    def config_status(self, valid: bool, _error: str) -> None:
        self.config_valid.set(1 if valid else 0)
        if not valid:
            self.config_errors.inc()

    def count_requester(self, name: str) -> None:
        """Count a mapped scale by its requester. Review text names the requester, so the label takes
        the first :data:`REQUESTER_LABELS` distinct names and ``other`` after them: bounded cardinality."""
        name = bounded(name)
        if name not in self._requesters and len(self._requesters) >= REQUESTER_LABELS:
            name = "other"
        self._requesters.add(name)
        self.requesters.labels(name or "(none)").inc()

    def event_result(self, ok: bool) -> None:
        self.events.labels("success" if ok else "failure").inc()
