"""Create and read objects on the real API server, shaped by :mod:`testbed.world` (its ``ObjectApi``).

The real API server ignores ``status`` on create (and resets it on resources with a status
subresource), so :meth:`RealApi.create` writes a given ``status`` afterwards through ``/status``,
the way the controllers that own those objects would (kubelet for a pod's ``hostIP``, CAPI for a
MachineDeployment's ``status.selector``).
"""

from __future__ import annotations

import time
from typing import Any

from testbed.real.controlplane import ControlPlane, ControlPlaneError

# kind -> (plural, namespaced); the kinds the tier's objects use.
KINDS: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False),
    "Pod": ("pods", True),
    "Service": ("services", True),
    "Secret": ("secrets", True),
    "ConfigMap": ("configmaps", True),
    "Event": ("events", True),
    "ServiceAccount": ("serviceaccounts", True),
    "Deployment": ("deployments", True),
    "StatefulSet": ("statefulsets", True),
    "ReplicaSet": ("replicasets", True),
    "Controller": ("controllers", True),
    "Metal3Data": ("metal3datas", True),
    "Metal3DataTemplate": ("metal3datatemplates", True),
    "MachineDeployment": ("machinedeployments", True),
    "Cluster": ("clusters", True),
    "Machine": ("machines", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
}


def collection_path(api_version: str, kind_or_plural: str, namespace: str = "") -> str:
    plural, namespaced = KINDS.get(kind_or_plural, (kind_or_plural, True))
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced and namespace:
        return f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{prefix}/{plural}"


class RealApi:
    """:class:`testbed.world.ObjectApi` over the real API server, as the admin (or as ``as_user``, impersonated)."""

    def __init__(self, cp: ControlPlane, as_user: str | None = None) -> None:
        self.cp = cp
        self.as_user = as_user

    def _request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        return self.cp.request(method, path, body, content_type=content_type, as_user=self.as_user)

    def create(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or obj["metadata"].get("namespace", "")
        path = collection_path(obj["apiVersion"], obj["kind"], namespace)
        body = {k: v for k, v in obj.items() if k != "status"}
        if obj["kind"] == "Controller" and obj["apiVersion"] == "slinky.slurm.net/v1beta1":
            # Slinky 1.0's CRD requires both key references; testbed.world names only the slurm key.
            spec = body.setdefault("spec", {})
            spec.setdefault(
                "jwtHs256KeyRef", {"name": f"{obj['metadata']['name']}-auth-jwths256", "key": "jwt_hs256.key"}
            )
            spec.setdefault("slurmKeyRef", {"name": f"{obj['metadata']['name']}-auth-slurm", "key": "slurm.key"})
        deadline = time.monotonic() + 30
        while True:
            try:
                created: dict[str, Any] = self._request("POST", path, body)
                break
            except ControlPlaneError as exc:
                # A namespace's `default` ServiceAccount appears a moment after the namespace (KCM).
                if 'serviceaccount \\"default\\" not found' not in str(
                    exc
                ) and 'serviceaccount "default" not found' not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if obj.get("status"):
            created = self._request(
                "PATCH",
                f"{path}/{created['metadata']['name']}/status",
                {"status": obj["status"]},
                content_type="application/merge-patch+json",
            )
        return created

    def get(self, api_version: str, kind_or_plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._request(
                "GET", f"{collection_path(api_version, kind_or_plural, namespace)}/{name}"
            )
            return found
        except ControlPlaneError as exc:
            if ": 404 " in str(exc):
                return None
            raise

    def list(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[dict[str, Any]]:
        query = "&".join(
            q
            for q in (
                f"labelSelector={label_selector}" if label_selector else "",
                f"fieldSelector={field_selector}" if field_selector else "",
            )
            if q
        )
        listed = self._request(
            "GET", collection_path(api_version, kind_or_plural, namespace) + (f"?{query}" if query else "")
        )
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    def patch(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        path = f"{collection_path(api_version, kind_or_plural, namespace)}/{name}" + (
            f"/{subresource}" if subresource else ""
        )
        patched: dict[str, Any] = self._request("PATCH", path, patch, content_type="application/merge-patch+json")
        return patched

    def delete(self, api_version: str, kind_or_plural: str, namespace: str, name: str) -> None:
        try:
            self._request("DELETE", f"{collection_path(api_version, kind_or_plural, namespace)}/{name}")
        except ControlPlaneError as exc:
            if ": 404 " not in str(exc):
                raise
