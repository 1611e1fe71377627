"""Seed an emulated cluster the way CAPM3 and Slinky shape it (contracts.md)."""

from __future__ import annotations

import base64
import secrets
import string
from dataclasses import dataclass
from typing import Any

import yaml

from kubemu import Emulator

SELECTOR_LABELS = {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/component": "controller"}


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def make_slurm_key() -> bytes:
    """Like Slinky's Helm default: 1024 random ASCII characters."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(1024)).encode()


@dataclass
class SlurmCluster:
    namespace: str
    controller: str
    key: bytes
    host_ip: str


def seed_slinky(
    emu: Emulator,
    namespace: str = "slurm",
    controller: str = "slurm",
    host_ip: str = "192.0.2.10",
    phase: str = "Running",
    key_ref: dict[str, str] | None = None,
    controller_version: str = "v1beta1",
    labels: dict[str, str] | None = None,
    with_controller: bool = True,
    with_key_secret: bool = True,
) -> SlurmCluster:
    """A Slinky Controller, its slurmctld StatefulSet and pod, and the auth key Secret."""
    labels = labels or {**SELECTOR_LABELS, "app.kubernetes.io/instance": controller}
    if emu.get("v1", "Namespace", "", namespace) is None:
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    spec: dict[str, Any] = {"clusterName": controller}
    if key_ref:
        spec["slurmKeyRef"] = key_ref
    ctrl = {"apiVersion": f"slinky.slurm.net/{controller_version}", "kind": "Controller",
            "metadata": {"name": controller, "namespace": namespace}, "spec": spec}
    ctrl_uid = emu.create(ctrl)["metadata"]["uid"] if with_controller else "missing-uid"
    sts = emu.create({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": f"{controller}-controller", "namespace": namespace, "labels": labels,
                     "ownerReferences": [{"apiVersion": f"slinky.slurm.net/{controller_version}", "kind": "Controller",
                                          "name": controller, "uid": ctrl_uid, "controller": True}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "serviceName": f"{controller}-controller",
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "slurmctld", "image": "slurmctld"}]}}},
    })
    status: dict[str, Any] = {"phase": phase}
    if host_ip:
        status["hostIP"] = host_ip
    emu.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{controller}-controller-0", "namespace": namespace, "labels": labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                                          "uid": sts["metadata"]["uid"], "controller": True}]},
        "spec": {"containers": [{"name": "slurmctld", "image": "slurmctld", "ports": [{"name": "slurmctld", "containerPort": 6817}]}]},
        "status": status,
    })
    key = make_slurm_key()
    secret_name = (key_ref or {}).get("name", f"{controller}-auth-slurm")
    secret_key = (key_ref or {}).get("key", "slurm.key")
    if with_key_secret:
        emu.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name, "namespace": namespace},
                    "type": "Opaque", "data": {secret_key: b64(key)}})
    return SlurmCluster(namespace, controller, key, host_ip)


def seed_nodeport(emu: Emulator, namespace: str, controller: str, node_port: int = 30817, target: int | str = 6817) -> None:
    emu.create({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{controller}-controller-nodeport", "namespace": namespace},
        "spec": {"type": "NodePort", "externalTrafficPolicy": "Local",
                 "selector": {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": controller},
                 "ports": [{"name": "slurmctld", "port": 6817, "targetPort": target, "nodePort": node_port}]},
    })


def seed_metal3(
    emu: Emulator,
    namespace: str = "metal3",
    cluster: str = "bm-cluster",
    template: str = "workers-template",
    template_labels: dict[str, str] | None = None,
    index: int = 0,
    version: str = "v1beta1",
    template_owner: bool = True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Metal3DataTemplate and one Metal3Data (CAPM3 <= 1.13 with the template owner, else without)."""
    if emu.get("v1", "Namespace", "", namespace) is None:
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    group = f"infrastructure.cluster.x-k8s.io/{version}"
    tmpl = emu.get(group, "Metal3DataTemplate", namespace, template) or emu.create({
        "apiVersion": group, "kind": "Metal3DataTemplate",
        "metadata": {"name": template, "namespace": namespace, "labels": template_labels or {}},
        "spec": {"clusterName": cluster},
    })
    owners = [{"apiVersion": group, "kind": "Metal3DataClaim", "name": f"{cluster}-claim-{index}", "uid": f"claim-{index}", "controller": not template_owner}]
    if template_owner:
        owners.insert(0, {"apiVersion": group, "kind": "Metal3DataTemplate", "name": template,
                          "uid": tmpl["metadata"]["uid"], "controller": True})
    data = emu.create({
        "apiVersion": group, "kind": "Metal3Data",
        "metadata": {"name": f"{template}-{index}", "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster}, "ownerReferences": owners},
        "spec": {"index": index, "template": {"name": template, "namespace": namespace},
                 "claim": {"name": f"{cluster}-claim-{index}", "namespace": namespace}},
    })
    return tmpl, data


def metadata_secret(data: dict[str, Any], machine: str = "m3m-0", extra: dict[str, str] | None = None) -> dict[str, Any]:
    """The Secret CAPM3 creates: ``<Metal3Machine>-metadata`` owned by the Metal3Data."""
    meta = data["metadata"]
    content = {"local-hostname": machine, "providerid": f"{meta['namespace']}/bmh-0/{machine}", **(extra or {})}
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "infrastructure.cluster.x-k8s.io/secret",
        "metadata": {"name": f"{machine}-metadata", "namespace": meta["namespace"],
                     "labels": {"cluster.x-k8s.io/cluster-name": meta["labels"]["cluster.x-k8s.io/cluster-name"]},
                     "ownerReferences": [{"apiVersion": data["apiVersion"], "kind": "Metal3Data", "name": meta["name"],
                                          "uid": meta["uid"], "controller": True}]},
        "data": {"metaData": b64(yaml.safe_dump(content))},
    }


def admission_request(secret: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "kind": {"group": "", "version": "v1", "kind": "Secret"},
        "resource": {"group": "", "version": "v1", "resource": "secrets"},
        "requestKind": {"group": "", "version": "v1", "kind": "Secret"},
        "requestResource": {"group": "", "version": "v1", "resource": "secrets"},
        "name": secret["metadata"]["name"],
        "namespace": secret["metadata"]["namespace"],
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:capm3-system:capm3-manager"},
        "object": secret,
        "oldObject": secret if operation == "UPDATE" else None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }


def decoded_metadata(patch_value: str) -> dict[str, str]:
    return yaml.safe_load(base64.b64decode(patch_value))
