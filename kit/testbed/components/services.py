"""Start the webhook services in this process against an API server, as tests, demo and bench do.

Each service is built exactly as its console script builds it (``build``/``build_service`` from
settings), then served over TLS on 127.0.0.1 in its own thread (:func:`testbed.components.serve.serve_in_thread`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import jsonpatch

from common.names import CAPI_GROUP, DEPLOYMENT_NAME_LABEL, METADATA_KEY, METAL3_GROUP
from injection_webhook.app import build as build_injection
from injection_webhook.settings import InjectionSettings
from kubemu import AdmissionAttributes, AdmissionDenied, Emulator, RecordedRequest
from scaling_webhook.app import ScalingService, build_service
from scaling_webhook.mappings import Mapping
from scaling_webhook.reconciler import Change
from scaling_webhook.settings import ScalingSettings
from testbed.components.serve import RunningService, serve_in_thread
from testbed.framework.objects import SLURM_BINDINGS
from testbed.framework.wait import wait_for

StartInjection = Callable[..., RunningService]  # a fixture that starts an injection webhook against an emulator


class ServingFiles(Protocol):
    """Where a service finds its serving pair, and the CA bundle its callers trust."""

    @property
    def cert_file(self) -> Path: ...

    @property
    def key_file(self) -> Path: ...

    @property
    def ca_file(self) -> Path: ...


def start_injection(
    kubeconfig: str, tls: ServingFiles, ready: bool = True, ready_timeout: float = 15.0, port: int = 0, **settings: Any
) -> RunningService:
    """The injection webhook on 127.0.0.1 (admission on ``port``, 0: any); with ``ready``, returns once ``/readyz``
    answers 200."""
    values: dict[str, Any] = {
        "cert_file": str(tls.cert_file),
        "key_file": str(tls.key_file),
        "KUBECONFIG": kubeconfig,
        "slurm_bindings": SLURM_BINDINGS,
    }
    values.update(settings)
    service = serve_in_thread(build_injection(InjectionSettings(**values)), tls.ca_file, "injection-webhook", port)
    if ready:
        wait_for(service.ready, ready_timeout, "injection-webhook /readyz")
    return service


@dataclass
class Scaling:
    """A running scaling webhook, its wired parts, and (on kubemu) the emulator it talks to."""

    service: ScalingService
    running: RunningService
    emulator: Emulator | None = None

    def review(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.running.review("/validate", request)

    def metrics_text(self) -> str:
        return httpx.get(f"{self.running.metrics_url}/metrics", timeout=5).text

    def metric(self, name: str, labels: str = "") -> float | None:
        """The value of one sample of ``/metrics`` (None when absent)."""
        prefix = f"{name}{{{labels}}} " if labels else f"{name} "
        for line in self.metrics_text().splitlines():
            if line.startswith(prefix):
                return float(line.split()[-1])
        return None

    def reconcile(self, timeout: float = 5.0) -> list[Change]:
        """One pass now, once the service's Machine caches hold what the emulator stores (a pass reads the pools
        from them, as the leader does; a test that just changed a Machine must let the watch deliver it first)."""
        if self.emulator is not None:
            wait_machine_caches(self.service, self.emulator, timeout)
        return self.service.reconcile_once()

    def sees_mirror(self, namespace: str, name: str, replicas: int, timeout: float = 5.0) -> None:
        """Wait until the webhook's watch of mirror ``namespace/name`` shows ``replicas`` (it acts on what it sees)."""
        mapping = self.service.source.table.get(namespace, name)
        assert mapping is not None, f"{namespace}/{name} is not mapped"

        def seen() -> bool:
            mirror = self.service.objects.mirror(mapping)
            return bool(mirror) and (mirror.get("spec") or {}).get("replicas") == replicas  # type: ignore[union-attr]

        wait_for(seen, timeout, f"the webhook's watch to see mirror {namespace}/{name} at {replicas}")

    def calls(self, **filters: Any) -> list[RecordedRequest]:
        """The API calls the emulator recorded whose attributes equal ``filters``."""
        assert self.emulator is not None, "calls are recorded by kubemu only"
        return [r for r in self.emulator.requests if all(getattr(r, k) == v for k, v in filters.items())]

    def hot_path_calls(self) -> list[RecordedRequest]:
        """The webhook's own requests except Event creation (sent off the hot path),
        the ConfigMap watch and the Lease."""
        assert self.emulator is not None, "calls are recorded by kubemu only"
        return [
            r
            for r in self.emulator.requests
            if r.user_agent.startswith("slime-scaling-webhook") and r.resource not in ("events", "configmaps", "leases")
        ]


def wait_machine_caches(service: ScalingService, emulator: Emulator, timeout: float = 5.0) -> None:
    """Wait until the service's Machine caches hold what the emulator stores, for every pool that has them."""
    for mapping in service.source.table:
        if mapping.safe_scale_in is None and mapping.slurm_health is None:
            continue
        label = f"{DEPLOYMENT_NAME_LABEL}={mapping.machine_deployment[1]}"

        def caught_up(mapping: Mapping = mapping, label: str = label) -> bool:
            cached = service.objects.machines(mapping)
            stored = emulator.list(
                f"{CAPI_GROUP}/v1beta1", "Machine", mapping.machine_deployment[0], label_selector=label
            )
            return cached is not None and _versions(cached) == _versions(stored)

        wait_for(caught_up, timeout, f"the Machine cache of {mapping.machine_deployment_ref}")


