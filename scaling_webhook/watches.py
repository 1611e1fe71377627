"""Watched copies of what the mappings name: mirror Deployments, MachineDeployments, their Clusters.

One list+watch cache per named object (``fieldSelector=metadata.name=<name>``, which RBAC can
narrow with ``resourceNames``). Mappings with ``safeScaleIn`` or ``capacityAware`` also
watch the pool's Machines (by the ``cluster.x-k8s.io/deployment-name`` label), so a new Machine
gets its pre-terminate hook at once and a scale-up finds the Machines to reclaim without a list;
``capacityAware`` ones also the pool's Metal3MachineTemplate (by name) and the BareMetalHosts of
its namespace, so a host becoming available raises a capped pool at once
(:mod:`scaling_webhook.capacity`). Admissions read them to check a review against the cluster; the
leader's reconciler reads them to act, and every change wakes it (``on_change``), so a mirror
stored by the API server moves its MachineDeployment within one watch event, and a hand edit of
a MachineDeployment is healed as fast.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from common.apis import BAREMETALHOSTS, DEPLOYMENTS, METAL3_VERSIONS
from common.cache import Informer
from common.kube import KubeClient, KubeError, ResourcePath
from common.names import CAPI_GROUP, DELETE_MACHINE_ANNOTATION, DEPLOYMENT_NAME_LABEL, METAL3_GROUP
from scaling_webhook.capacity import Capacity, CapacityUnknown, count, template_name
from scaling_webhook.errors import ScaleError
from scaling_webhook.machinedeployments import MachineDeploymentScaler
from scaling_webhook.mappings import Mapping, MappingTable, Ref
from scaling_webhook.slurm.machines import machine_annotations

log = logging.getLogger("slime.scaling.watches")

Obj = dict[str, Any]


def _slim_host(obj: Obj) -> Obj:
    """What capacity reads of a BareMetalHost (a namespace may hold hundreds)."""
    metadata, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return {
        "metadata": {
            k: metadata[k]
            for k in ("name", "namespace", "labels", "annotations", "deletionTimestamp", "resourceVersion")
            if k in metadata
        },
        "spec": {"consumerRef": spec["consumerRef"]} if spec.get("consumerRef") else {},
        "status": {
            "provisioning": {"state": (status.get("provisioning") or {}).get("state")},
            "errorMessage": status.get("errorMessage") or "",
        },
    }


class MappedObjects:
    def __init__(self, client: KubeClient, scaler: MachineDeploymentScaler, on_change: Callable[[], None]) -> None:
        self.client = client
        self.scaler = scaler
        self.on_change = on_change
        self._informers: dict[tuple[str, Ref], Informer] = {}
        self._lock = threading.Lock()
        self._templates: ResourcePath | None = None  # Metal3MachineTemplates at their served version, once discovered
        self.last_error = ""

    def _informer(
        self, kind: str, path: ResourcePath, ref: Ref, label_selector: str | None = None, **options: Any
    ) -> Informer:
        """The cache of ``kind`` ``ref``: that object, or with
        ``label_selector`` (or no name) a set in its namespace."""
        key = (kind, ref)
        with self._lock:
            informer = self._informers.get(key)
            if informer is None:
                namespace, name = ref
                by_name = f"metadata.name={name}" if name and label_selector is None else None
                informer = Informer(
                    self.client,
                    path.collection(namespace),
                    field_selector=by_name,
                    label_selector=label_selector,
                    description=f"{kind} {namespace}/{name or '*'}",
                    **options,
                )
                informer.add_listener(self.on_change)
                self._informers[key] = informer.start()
            return informer

    def follow(self, table: MappingTable, timeout: float) -> None:
        """Watch what ``table`` names, and the Clusters of its MachineDeployments; stop the rest.

        Waits (up to ``timeout``) for new watches to list once: the Clusters are known only from
        the MachineDeployments, and a pass should see everything it watches.
        """
        wanted: set[tuple[str, Ref]] = set()
        machine_deployments: ResourcePath | None = None
        for mapping in table:
            self._informer("mirror", DEPLOYMENTS, mapping.mirror)
            wanted.add(("mirror", mapping.mirror))
            try:
                machine_deployments = self.scaler.resource_path()
            except ScaleError as exc:
                self.last_error = exc.cause  # CAPI not served (yet): the next pass tries again
                continue
            self._informer("machinedeployment", machine_deployments, mapping.machine_deployment)
            wanted.add(("machinedeployment", mapping.machine_deployment))
        self._wait_listed(wanted, timeout)
        if machine_deployments is not None:
            self._follow_pools(table, machine_deployments, wanted)
            clusters = ResourcePath(CAPI_GROUP, machine_deployments.version, "clusters")
            for mapping in table:
                cluster = self.cluster_ref(mapping)
                if cluster is not None:
                    self._informer("cluster", clusters, cluster)
                    wanted.add(("cluster", cluster))
            self._wait_listed(wanted, timeout)
        with self._lock:
            gone = [key for key in self._informers if key not in wanted]
            for key in gone:
                self._informers.pop(key).stop()

    def _follow_pools(
        self, table: MappingTable, machine_deployments: ResourcePath, wanted: set[tuple[str, Ref]]
    ) -> None:
        """Watch the pools' Machines (safe scale-in, machine health, capacity) and what capacity counts
        (errors surface in :meth:`capacity`).

        A Machine's watch event wakes the reconciler, so a Machine Cluster API just created gets
        safe scale-in's pre-terminate hook within one event, not one resync later: a Machine deleted
        before it carries the hook would not be held.
        """
        machines = ResourcePath(CAPI_GROUP, machine_deployments.version, "machines")
        for mapping in table:
            md = self.machine_deployment(mapping)
            if md is None or not (
                mapping.capacity_aware or mapping.safe_scale_in is not None or mapping.slurm_health is not None
            ):
                continue
            namespace, name = mapping.machine_deployment
            self._informer(
                "machines", machines, mapping.machine_deployment, label_selector=f"{DEPLOYMENT_NAME_LABEL}={name}"
            )
            wanted.add(("machines", mapping.machine_deployment))
            if not mapping.capacity_aware:
                continue
            try:
                templates = self._metal3_templates()
                template = template_name(md)
            except (CapacityUnknown, ScaleError):
                continue
            self._informer("template", templates, (namespace, template))
            self._informer("hosts", BAREMETALHOSTS, (namespace, ""), transform=_slim_host)
            wanted.update({("template", (namespace, template)), ("hosts", (namespace, ""))})

    def _metal3_templates(self) -> ResourcePath:
        if self._templates is None:
            try:
                self._templates = self.client.resource(METAL3_GROUP, "metal3machinetemplates", METAL3_VERSIONS)
            except KubeError as exc:
                raise ScaleError(f"Metal3MachineTemplates are not served: {exc.message}", 503) from None
        return self._templates

    def capacity(self, mapping: Mapping) -> Capacity:
        """How many Machines the pool of ``mapping`` can have; raise :class:`CapacityUnknown` saying why not."""
        md = self.machine_deployment(mapping)
        if md is None:
            raise CapacityUnknown(f"MachineDeployment {mapping.machine_deployment_ref} not found")
        namespace, name = mapping.machine_deployment
        template = template_name(md)
        try:
            self._metal3_templates()
        except ScaleError as exc:
            raise CapacityUnknown(exc.cause) from None
        template_cache = self._listed("template", (namespace, template), mapping)
        template_obj = template_cache.get(namespace, template)
        if template_obj is None:
            raise CapacityUnknown(f"Metal3MachineTemplate {namespace}/{template} not found")
        hosts = self._listed("hosts", (namespace, ""), mapping).items()
        machines = self._listed("machines", mapping.machine_deployment, mapping).items()
        cluster = self.cluster_ref(mapping)  # the MachineDeployment's spec.clusterName: CAPM3 v1.14 books hosts by it
        return count(namespace, name, template_obj, hosts, machines, cluster=cluster[1] if cluster else None)

    def _listed(self, kind: str, ref: Ref, mapping: Mapping) -> Informer:
        informer = self._cache(kind, ref)
        if informer is None or not informer.synced:
            error = f": {informer.last_error}" if informer is not None and informer.last_error else ""
            raise CapacityUnknown(f"the {kind} of {mapping.machine_deployment_ref} are not listed yet{error}")
        return informer

    def _cache(self, kind: str, ref: Ref) -> Informer | None:
        with self._lock:
            return self._informers.get((kind, ref))

    def _wait_listed(self, keys: set[tuple[str, Ref]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            informers = [self._informers[key] for key in keys if key in self._informers]
        for informer in informers:
            informer.wait_synced(max(0.0, deadline - time.monotonic()))

    def _get(self, kind: str, ref: Ref) -> Obj | None:
        informer = self._cache(kind, ref)
        return None if informer is None else informer.get(*ref)

    def wait_changed(self, kind: str, ref: Ref, before: str, timeout: float = 2.0) -> None:
        """After a write: wait until the cached object is no longer at resourceVersion ``before``.

        The reconciler's next pass then reads its own write, not the state before it (a watch
        event is usually milliseconds away; after ``timeout`` it goes on, and an absolute write
        repeated once is harmless).
        """
        _wait_until(lambda: _version(self._get(kind, ref)) != before, timeout)

    def wait_marks(self, mapping: Mapping, marked: list[str], unmarked: list[str], timeout: float = 2.0) -> None:
        """After safe scale-in marked (or took the mark off) Machines: wait until the Machine cache shows it.

        A scale-up takes the pending victims it reclaims from this cache; it must see the marks
        this process just made as a fresh list would, even when it follows within one watch event.
        A Machine gone from the cache counts as seen (Cluster API may delete a marked one at once).
        """
        informer = self._cache("machines", mapping.machine_deployment)
        if informer is None or not (marked or unmarked):
            return
        namespace = mapping.machine_deployment[0]

        def shown(name: str, mark: bool) -> bool:
            machine = informer.get(namespace, name)
            return machine is None or (DELETE_MACHINE_ANNOTATION in machine_annotations(machine)) == mark

        _wait_until(lambda: all(shown(n, True) for n in marked) and all(shown(n, False) for n in unmarked), timeout)

    def machines(self, mapping: Mapping) -> list[Obj] | None:
        """The pool's Machines as cached; None when they are not watched or not listed yet."""
        informer = self._cache("machines", mapping.machine_deployment)
        return informer.items() if informer is not None and informer.synced else None

    def synced(self, mapping: Mapping) -> bool:
        """The mirror and MachineDeployment caches have listed at least once (an object may be absent)."""
        with self._lock:
            informers = [
                self._informers.get(("mirror", mapping.mirror)),
                self._informers.get(("machinedeployment", mapping.machine_deployment)),
            ]
        return all(i is not None and i.synced for i in informers)

    def mirror(self, mapping: Mapping) -> Obj | None:
        return self._get("mirror", mapping.mirror)

    def machine_deployment(self, mapping: Mapping) -> Obj | None:
        return self._get("machinedeployment", mapping.machine_deployment)

    def cluster_ref(self, mapping: Mapping) -> Ref | None:
        md = self.machine_deployment(mapping)
        name = ((md or {}).get("spec") or {}).get("clusterName")
        return (mapping.machine_deployment[0], name) if isinstance(name, str) and name else None

    def cluster(self, mapping: Mapping) -> Obj | None:
        ref = self.cluster_ref(mapping)
        return None if ref is None else self._get("cluster", ref)

    def stop(self) -> None:
        with self._lock:
            informers, self._informers = list(self._informers.values()), {}
        for informer in informers:
            informer.stop()


def _version(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _wait_until(condition: Callable[[], bool], timeout: float) -> None:
    """Poll a cache ``condition`` every 2 ms until it holds or ``timeout`` passes (a watch event is ms away)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.002)
