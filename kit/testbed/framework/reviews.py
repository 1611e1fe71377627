"""The AdmissionReview ``request`` objects kube-apiserver sends to our two webhooks."""

from __future__ import annotations

from typing import Any

from common.names import CAPM3_MANAGER_USERNAME


def secret_request(
    secret: dict[str, Any],
    operation: str = "CREATE",
    *,
    requester: str = CAPM3_MANAGER_USERNAME,
    dry_run: bool = False,
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What the injection webhook receives when CAPM3 (or ``requester``) creates or updates a metaData Secret."""
    return {
        "kind": {"group": "", "version": "v1", "kind": "Secret"},
        "resource": {"group": "", "version": "v1", "resource": "secrets"},
        "requestKind": {"group": "", "version": "v1", "kind": "Secret"},
        "requestResource": {"group": "", "version": "v1", "resource": "secrets"},
        "name": secret["metadata"]["name"],
        "namespace": secret["metadata"]["namespace"],
        "operation": operation,
        "userInfo": {"username": requester, "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": secret,
        "oldObject": (old or secret) if operation == "UPDATE" else None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }


def scale_request(
    namespace: str,
    name: str,
    replicas: Any,
    *,
    dry_run: bool = False,
    operation: str = "UPDATE",
    old_replicas: int = 1,
) -> dict[str, Any]:
    """What the scaling webhook receives for ``PATCH deployments/<name>/scale`` (KEDA's HPA scaling a mirror)."""
    scale_kind = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    resource = {"group": "apps", "version": "v1", "resource": "deployments"}

    def scale(value: Any) -> dict[str, Any]:
        # As kube-apiserver serializes it: ScaleSpec.Replicas is an int32 with omitempty, so 0 is left out.
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {} if type(value) is int and value == 0 else {"replicas": value},
            "status": {"replicas": old_replicas, "selector": f"app={name}"},
        }

    return {
        "kind": scale_kind,
        "resource": resource,
        "subResource": "scale",
        "requestKind": scale_kind,
        "requestResource": resource,
        "requestSubResource": "scale",
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:keda:keda-operator"},
        "object": scale(replicas),
        "oldObject": scale(old_replicas),
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"},
    }