def start_scaling(
    kubeconfig: str,
    tls: ServingFiles,
    *,
    emulator: Emulator | None = None,
    wait_reconciled: bool = True,
    ready_timeout: float = 15.0,
    port: int = 0,
    **settings: Any,
) -> Scaling:
    """The scaling webhook on 127.0.0.1 (admission on ``port``, 0: any), ready, and (``wait_reconciled``) past its
    first reconcile pass."""
    values: dict[str, Any] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file), "KUBECONFIG": kubeconfig}
    values.update(settings)
    service = build_service(ScalingSettings(**values))
    running = serve_in_thread(service.runner, tls.ca_file, "scaling-webhook", port)
    wait_for(running.ready, ready_timeout, "scaling-webhook /readyz")
    if wait_reconciled:
        wait_for(lambda: service.reconciler.passes >= 1, ready_timeout, "the first reconcile pass")
        service.events.flush()  # the first pass's Events (adoptions) are sent before the test looks
    return Scaling(service, running, emulator)


class ScaleWebhookRoute:
    """A kubemu admission hook that sends ``deployments/scale`` updates, and updates of Deployments themselves, to
    scaling webhooks, as kube-apiserver would with the chart's webhook configuration.

    Pass it as ``Emulator(admission=...)``; ``add`` the running webhooks. Like a Service in front
    of several replicas, it takes them in turn. A denial becomes the API server's refusal of the
    write (the mirror is not stored). With no webhook added, every write is admitted.
    """

    def __init__(self) -> None:
        self.webhooks: list[Scaling] = []
        self._next = 0

    def add(self, scaling: Scaling) -> None:
        self.webhooks.append(scaling)

    def remove(self, scaling: Scaling) -> None:
        self.webhooks.remove(scaling)

    def __call__(self, attrs: AdmissionAttributes) -> None:
        scale = attrs.subresource == "scale"
        update = not attrs.subresource and attrs.operation == "UPDATE"
        if attrs.resource != "deployments" or not (scale or update) or not self.webhooks:
            return None
        webhook = self.webhooks[self._next % len(self.webhooks)]
        self._next += 1
        request = {
            "kind": attrs.kind,
            "resource": {"group": attrs.group, "version": attrs.version, "resource": attrs.resource},
            "subResource": attrs.subresource,
            "requestSubResource": attrs.subresource,
            "namespace": attrs.namespace,
            "name": attrs.name,
            "operation": attrs.operation,
            "object": attrs.object,
            "oldObject": attrs.old_object,
            "dryRun": attrs.dry_run,
            "userInfo": attrs.user_info,
        }
        response = webhook.review(request)
        if not response["allowed"]:
            raise AdmissionDenied(response["status"]["message"], response["status"]["code"])
        return None


class InjectionRoute:
    """A kubemu admission hook that sends metaData Secrets to the injection webhook, as kube-apiserver would.

    It does what the chart's MutatingWebhookConfiguration makes kube-apiserver do (its
    matchConditions: a Secret with a ``metaData`` key owned by a Metal3Data): call ``POST /mutate``
    with an AdmissionReview v1 naming the requester kubemu saw (its admin, or an impersonated user),
    apply the JSONPatch, refuse the write on a denial. Returns None for every other write.
    """

    def __init__(self) -> None:
        self.injection: RunningService | None = None
        self.admitted: list[str] = []
        self.warnings: list[str] = []

    def __call__(self, attrs: AdmissionAttributes) -> dict[str, Any] | None:
        if attrs.resource == "secrets" and attrs.operation in ("CREATE", "UPDATE") and _is_metadata(attrs.object):
            return self._inject(attrs)
        return None

    def _inject(self, attrs: AdmissionAttributes) -> dict[str, Any]:
        assert self.injection is not None, "no injection webhook is running"
        secret = attrs.object or {}
        request = {
            "kind": attrs.kind,
            "resource": {"group": attrs.group, "version": attrs.version, "resource": attrs.resource},
            "requestKind": attrs.kind,
            "requestResource": {"group": attrs.group, "version": attrs.version, "resource": attrs.resource},
            "name": attrs.name or secret["metadata"]["name"],
            "namespace": attrs.namespace,
            "operation": attrs.operation,
            "userInfo": attrs.user_info,
            "object": secret,
            "oldObject": attrs.old_object,
            "dryRun": attrs.dry_run,
            "options": {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "CreateOptions" if attrs.operation == "CREATE" else "UpdateOptions",
            },
        }
        response = self.injection.review("/mutate", request)
        self.warnings += response.get("warnings") or []
        if not response["allowed"]:
            raise AdmissionDenied(
                f'admission webhook "injection.slime.dev" denied the request: {response["status"]["message"]}',
                response["status"]["code"],
            )
        self.admitted.append(f"{attrs.namespace}/{request['name']}")
        if "patch" not in response:
            return secret
        patch = json.loads(base64.b64decode(response["patch"]))
        patched: dict[str, Any] = jsonpatch.apply_patch(secret, patch)
        return patched


def _is_metadata(secret: dict[str, Any] | None) -> bool:
    if not secret or METADATA_KEY not in (secret.get("data") or {}):
        return False
    owners = (secret.get("metadata") or {}).get("ownerReferences") or []
    return any(
        o.get("kind") == "Metal3Data" and str(o.get("apiVersion", "")).startswith(METAL3_GROUP + "/") for o in owners
    )


def _versions(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"].get("resourceVersion", "") for o in objects}
