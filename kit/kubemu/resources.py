"""Resource registry, served-version control and discovery documents.

An object is stored once per resource (group + plural) and served under every version of
that resource the emulated cluster serves; versions share one schema (no conversion), which
is all the SliMe services need to tell v1beta1 from v1beta2 clusters apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .tables import BUILT_IN, DEFAULT_CRD, Column, crd_columns

_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")
_LEVEL = {None: 2, "beta": 1, "alpha": 0}

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
SUBRESOURCE_VERBS = ["get", "patch", "update"]


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of Kubernetes version priority (higher sorts later): v1 > v1beta2 > v1beta1 > v1alpha1."""
    m = _VERSION_RE.match(version)
    if not m:
        return (-1, 0, 0, version)
    major, level, minor = m.groups()
    return (_LEVEL[level], int(major), int(minor or 0), "")


def sort_versions(versions: Iterable[str]) -> list[str]:
    """Versions in discovery order: preferred (highest priority) first."""
    return sorted(versions, key=version_priority, reverse=True)


@dataclass(frozen=True)
class ScaleSpec:
    """Where the `/scale` subresource reads and writes its parent (as CRD `scale` paths do).

    `selector` may point at a string (CAPI `.status.selector`) or at a LabelSelector object
    (apps `.spec.selector`), which is rendered to its string form.
    """

    spec_replicas: str = "spec.replicas"
    status_replicas: str = "status.replicas"
    selector: str = "status.selector"


@dataclass
class Resource:
    """One API resource. `scale=True` means CRD-style scale paths; pass a ScaleSpec to change them.

    `custom` marks custom resources: like the real API server, they reject strategic merge patch.
    `field_labels` are the extra fields usable in field selectors (metadata.name and
    metadata.namespace always are). `short_names` and `categories` are served in discovery (kubectl
    resolves ``ns``, ``deploy``, ``md`` and ``all`` through them); `columns` are what ``kubectl get``
    prints (:mod:`kubemu.tables`: the built-in printers by default, else the CRD's Name and Age).
    """

    group: str
    versions: list[str]
    kind: str
    plural: str
    namespaced: bool = True
    scale: bool | ScaleSpec = False
    status: bool = True
    custom: bool = False
    field_labels: tuple[str, ...] = ()
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        self.versions = list(self.versions)
        if self.scale is True:
            self.scale = ScaleSpec()
        if not self.singular:
            self.singular = self.kind.lower()
        if not self.columns:
            self.columns = BUILT_IN.get((self.group, self.plural), DEFAULT_CRD)

    @property
    def scale_spec(self) -> ScaleSpec | None:
        return self.scale if isinstance(self.scale, ScaleSpec) else None

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def group_resource(self) -> str:
        """`plural.group` as used in Kubernetes error messages (`pods`, `deployments.apps`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version


CAPI_VERSIONS = ["v1beta1", "v1beta2"]
WORKLOAD = ("all",)
AGE = ("Age", ".metadata.creationTimestamp", "date", 0)
PHASE = ("Phase", ".status.phase", "string", 0)
CLUSTER_NAME = ("Cluster", ".spec.clusterName", "string", 0)
CLUSTER_LABEL = ("Cluster", ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name", "string", 0)
# Core events are selectable by the fields kube-apiserver's event strategy exposes (kubectl describe uses
# involvedObject.*).
EVENT_FIELDS = (
    *(
        f"involvedObject.{f}"
        for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    ),
    "reason",
    "reportingComponent",
    "source",
    "type",
)


def _condition(name: str, type_: str, priority: int = 0) -> tuple[str, str, str, int]:
    return (name, f'.status.conditions[?(@.type=="{type_}")].status', "string", priority)


def _metal3_short_names(initials: str, name: str) -> tuple[str, ...]:
    """CAPM3's short names for a kind: ``m3d``, ``m3data``, ``m3datas``, ``metal3d``, ``metal3data``."""
    return (f"m3{initials}", f"m3{name}", f"m3{name}s", f"metal3{initials}", f"metal3{name}")


def _cluster_api(
    group: str, kind: str, plural: str, short_names: tuple[str, ...], *columns: Any, **extra: Any
) -> Resource:
    """A Cluster API or CAPM3 kind: custom, served at v1beta1 and v1beta2, in the ``cluster-api`` category."""
    printed = crd_columns(*columns) if columns else ()
    return Resource(
        group,
        CAPI_VERSIONS,
        kind,
        plural,
        custom=True,
        short_names=short_names,
        categories=("cluster-api",),
        columns=printed,
        **extra,
    )


