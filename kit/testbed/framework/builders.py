"""Object builders and a raw-path call helper shared by the kubemu tests."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException


def raw(
    api_client: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str | None = None,
    query: list[tuple[str, str]] | None = None,
) -> tuple[int, Any]:
    """A raw-path call the way SliMe's KubeClient makes it: (status, decoded body); raises on non-2xx."""
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    method, url, headers, body, _ = api_client.param_serialize(
        method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    response = api_client.call_api(method, url, headers, body)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.status, (json.loads(data) if data else None)


def pod(name: str, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        **extra,
    }


def machine_deployment(name: str, replicas: int = 1, version: str = "v1beta1") -> dict[str, Any]:
    return {
        "apiVersion": f"cluster.x-k8s.io/{version}",
        "kind": "MachineDeployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "clusterName": "c1"},
    }


def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }
