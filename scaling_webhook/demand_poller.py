"""Reads node demand from slurmrestd and publishes it: a Prometheus gauge and a KEDA ``metrics-api`` endpoint.

Every replica polls (KEDA may reach any replica behind the Service): per slurmrestd endpoint,
one ``GET jobs`` and one ``GET partitions`` every ``--demand-interval-seconds``, then the rule of
:mod:`scaling_webhook.demand` per mapped partition. After the first listing, ``GET jobs`` asks with
``update_time`` (slurmctld's ``last_update``): when no job changed, slurmctld sends no jobs and the
jobs parsed last time are used again, re-evaluated at the current time (begin times pass).
slurmctld's OpenMetrics (Slurm >= 25.11) are not used: they count pending jobs per partition but
not the nodes those jobs ask for, which is the demand. Gauges (label ``partition`` only):
``slime_demand_nodes``, ``_running_nodes``, ``_pending_nodes``, ``_ignored_jobs``.

An unknown demand is never a number: when slurmrestd fails, or the last reading is older than
three intervals, the partition's gauges are removed (Prometheus sees no sample) and
``GET /demand/<partition>`` answers 503 with the reason, so KEDA keeps the replicas it has
(or applies the ScaledObject's ``fallback``) instead of scaling to a wrong value.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Gauge
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common.kube import KubeClient
from scaling_webhook.demand import Demand, DemandError, Job, node_demand, parse_job, partition_max_nodes
from scaling_webhook.mappings import Mapping, MappingSource
from scaling_webhook.metrics import ScalingMetrics
from scaling_webhook.slurm.endpoint import SlurmEndpoint
from scaling_webhook.slurm.slurmrestd import SlurmClient, SlurmUnavailable

log = logging.getLogger("slime.scaling.demand")

STALE_AFTER_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class Reading:
    """The last answer for one partition: a demand, or why there is none."""

    partition: str
    at: float  # time.time() of the reading
    demand: Demand | None = None
    error: str = ""


class DemandGauges:
    def __init__(self, metrics: ScalingMetrics) -> None:
        registry = metrics.webhook.registry
        self.nodes = Gauge(
            "slime_demand_nodes",
            "Nodes the partition's work needs: nodes of running jobs + nodes "
            "requested by pending jobs that nodes would start (docs/scaling.md, node demand).",
            ["partition"],
            registry=registry,
        )
        self.running = Gauge(
            "slime_demand_running_nodes",
            "Distinct nodes allocated to the partition's running jobs.",
            ["partition"],
            registry=registry,
        )
        self.pending = Gauge(
            "slime_demand_pending_nodes",
            "Nodes requested by the partition's pending jobs that nodes would start.",
            ["partition"],
            registry=registry,
        )
        self.ignored = Gauge(
            "slime_demand_ignored_jobs",
            "Pending jobs (array tasks) not counted: held, dependent, begin time, never fit, or blocked by a limit.",
            ["partition"],
            registry=registry,
        )
        self.all = (self.nodes, self.running, self.pending, self.ignored)

    def show(self, demand: Demand) -> None:
        partition = demand.partition
        self.nodes.labels(partition).set(demand.nodes)
        self.running.labels(partition).set(demand.running_nodes)
        self.pending.labels(partition).set(demand.pending_nodes)
        self.ignored.labels(partition).set(sum(demand.ignored.values()))

    def hide(self, partition: str) -> None:
        for gauge in self.all:
            with contextlib.suppress(KeyError):
                gauge.remove(partition)


class DemandPoller:
    def __init__(
        self,
        kube: KubeClient,
        source: MappingSource,
        metrics: ScalingMetrics,
        interval_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.source = source
        self.metrics = metrics
        self.interval = interval_seconds
        self.clock = clock
        self.gauges = DemandGauges(metrics)
        self._clients: dict[SlurmEndpoint, SlurmClient] = {}
        # Per endpoint, slurmctld's last_update and the jobs parsed from that listing: the next poll
        # asks only whether anything changed since (update_time) and reuses them when nothing did.
        self._listings: dict[SlurmEndpoint, tuple[int, list[Job]]] = {}
        self._readings: dict[str, Reading] = {}
        self._lock = threading.Lock()

    # --- reading ------------------------------------------------------------------------------

    def poll_once(self) -> dict[str, Reading]:
        """Read every mapped partition now; publish and return the readings."""
        groups: dict[SlurmEndpoint, list[Mapping]] = {}
        for mapping in self.source.table:
            config = mapping.node_demand
            if config is not None:
                groups.setdefault(config.endpoint, []).append(mapping)
        readings: dict[str, Reading] = {}
        for endpoint, mappings in groups.items():
            readings.update(self._read(endpoint, mappings))
        self._publish(readings, set(groups))
        return readings

    def _read(self, endpoint: SlurmEndpoint, mappings: list[Mapping]) -> dict[str, Reading]:
        now = self.clock()
        client = self._client(endpoint)
        try:
            jobs = self._jobs(endpoint, client)
            partitions = client.partitions()
        except (SlurmUnavailable, DemandError) as exc:
            cause = exc.cause if isinstance(exc, SlurmUnavailable) else str(exc)
            self.metrics.slurm_errors.inc()
            return {
                m.node_demand.partition: Reading(m.node_demand.partition, now, error=cause)
                for m in mappings
                if m.node_demand
            }
        readings = {}
        for mapping in mappings:
            partition = mapping.node_demand.partition if mapping.node_demand else ""
            try:
                demand = node_demand(
                    partition, jobs, partition_max_nodes(partitions, partition), mapping.max_replicas, now
                )
            except DemandError as exc:
                readings[partition] = Reading(partition, now, error=str(exc))
                continue
            readings[partition] = Reading(partition, now, demand=demand)
        return readings

    def _jobs(self, endpoint: SlurmEndpoint, client: SlurmClient) -> list[Job]:
        """The endpoint's jobs: the cached ones when slurmctld says none changed since the last listing."""
        cached = self._listings.pop(endpoint, None)
        listing = client.jobs(since=cached[0] if cached else None)
        if listing.jobs is None and cached is not None:
            jobs = cached[1]
        else:
            jobs = [parse_job(raw) for raw in listing.jobs or []]
        if listing.last_update is not None:
            self._listings[endpoint] = (listing.last_update, jobs)
        return jobs

    def _client(self, endpoint: SlurmEndpoint) -> SlurmClient:
        client = self._clients.get(endpoint)
        if client is None:
            client = self._clients[endpoint] = SlurmClient(self.kube, endpoint)
        return client

    def _publish(self, readings: dict[str, Reading], endpoints: set[SlurmEndpoint]) -> None:
        with self._lock:
            gone = set(self._readings) - set(readings)
            self._readings = readings
        for partition in gone:
            self.gauges.hide(partition)
        for reading in readings.values():
            if reading.demand is not None:
                self.gauges.show(reading.demand)
            else:
                self.gauges.hide(reading.partition)
                log.warning("node demand unknown", extra={"partition": reading.partition, "error": reading.error})
        for endpoint in set(self._clients) - endpoints:
            self._clients.pop(endpoint).close()
            self._listings.pop(endpoint, None)

    def reading(self, partition: str) -> Reading | None:
        """The last reading of ``partition``, turned into an error when it is stale or not made yet;
        None when not mapped."""
        with self._lock:
            reading = self._readings.get(partition)
        if reading is None:
            mapped = any(m.node_demand is not None and m.node_demand.partition == partition for m in self.source.table)
            return Reading(partition, 0.0, error="not read from slurmrestd yet") if mapped else None
        if reading.demand is None:
            return reading
        age = self.clock() - reading.at
        if age > STALE_AFTER_INTERVALS * self.interval:
            return Reading(
                partition, reading.at, error=f"the last reading is {age:.0f}s old (slurmrestd polls are not completing)"
            )
        return reading

    # --- the loop and the endpoint --------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """A ServiceRunner background task: poll every interval while some mapping has nodeDemand."""
        while not stop.is_set():
            if any(m.node_demand is not None for m in self.source.table) or self._readings:
                try:
                    await asyncio.to_thread(self.poll_once)
                except Exception:
                    log.exception("node demand poll failed")
                self._hide_stale()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def _hide_stale(self) -> None:
        with self._lock:
            partitions = list(self._readings)
        for partition in partitions:
            reading = self.reading(partition)
            if reading is not None and reading.demand is None:
                self.gauges.hide(partition)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def routes(self) -> list[Route]:
        """``GET /demand`` (every mapped partition) and ``GET /demand/<partition>``, the KEDA metrics-api shape."""

        def answer(reading: Reading | None, partition: str) -> tuple[int, dict[str, object]]:
            if reading is None:
                return 404, {
                    "partition": partition,
                    "error": f"no mapping publishes the node demand of partition {partition!r}",
                }
            if reading.demand is None:
                return 503, {"partition": partition, "error": reading.error}
            return 200, {**reading.demand.as_json(), "observedAt": reading.at}

        async def one(request: Request) -> Response:
            partition = request.path_params["partition"]
            status, body = answer(self.reading(partition), partition)
            return JSONResponse(body, status_code=status)

        async def every(_: Request) -> Response:
            with self._lock:
                partitions = sorted(self._readings)
            return JSONResponse({"partitions": [answer(self.reading(p), p)[1] for p in partitions]})

        return [Route("/demand", every), Route("/demand/{partition}", one)]