def _apps(kind: str, plural: str, short_name: str) -> Resource:
    scale = ScaleSpec(selector="spec.selector")
    return Resource("apps", ["v1"], kind, plural, scale=scale, short_names=(short_name,), categories=WORKLOAD)


def _webhook_configuration(kind: str, plural: str) -> Resource:
    return Resource("admissionregistration.k8s.io", ["v1"], kind, plural, namespaced=False, status=False)


def default_resources() -> list[Resource]:
    """The resources a SliMe management or workload cluster needs.

    Short names, categories and printer columns are the upstream ones: kube-apiserver's for the
    built-in kinds; for the custom resources, their CRDs' as the real tiers install them (Cluster
    API v1.14.2 at v1beta2, CAPM3 v1.12.3, BMO v0.12.4, Slinky slurm-operator v1.0.1).
    """
    capi, infra = "cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io"
    pod_fields = ("status.phase", "spec.nodeName")
    return [
        Resource("", ["v1"], "Namespace", "namespaces", namespaced=False, short_names=("ns",)),
        Resource("", ["v1"], "Pod", "pods", field_labels=pod_fields, short_names=("po",), categories=WORKLOAD),
        Resource("", ["v1"], "Service", "services", short_names=("svc",), categories=WORKLOAD),
        Resource("", ["v1"], "Secret", "secrets", status=False, field_labels=("type",)),
        Resource("", ["v1"], "ConfigMap", "configmaps", status=False, short_names=("cm",)),
        Resource("", ["v1"], "Event", "events", status=False, field_labels=EVENT_FIELDS, short_names=("ev",)),
        _apps("Deployment", "deployments", "deploy"),
        _apps("StatefulSet", "statefulsets", "sts"),
        _apps("ReplicaSet", "replicasets", "rs"),
        Resource("events.k8s.io", ["v1"], "Event", "events", status=False, short_names=("ev",)),
        _webhook_configuration("MutatingWebhookConfiguration", "mutatingwebhookconfigurations"),
        _webhook_configuration("ValidatingWebhookConfiguration", "validatingwebhookconfigurations"),
        Resource("coordination.k8s.io", ["v1"], "Lease", "leases", status=False),
        _cluster_api(
            capi,
            "MachineDeployment",
            "machinedeployments",
            ("md",),
            CLUSTER_NAME,
            _condition("Available", "Available"),
            ("Desired", ".spec.replicas", "integer", 0),
            ("Current", ".status.replicas", "integer", 0),
            ("Ready", ".status.readyReplicas", "integer", 0),
            ("Available", ".status.availableReplicas", "integer", 0),
            ("Up-to-date", ".status.upToDateReplicas", "integer", 0),
            _condition("Paused", "Paused", 10),
            PHASE,
            AGE,
            ("Version", ".spec.template.spec.version", "string", 0),
            scale=True,
        ),
        _cluster_api(
            capi,
            "Machine",
            "machines",
            ("ma",),
            CLUSTER_NAME,
            ("Node Name", ".status.nodeRef.name", "string", 0),
            ("Provider ID", ".spec.providerID", "string", 10),
            _condition("Ready", "Ready"),
            _condition("Available", "Available"),
            _condition("Up-to-date", "UpToDate"),
            ("Internal-IP", '.status.addresses[?(@.type=="InternalIP")].address', "string", 10),
            PHASE,
            AGE,
            ("Version", ".spec.version", "string", 0),
        ),
        _cluster_api(
            capi,
            "Cluster",
            "clusters",
            ("cl",),
            ("ClusterClass", ".spec.topology.classRef.name", "string", 0),
            _condition("Available", "Available"),
            _condition("Paused", "Paused", 10),
            PHASE,
            AGE,
            ("Version", ".spec.topology.version", "string", 0),
        ),
        _cluster_api(infra, "Metal3Data", "metal3datas", _metal3_short_names("d", "data")),
        _cluster_api(
            infra,
            "Metal3DataTemplate",
            "metal3datatemplates",
            _metal3_short_names("dt", "datatemplate"),
            CLUSTER_LABEL,
            AGE,
        ),
        _cluster_api(
            infra,
            "Metal3Machine",
            "metal3machines",
            _metal3_short_names("m", "machine"),
            AGE,
            ("ProviderID", ".spec.providerID", "string", 0),
            ("Ready", ".status.ready", "string", 0),
            CLUSTER_LABEL,
            PHASE,
        ),
        _cluster_api(
            infra, "Metal3MachineTemplate", "metal3machinetemplates", _metal3_short_names("mt", "machinetemplate")
        ),
        Resource(
            "metal3.io",
            ["v1alpha1"],
            "BareMetalHost",
            "baremetalhosts",
            custom=True,
            short_names=("bmh", "bmhost"),
            columns=crd_columns(
                ("Status", ".status.operationalStatus", "string", 1),
                ("State", ".status.provisioning.state", "string", 0),
                ("Consumer", ".spec.consumerRef.name", "string", 0),
                ("BMC", ".spec.bmc.address", "string", 1),
                ("Online", ".spec.online", "string", 0),
                ("Error", ".status.errorType", "string", 0),
                AGE,
            ),
        ),
        Resource(
            "slinky.slurm.net",
            ["v1alpha1", "v1beta1"],
            "Controller",
            "controllers",
            custom=True,
            short_names=("slurmctld",),
            columns=crd_columns(("AGE", ".metadata.creationTimestamp", "date", 0)),
        ),
    ]


