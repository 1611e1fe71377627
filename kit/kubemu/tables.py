"""Server-side printing: the ``meta.k8s.io/v1`` Table kube-apiserver answers ``kubectl get`` with.

``kubectl get`` asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the
columns the server chose (those with ``priority`` above 0 only with ``-o wide``). Built-in kinds
get the columns of kube-apiserver's own printers (``pkg/printers/internalversion``), custom
resources those of their CRD's ``additionalPrinterColumns`` (copied from the upstream CRDs the
real tiers install: Cluster API v1.14.2, CAPM3 v1.12.3, BMO v0.12.4, Slinky v1.0.1). Without a
Table, kubectl would print only NAME and AGE.

Each row carries the object's metadata (``includeObject=Metadata``, kubectl's default) or the
whole object (``Object``), as kube-apiserver does; kubectl reads the namespace column of
``-A`` and ``--show-labels`` from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]

DESCRIPTIONS = {
    "Name": "Name must be unique within a namespace.",
    "Age": "CreationTimestamp is a timestamp representing the server time when this object was created.",
}


@dataclass(frozen=True)
class Column:
    """One printed column: a cell function (or a CRD-style JSONPath), its type and priority (1: ``-o wide``)."""

    name: str
    cell: Callable[[Obj], Any] | str
    type: str = "string"
    priority: int = 0
    format: str = ""

    def value(self, obj: Obj) -> Any:
        if callable(self.cell):
            return self.cell(obj)
        return json_path(obj, self.cell, self.type)


def age(obj: Obj) -> str:
    """kube-apiserver's ``translateTimestampSince``: a short human duration (``5m``, ``3h``)."""
    return human_age((obj.get("metadata") or {}).get("creationTimestamp"))


def human_age(timestamp: Any) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<invalid>"
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


NAME = Column("Name", lambda o: (o.get("metadata") or {}).get("name", ""), format="name")
AGE = Column("Age", age)

_SEGMENT = re.compile(r"""\.((?:\\\.|[^.\[])+)|\[\?\(@\.(\w+)==["']([^"']*)["']\)\]""")


def json_path(obj: Obj, path: str, kind: str = "string") -> Any:
    """The subset of JSONPath CRD printer columns use: ``.a.b``, escaped dots (``cluster\\.x-k8s\\.io/x``)
    and ``[?(@.type=="Ready")]`` filters. A missing value is ``None`` (kubectl prints ``<none>``)."""
    values: list[Any] = [obj]
    position = 0
    for match in _SEGMENT.finditer(path):
        if match.start() != position:
            return None
        position = match.end()
        key, field, wanted = match.groups()
        found: list[Any] = []
        for value in values:
            if key is not None:
                if isinstance(value, dict) and key.replace("\\.", ".") in value:
                    found.append(value[key.replace("\\.", ".")])
            elif isinstance(value, list):
                found += [item for item in value if isinstance(item, dict) and str(item.get(field)) == wanted]
        values = found
    if position != len(path) or not values:
        return None
    value = values[0]
    if kind == "date":
        return human_age(value)
    if isinstance(value, (dict, list)):
        return None
    return value


# --- kube-apiserver's printers for the built-in kinds this emulator serves ---------------------


def _spec(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def _status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def _containers(obj: Obj) -> list[Obj]:
    template = (_spec(obj).get("template") or {}).get("spec") or {}
    return [c for c in template.get("containers") or [] if isinstance(c, dict)]


def _selector(obj: Obj) -> str:
    selector = _spec(obj).get("selector") or {}
    labels = selector.get("matchLabels") if isinstance(selector, dict) and "matchLabels" in selector else selector
    if not isinstance(labels, dict) or not labels:
        return "<none>"
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _pod_ready(obj: Obj) -> str:
    containers = _spec(obj).get("containers") or []
    ready = sum(1 for c in _status(obj).get("containerStatuses") or [] if isinstance(c, dict) and c.get("ready"))
    return f"{ready}/{len(containers)}"


def _pod_restarts(obj: Obj) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in _status(obj).get("containerStatuses") or [] if isinstance(c, dict)
    )


def _ports(obj: Obj) -> str:
    ports = []
    for port in _spec(obj).get("ports") or []:
        text = str(port.get("port", ""))
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        ports.append(f"{text}/{port.get('protocol', 'TCP')}")
    return ",".join(ports) or "<none>"


def _external_ip(obj: Obj) -> str:
    spec = _spec(obj)
    if spec.get("type") == "ExternalName":
        return str(spec.get("externalName") or "<none>")
    ingress = (_status(obj).get("loadBalancer") or {}).get("ingress") or []
    addresses = [i.get("ip") or i.get("hostname") for i in ingress if isinstance(i, dict)]
    addresses += spec.get("externalIPs") or []
    if addresses:
        return ",".join(str(a) for a in addresses if a)
    return "<pending>" if spec.get("type") == "LoadBalancer" else "<none>"


def _event_object(obj: Obj) -> str:
    involved = obj.get("involvedObject") or obj.get("regarding") or {}
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _event_last_seen(obj: Obj) -> str:
    stamp = obj.get("lastTimestamp") or obj.get("eventTime") or (obj.get("metadata") or {}).get("creationTimestamp")
    return human_age(stamp.split(".")[0].rstrip("Z") + "Z" if isinstance(stamp, str) else stamp)


