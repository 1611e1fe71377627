"""Watched copies of what the mappings name: mirror Deployments, MachineDeployments, their Clusters.

One list+watch cache per named object (``fieldSelector=metadata.name=<name>``, which RBAC can
narrow with ``resourceNames``). Admissions read them to check a review against the cluster; the
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

from common.cache import Informer
from common.kube import KubeClient, ResourcePath
from scaling_webhook.errors import ScaleError
from scaling_webhook.machinedeployments import CAPI_GROUP, DEPLOYMENTS, MachineDeploymentScaler
from scaling_webhook.mappings import Mapping, MappingTable, Ref

log = logging.getLogger("slime.scaling.watches")

Obj = dict[str, Any]


class MappedObjects:
    def __init__(self, client: KubeClient, scaler: MachineDeploymentScaler, on_change: Callable[[], None]) -> None:
        self.client = client
        self.scaler = scaler
        self.on_change = on_change
        self._informers: dict[tuple[str, Ref], Informer] = {}
        self._lock = threading.Lock()
        self.last_error = ""

    def _informer(self, kind: str, path: ResourcePath, ref: Ref) -> Informer:
        key = (kind, ref)
        with self._lock:
            informer = self._informers.get(key)
            if informer is None:
                namespace, name = ref
                informer = Informer(self.client, path.collection(namespace), field_selector=f"metadata.name={name}",
                                    description=f"{kind} {namespace}/{name}")
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

    def _wait_listed(self, keys: set[tuple[str, Ref]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            informers = [self._informers[key] for key in keys if key in self._informers]
        for informer in informers:
            informer.wait_synced(max(0.0, deadline - time.monotonic()))

    def _get(self, kind: str, ref: Ref) -> Obj | None:
        with self._lock:
            informer = self._informers.get((kind, ref))
        return None if informer is None else informer.get(*ref)

    def wait_changed(self, kind: str, ref: Ref, before: str, timeout: float = 2.0) -> None:
        """After a write: wait until the cached object is no longer at resourceVersion ``before``.

        The reconciler's next pass then reads its own write, not the state before it (a watch
        event is usually milliseconds away; after ``timeout`` it goes on, and an absolute write
        repeated once is harmless).
        """
        deadline = time.monotonic() + timeout
        while _version(self._get(kind, ref)) == before and time.monotonic() < deadline:
            time.sleep(0.002)

    def synced(self, mapping: Mapping) -> bool:
        """The mirror and MachineDeployment caches have listed at least once (an object may be absent)."""
        with self._lock:
            informers = [self._informers.get(("mirror", mapping.mirror)), self._informers.get(("machinedeployment", mapping.machine_deployment))]
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