class Registry:
    """Known resources plus which versions of each group this cluster serves."""

    def __init__(self, resources: Iterable[Resource], served: dict[str, list[str]] | None = None):
        self.resources = list(resources)
        self._served = {g: list(v) for g, v in (served or {}).items()}

    def served_versions(self, group: str) -> list[str]:
        """Served versions of a group, preferred first."""
        versions = {v for r in self.resources if r.group == group for v in self._versions_of(r)}
        return sort_versions(versions)

    def _versions_of(self, res: Resource) -> list[str]:
        allowed = self._served.get(res.group)
        return [v for v in res.versions if allowed is None or v in allowed]

    def lookup(self, group: str, version: str, plural: str) -> Resource | None:
        """The resource served at group/version/plural, or None (unknown or not served)."""
        for res in self.resources:
            if res.group == group and res.plural == plural and version in self._versions_of(res):
                return res
        return None

    def find(self, api_version: str, kind_or_plural: str) -> Resource:
        """Resource for the direct Python API; any known version works, served or not."""
        group, _, version = api_version.rpartition("/")
        for res in self.resources:
            if res.group == group and version in res.versions and kind_or_plural in (res.kind, res.plural):
                return res
        raise KeyError(f"unknown resource {kind_or_plural!r} in {api_version!r}")

    # --- discovery documents -------------------------------------------------------------

    def groups(self) -> list[str]:
        """Non-core groups with at least one served version, in registration order."""
        seen: list[str] = []
        for res in self.resources:
            if res.group and res.group not in seen and self.served_versions(res.group):
                seen.append(res.group)
        return seen

    def api_group(self, group: str) -> dict[str, Any]:
        versions = self.served_versions(group)
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = [
            {k: v for k, v in self.api_group(g).items() if k not in ("kind", "apiVersion")} for g in self.groups()
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def api_resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        """APIResourceList for group/version, None when that version is not served."""
        served = [r for r in self.resources if r.group == group and version in self._versions_of(r)]
        if not served:
            return None
        resources: list[dict[str, Any]] = []
        for res in served:
            base: dict[str, Any] = {
                "name": res.plural,
                "singularName": res.singular,
                "namespaced": res.namespaced,
                "kind": res.kind,
                "verbs": VERBS,
            }
            if res.short_names:
                base["shortNames"] = list(res.short_names)
            if res.categories:
                base["categories"] = list(res.categories)
            resources.append(base)
            if res.status:
                resources.append(
                    {
                        "name": f"{res.plural}/status",
                        "singularName": "",
                        "namespaced": res.namespaced,
                        "kind": res.kind,
                        "verbs": SUBRESOURCE_VERBS,
                    }
                )
            if res.scale_spec:
                resources.append(
                    {
                        "name": f"{res.plural}/scale",
                        "singularName": "",
                        "namespaced": res.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": SUBRESOURCE_VERBS,
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }
