"""A bounded, steady stream of admissions through kube-apiserver to both webhooks, counting every failure.

Used while something happens to the webhooks (a certificate renewal, a ``helm upgrade``), so the
count of failed admissions is what a cluster's clients would have seen:

- **injection**: a stored create of a CAPM3 ``metaData`` Secret as CAPM3's manager
  (``CAPM3_MANAGER_USERNAME``, by impersonation; a dry run, or anyone else, is admitted without the
  join data by design), which must come back with the join data; then the admin deletes it, so
  the namespace does not fill up;
- **scaling**: a server-side dry-run PATCH of the mirror's ``/scale``, which must be answered 200.

The two alternate, one admission at a time, until :attr:`Load.stop` is set or a bound (admissions,
seconds) is reached. :func:`webhook_counters` is kube-apiserver's own account of its calls to the
webhooks, to compare with what the client saw.
"""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from common.names import CAPM3_MANAGER_USERNAME
from testbed.components.controlplane import ControlPlane
from testbed.framework.objects import metadata_secret

INJECTION, SCALING = "injection.webhook.slime", "scaling.webhook.slime"
WEBHOOKS = {"injection": INJECTION, "scaling": SCALING}


@dataclass
class Load:
    """A bounded stream of admissions through kube-apiserver, alternating the two webhooks."""

    cp: ControlPlane
    metal3_data: dict[str, Any]  # the Metal3Data the injected Secrets belong to (an opted-in template's)
    namespace: str  # the release's namespace, where the mirror is
    mirror: str
    max_admissions: int = 12000
    max_seconds: float = 240.0
    sent: dict[str, int] = field(default_factory=lambda: {"injection": 0, "scaling": 0})
    failures: list[str] = field(default_factory=list)
    failed: dict[str, int] = field(default_factory=lambda: {"injection": 0, "scaling": 0})
    failure_times: list[float] = field(default_factory=list)  # monotonic
    seconds: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def _fail(self, which: str, message: str) -> None:
        self.failures.append(f"{which}: {message}")
        self.failed[which] += 1
        self.failure_times.append(time.monotonic())

    def injection(self, client: Any, index: int) -> None:
        secret = metadata_secret(self.metal3_data, machine=f"m3m-load-{index}")
        secrets = f"/api/v1/namespaces/{secret['metadata']['namespace']}/secrets"
        answer = client.post(secrets, json=secret, headers={"Impersonate-User": CAPM3_MANAGER_USERNAME})
        if answer.status_code != 201:
            self._fail("injection", f"{answer.status_code} {answer.json().get('message', '')[:200]}")
            return
        client.delete(f"{secrets}/{secret['metadata']['name']}")
        metadata = yaml.safe_load(base64.b64decode(answer.json()["data"]["metaData"]))
        if "slurm_conf_server" not in metadata:  # never print the metadata: it holds slurm.key
            self._fail("injection", "admitted without the join data")

    def scaling(self, client: Any, replicas: int) -> None:
        answer = client.patch(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.mirror}/scale?dryRun=All",
            content=f'{{"spec":{{"replicas":{replicas}}}}}',
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if answer.status_code != 200:
            self._fail("scaling", f"{answer.status_code} {answer.json().get('message', '')[:200]}")

    def run(self) -> None:
        started = time.monotonic()
        with self.cp.client(timeout=30) as api:
            client = api.http
            for index in range(self.max_admissions):
                if self.stop.is_set() or time.monotonic() - started > self.max_seconds:
                    break
                which = "injection" if index % 2 == 0 else "scaling"
                try:
                    if which == "injection":
                        self.injection(client, index)
                    else:
                        self.scaling(client, 3 + index % 4 // 2)
                except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                    self._fail(which, f"{type(exc).__name__}: {exc}")
                self.sent[which] += 1
                time.sleep(0.01)
        self.seconds = time.monotonic() - started

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="admission-load", daemon=True)
        thread.start()
        return thread


def webhook_counters(cp: ControlPlane) -> dict[str, float]:
    """kube-apiserver's own account of its calls to the two webhooks: by code, fail-open and rejections."""
    counters: dict[str, float] = {}
    for line in cp.api.metrics().splitlines():
        for metric in (
            "apiserver_admission_webhook_request_total{",
            "apiserver_admission_webhook_fail_open_count{",
            "apiserver_admission_webhook_rejection_count{",
        ):
            if line.startswith(metric) and any(f'name="{w}"' in line for w in WEBHOOKS.values()):
                name = next(w for w in WEBHOOKS.values() if f'name="{w}"' in line)
                label = line.split("{", 1)[1].rsplit("}", 1)[0]
                key = metric.rstrip("{") + ":" + name
                if metric.startswith("apiserver_admission_webhook_request_total"):
                    key += ":" + label.split('code="', 1)[1].split('"', 1)[0]
                elif "rejection_count" in metric:
                    key += ":" + label.split('error_type="', 1)[1].split('"', 1)[0]
                counters[key] = counters.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counters


def failed_calls(delta: dict[str, float]) -> dict[str, float]:
    """The counters of :func:`webhook_counters` (a difference) that count a failed or rejected call."""
    return {
        k: v
        for k, v in delta.items()
        if v and (("request_total" in k and not k.endswith(":200")) or "fail_open" in k or "rejection_count" in k)
    }