def _replicas(obj: Obj) -> int:
    replicas = _spec(obj).get("replicas")
    return replicas if isinstance(replicas, int) else 1


WORKLOAD_WIDE = (
    Column("Containers", lambda o: ",".join(str(c.get("name", "")) for c in _containers(o)), priority=1),
    Column("Images", lambda o: ",".join(str(c.get("image", "")) for c in _containers(o)), priority=1),
)

BUILT_IN: dict[tuple[str, str], tuple[Column, ...]] = {
    ("", "namespaces"): (NAME, Column("Status", lambda o: _status(o).get("phase") or "Active"), AGE),
    ("", "pods"): (
        NAME,
        Column("Ready", _pod_ready),
        Column("Status", lambda o: _status(o).get("reason") or _status(o).get("phase") or "Pending"),
        Column("Restarts", _pod_restarts, type="integer"),
        AGE,
        Column("IP", lambda o: _status(o).get("podIP") or "<none>", priority=1),
        Column("Node", lambda o: _spec(o).get("nodeName") or "<none>", priority=1),
        Column("Nominated Node", lambda o: _status(o).get("nominatedNodeName") or "<none>", priority=1),
        Column("Readiness Gates", lambda o: "<none>", priority=1),
    ),
    ("", "services"): (
        NAME,
        Column("Type", lambda o: _spec(o).get("type") or "ClusterIP"),
        Column("Cluster-IP", lambda o: _spec(o).get("clusterIP") or "<none>"),
        Column("External-IP", _external_ip),
        Column("Port(s)", _ports),
        AGE,
        Column("Selector", _selector, priority=1),
    ),
    ("", "secrets"): (
        NAME,
        Column("Type", lambda o: o.get("type") or "Opaque"),
        Column("Data", lambda o: len(o.get("data") or {}), type="integer"),
        AGE,
    ),
    ("", "configmaps"): (NAME, Column("Data", lambda o: len(o.get("data") or {}), type="integer"), AGE),
    ("", "events"): (
        Column("Last Seen", _event_last_seen),
        Column("Type", lambda o: o.get("type") or ""),
        Column("Reason", lambda o: o.get("reason") or ""),
        Column("Object", _event_object),
        Column("Message", lambda o: o.get("message") or o.get("note") or ""),
        Column(
            "Source",
            lambda o: (o.get("source") or {}).get("component") or o.get("reportingController") or "",
            priority=1,
        ),
        Column("Count", lambda o: int(o.get("count") or 1), type="integer", priority=1),
        Column("Name", lambda o: (o.get("metadata") or {}).get("name", ""), format="name", priority=1),
    ),
    ("apps", "deployments"): (
        NAME,
        Column("Ready", lambda o: f"{int(_status(o).get('readyReplicas') or 0)}/{_replicas(o)}"),
        Column("Up-to-date", lambda o: int(_status(o).get("updatedReplicas") or 0), type="integer"),
        Column("Available", lambda o: int(_status(o).get("availableReplicas") or 0), type="integer"),
        AGE,
        *WORKLOAD_WIDE,
        Column("Selector", _selector, priority=1),
    ),
    ("apps", "statefulsets"): (
        NAME,
        Column("Ready", lambda o: f"{int(_status(o).get('readyReplicas') or 0)}/{_replicas(o)}"),
        AGE,
        *WORKLOAD_WIDE,
    ),
    ("apps", "replicasets"): (
        NAME,
        Column("Desired", _replicas, type="integer"),
        Column("Current", lambda o: int(_status(o).get("replicas") or 0), type="integer"),
        Column("Ready", lambda o: int(_status(o).get("readyReplicas") or 0), type="integer"),
        AGE,
        *WORKLOAD_WIDE,
        Column("Selector", _selector, priority=1),
    ),
    ("coordination.k8s.io", "leases"): (NAME, Column("Holder", lambda o: _spec(o).get("holderIdentity") or ""), AGE),
}
BUILT_IN[("events.k8s.io", "events")] = BUILT_IN[("", "events")]
for _kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
    BUILT_IN[("admissionregistration.k8s.io", _kind)] = (
        NAME,
        Column("Webhooks", lambda o: len(o.get("webhooks") or []), type="integer"),
        AGE,
    )


def crd_columns(*columns: tuple[str, str, str, int]) -> tuple[Column, ...]:
    """A CRD's ``additionalPrinterColumns`` (name, jsonPath, type, priority), after the Name column kube-apiserver
    adds."""
    return (NAME, *(Column(name, path, type=kind, priority=priority) for name, path, kind, priority in columns))


DEFAULT_CRD = crd_columns(("Age", ".metadata.creationTimestamp", "date", 0))


def table(
    columns: tuple[Column, ...], objects: list[Obj], resource_version: str, include: str = "Metadata"
) -> dict[str, Any]:
    """The Table of ``objects``; ``include`` is the request's ``includeObject`` (None, Metadata or Object)."""
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [_cell(c, obj) for c in columns]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata") or {},
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {
                "name": c.name,
                "type": c.type if c.type != "date" else "string",
                "format": c.format,
                "description": DESCRIPTIONS.get(c.name, c.name),
                "priority": c.priority,
            }
            for c in columns
        ],
        "rows": rows,
    }


def _cell(column: Column, obj: Obj) -> Any:
    value = column.value(obj)
    return value if value is not None else None


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for a ``meta.k8s.io`` Table (kubectl get does; clients of objects do not)."""
    return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.split(","))
