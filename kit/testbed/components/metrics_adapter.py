"""A test adapter for ``external.metrics.k8s.io``, in the place prometheus-adapter (with Prometheus) takes at a site.

It **stands in** for prometheus-adapter, which this machine cannot get (the Go module proxy
refuses ``sigs.k8s.io/prometheus-adapter``, Debian does not package it: docs/install.md, "Without
KEDA"), and for the Prometheus behind it. It answers what an HPA's ``External`` metric needs and
nothing else:

- ``GET /apis/external.metrics.k8s.io/v1beta1``: the discovery answer kube-apiserver's aggregator
  probes to report the APIService ``Available``;
- ``GET /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>?labelSelector=...``: an
  ``ExternalMetricValueList`` with one item, the value ``value(metric, selector)`` returns (the
  tier reads the scaling webhook's ``slime_demand_nodes{partition=...}`` gauge, as the
  ``externalRules`` query of docs/install.md does), or no item when it returns None (the gauge
  withdrawn: demand unknown), which the HPA takes as "no metric" and keeps its replicas.

Registered as prometheus-adapter's chart registers itself: the APIService
``v1beta1.external.metrics.k8s.io`` pointing at a Service, here ``ExternalName: localhost`` on the
adapter's port (how this kit routes kube-apiserver to loopback servers), with the ``caBundle`` of
the adapter's serving certificate. It does not check the aggregator's front-proxy client
certificate (prometheus-adapter does): every caller reaches it through kube-apiserver, which has
authorized the HPA controller already.
"""

from __future__ import annotations

import base64
import datetime as dt
import ssl
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.components.controlplane import ControlPlane
from testbed.framework.httpserve import Answer, LoopbackServer, Request
from testbed.framework.pki import Ca, write_pair
from testbed.framework.wait import wait_for

GROUP_VERSION = "external.metrics.k8s.io/v1beta1"
APISERVICE = "v1beta1.external.metrics.k8s.io"
NAMESPACE, SERVICE = "custom-metrics", "external-metrics-adapter"

Value = Callable[[str, dict[str, str]], float | None]  # (metric, selector labels) -> the value, None: unknown


def _selector(query: str) -> dict[str, str]:
    """``labelSelector=a=b,c=d`` as a dict (equality selectors only, what an HPA's ``matchLabels`` sends)."""
    text = urllib.parse.parse_qs(query).get("labelSelector", [""])[0]
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


class ExternalMetricsAdapter:
    """The adapter on a loopback port with TLS, registered with ``cp``'s aggregator by :meth:`register`."""

    def __init__(self, cp: ControlPlane, value: Value) -> None:
        self.cp, self.value = cp, value
        self.requests: list[str] = []  # every metric path asked, as the HPA controller's reads arrive
        self.ca = Ca.create("slime-test-external-metrics-ca")
        workdir = Path(tempfile.mkdtemp(prefix="metrics-adapter-"))
        dns = (f"{SERVICE}.{NAMESPACE}.svc", "localhost")
        cert, key = write_pair(workdir, "serving", self.ca.issue(SERVICE, dns=dns, ips=("127.0.0.1",), server=True))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = LoopbackServer(self._respond, name="external-metrics-adapter", tls=context)

    def _respond(self, request: Request) -> Answer:
        path, _, query = request.path.partition("?")
        parts = path.strip("/").split("/")
        if path.rstrip("/") == f"/apis/{GROUP_VERSION}":
            return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION, "resources": []}
        if len(parts) == 6 and parts[:3] == ["apis", *GROUP_VERSION.split("/")] and parts[3] == "namespaces":
            metric, selector = parts[5], _selector(query)
            self.requests.append(request.path)
            found = self.value(metric, selector)
            items = []
            if found is not None:
                now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                value = str(round(found)) if float(found).is_integer() else f"{round(found * 1000)}m"
                items.append({"metricName": metric, "metricLabels": selector, "timestamp": now, "value": value})
            return 200, {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}

    def register(self) -> None:
        """The Service and APIService, then wait until kube-apiserver reports the APIService Available."""
        api = self.cp.api
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        port = self.server.port
        service_spec = {"type": "ExternalName", "externalName": "localhost", "ports": [{"port": port, "name": "https"}]}
        metadata = {"name": SERVICE, "namespace": NAMESPACE}
        api.create({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": service_spec})
        api.create(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "service": {"name": SERVICE, "namespace": NAMESPACE, "port": port},
                    "caBundle": base64.b64encode(self.ca.pem).decode(),
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            }
        )
        wait_for(self.available, "controller-start", f"APIService {APISERVICE} Available")

    def available(self) -> bool:
        obj: dict[str, Any] = self.cp.api.get("apiregistration.k8s.io/v1", "apiservices", "", APISERVICE) or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)

    def stop(self) -> None:
        self.server.stop()
