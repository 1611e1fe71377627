"""The AdmissionReview ``request`` objects kube-apiserver sends to our two webhooks, and how tests read the answers."""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol

import yaml

from common.names import CAPM3_MANAGER_USERNAME
from testbed.framework.audit import EVIDENCE


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


def deployment_request(
    namespace: str,
    name: str,
    replicas: Any,
    *,
    old_replicas: int = 1,
    requester: str = "system:serviceaccount:tenant:someone",
    dry_run: bool = False,
) -> dict[str, Any]:
    """What the scaling webhook receives for ``kubectl patch deployment <name>`` of ``spec.replicas``."""
    kind = {"group": "apps", "version": "v1", "kind": "Deployment"}
    resource = {"group": "apps", "version": "v1", "resource": "deployments"}

    def deployment(value: Any) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": {"slime/mirror": name}},
            "spec": {"replicas": value, "selector": {"matchLabels": {"app": name}}},
        }

    return {
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": name,
        "namespace": namespace,
        "operation": "UPDATE",
        "userInfo": {"username": requester},
        "object": deployment(replicas),
        "oldObject": deployment(old_replicas),
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"},
    }


# --- the injection webhook's answers, as a test reads them ------------------------------------------------


class Reviewer(Protocol):
    def review(self, path: str, request: dict[str, Any]) -> dict[str, Any]: ...


def mutate(service: Reviewer, secret: dict[str, Any], operation: str = "CREATE", **request: Any) -> dict[str, Any]:
    """The injection webhook's answer to a metaData Secret (``request``: ``secret_request``'s options); every
    answer with a message is handed to the session's secret scan."""
    response = service.review("/mutate", secret_request(secret, operation, **request))
    if "status" in response or "warnings" in response:
        EVIDENCE.add_text("injection answer", json.dumps(response))
    return response


def injected(response: dict[str, Any]) -> dict[str, str]:
    """The metaData keys of a patched answer (it must be one JSON patch replacing ``/data/metaData``)."""
    assert response["allowed"] is True and response.get("patchType") == "JSONPatch", response
    patch = json.loads(base64.b64decode(response["patch"]))
    assert [(op["op"], op["path"]) for op in patch] == [("replace", "/data/metaData")]
    metadata: dict[str, str] = yaml.safe_load(base64.b64decode(patch[0]["value"]))
    return metadata


def denial(response: dict[str, Any]) -> str:
    """The message of a denied answer (403, no patch)."""
    assert response["allowed"] is False and "patch" not in response, response
    assert response["status"]["code"] == 403
    message: str = response["status"]["message"]
    return message


def withheld(response: dict[str, Any]) -> tuple[str, str]:
    """The (warning, message) of an answer that admits the Secret without join data."""
    assert response["allowed"] is True and "patch" not in response, response
    (warning,) = response["warnings"]
    message: str = response["status"]["message"]
    return warning, message
