"""Prometheus instruments shared by both webhooks.

Each service owns a registry instead of using the global one, so that two services (or many test
instances) can live in one process without clashing. Label values are fixed sets or object
names: never request content, never secret material.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from common.version import build_info

# No ``*_created`` series: they carry the process start time on every counter and histogram,
# which nobody alerts on and which doubles the page.
disable_created_metrics()

# Admission is expected to take milliseconds; the tail buckets show an API round trip going bad.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WebhookMetrics:
    """The transport's instruments: latency, requests by outcome and in-flight requests."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.latency = Histogram(
            "slime_webhook_latency_seconds",
            "Time to answer one admission request, from body read to response bytes.",
            ["webhook"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "slime_webhook_requests_total",
            "Admission requests by outcome (allowed, patched, denied, errored).",
            ["webhook", "outcome"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "slime_webhook_requests_in_flight",
            "Admission requests being handled now.",
            ["webhook"],
            registry=self.registry,
        )
        self.malformed = Counter(
            "slime_webhook_malformed_requests_total",
            "Requests that were not a usable AdmissionReview (answered with an errored review: 400, 413, 415; 499: the "
            "client went away before its request was whole), by code.",
            ["webhook", "code"],
            registry=self.registry,
        )
        self.deadline_exceeded = Counter(
            "slime_webhook_deadline_exceeded_total",
            "Admissions answered with an error because their handler passed the admission deadline.",
            ["webhook"],
            registry=self.registry,
        )
        self.busy = Counter(
            "slime_webhook_busy_total",
            "Reviews answered 503 before they were read, by reason: another large review (over 64 KiB) was being "
            "handled (large-review), or the bodies being read already held --max-body-bytes-in-flight (body-budget).",
            ["webhook", "reason"],
            registry=self.registry,
        )
        self.connections = Counter(
            "slime_webhook_connections_total",
            "Connections accepted, by port (admission: TLS; health: the plain-HTTP health and metrics port). "
            "kube-apiserver keeps its connections, so the admission count grows slowly; growing with the requests "
            "means a TLS handshake per admission.",
            ["port"],
            registry=self.registry,
        )
        self.dropped_connections = Counter(
            "slime_webhook_dropped_connections_total",
            "Connections closed by the server, by port and reason: a request not read in full in time (slow), headers "
            "over 64 KiB, an idle or stalled connection closed to make room for a new one (evicted), or a new one "
            "closed because the port (connection-cap) or its peer address (peer-cap) had no room.",
            ["port", "reason"],
            registry=self.registry,
        )
        self.cert_reloads = Counter(
            "slime_certificate_reloads_total",
            "Serving certificate loads by result (success, failure).",
            ["result"],
            registry=self.registry,
        )
        self.build_info = Gauge(
            "slime_build_info",
            "The running SliMe: its version and the git commit its image was built from (always 1).",
            ["version", "revision"],
            registry=self.registry,
        )
        self.build_info.labels(**build_info()).set(1)
        self.cert_not_after = Gauge(
            "slime_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as a Unix time.",
            registry=self.registry,
        )
