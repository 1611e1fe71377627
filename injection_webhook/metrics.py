"""The injection webhook's own instruments, beside the shared ``slime_webhook_*`` ones."""

from __future__ import annotations

from prometheus_client import Counter

from common.metrics import WebhookMetrics


class InjectionMetrics:
    def __init__(self, metrics: WebhookMetrics) -> None:
        registry = metrics.registry
        self.webhook = metrics
        self.withheld = Counter(
            "slime_injection_join_data_withheld_total",
            "Metal3 metaData Secrets admitted without join data, by reason: dry-run, or a requester not in "
            "--allowed-requesters.",
            ["reason"],
            registry=registry,
        )
        self.unverified = Counter(
            "slime_injection_unverified_owner_total",
            "Reviews denied because their owner Metal3Data (name and uid) is not in the webhook's cache.",
            registry=registry,
        )
