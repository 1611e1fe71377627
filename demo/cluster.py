"""The demo's emulated management cluster, shaped the way Slinky, CAPI and CAPM3 shape it.

Object shapes follow docs/interfaces.md and /work/shared/reference/contracts.md: a Slinky
``Controller`` with its slurmctld StatefulSet and pod (with a ``hostIP``), the auth Secret
``<controller>-auth-slurm`` (``slurm.key``: 1024 random ASCII characters), a NodePort Service,
an opted-in ``Metal3DataTemplate`` and one ``Metal3Data``, a CAPI ``MachineDeployment`` at 0
replicas. The mirror Deployment and the scaling ConfigMap come from the rendered chart
(:func:`apply_chart_objects`), as ``helm install`` would create them.
"""

from __future__ import annotations

import base64
import secrets
import string
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

import yaml

from kubemu import Emulator

SLURM_NAMESPACE = "slurm"
CONTROLLER = "slurm"
HOST_IP = "192.0.2.10"
NODE_PORT = 30817
METAL3_NAMESPACE = "metal3"
CAPI_CLUSTER = "bm-cluster"
TEMPLATE = "slurm-workers"
MACHINE_DEPLOYMENT = "md-slurm-workers"
SLIME_NAMESPACE = "slime"
MIRROR = "mirror-slurm-workers"
PARTITION = "workers"
CAPI_VERSION = "cluster.x-k8s.io/v1beta2"
METAL3_VERSION = "infrastructure.cluster.x-k8s.io/v1beta1"

CONTROLLER_LABELS = {
    "app.kubernetes.io/name": "slurmctld",
    "app.kubernetes.io/instance": CONTROLLER,
    "app.kubernetes.io/component": "controller",
}


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def make_slurm_key() -> bytes:
    """Like Slinky's Helm default: 1024 random ASCII characters."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(1024)).encode()


@dataclass(frozen=True)
class SeededCluster:
    """What the demo needs to know about what it seeded (the key stays out of any output)."""

    slurm_key: bytes
    key_secret: str
    metal3_data: dict[str, Any]

    def __repr__(self) -> str:  # never show the key, even in a traceback
        return f"SeededCluster(key_secret={self.key_secret!r}, slurm_key=<{len(self.slurm_key)} bytes>)"


def chart_values() -> dict[str, Any]:
    """Helm values whose mapping matches the seeded objects."""
    return {
        "certManager": {"enabled": False},
        "scaling": {
            "resyncSeconds": 1,
            "mappings": [{
                "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
                "machineDeployment": {"name": MACHINE_DEPLOYMENT, "namespace": METAL3_NAMESPACE},
                "partition": PARTITION,
            }],
        },
    }


def _namespace(emu: Emulator, name: str) -> None:
    if emu.get("v1", "Namespace", "", name) is None:
        # kube-apiserver labels every namespace with its name; namespaceSelectors rely on it.
        emu.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}})


def seed_slinky(emu: Emulator) -> tuple[bytes, str]:
    """Controller, slurmctld StatefulSet and pod, auth key Secret, NodePort Service."""
    _namespace(emu, SLURM_NAMESPACE)
    ns = SLURM_NAMESPACE
    key_secret = f"{CONTROLLER}-auth-slurm"
    ctrl = emu.create({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
        "metadata": {"name": CONTROLLER, "namespace": ns},
        "spec": {"clusterName": CONTROLLER, "slurmKeyRef": {"name": key_secret, "key": "slurm.key"}},
    })
    sts = emu.create({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": f"{CONTROLLER}-controller", "namespace": ns, "labels": CONTROLLER_LABELS,
                     "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
                                          "name": CONTROLLER, "uid": ctrl["metadata"]["uid"], "controller": True}]},
        "spec": {"replicas": 1, "serviceName": f"{CONTROLLER}-controller",
                 "selector": {"matchLabels": CONTROLLER_LABELS},
                 "template": {"metadata": {"labels": CONTROLLER_LABELS},
                              "spec": {"containers": [{"name": "slurmctld", "image": "ghcr.io/slinkyproject/slurmctld:25.05",
                                                       "ports": [{"name": "slurmctld", "containerPort": 6817}]}]}}},
        "status": {"replicas": 1, "readyReplicas": 1},
    })
    emu.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{CONTROLLER}-controller-0", "namespace": ns, "labels": CONTROLLER_LABELS,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                                          "uid": sts["metadata"]["uid"], "controller": True}]},
        "spec": {"nodeName": "k8s-node-1",
                 "containers": [{"name": "slurmctld", "image": "ghcr.io/slinkyproject/slurmctld:25.05",
                                 "ports": [{"name": "slurmctld", "containerPort": 6817}]}]},
        "status": {"phase": "Running", "hostIP": HOST_IP, "podIP": "10.244.1.17"},
    })
    key = make_slurm_key()
    emu.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": key_secret, "namespace": ns},
                "data": {"slurm.key": b64(key)}})
    emu.create({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{CONTROLLER}-controller-nodeport", "namespace": ns},
        "spec": {"type": "NodePort", "externalTrafficPolicy": "Local",
                 "selector": {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": CONTROLLER},
                 "ports": [{"name": "slurmctld", "port": 6817, "targetPort": 6817, "nodePort": NODE_PORT}]},
    })
    return key, key_secret


def seed_metal3(emu: Emulator) -> dict[str, Any]:
    """An opted-in Metal3DataTemplate and one Metal3Data (CAPM3 <= 1.13: the template owns it)."""
    _namespace(emu, METAL3_NAMESPACE)
    ns = METAL3_NAMESPACE
    tmpl = emu.create({
        "apiVersion": METAL3_VERSION, "kind": "Metal3DataTemplate",
        "metadata": {"name": TEMPLATE, "namespace": ns,
                     "labels": {"slurm-controller-namespace": SLURM_NAMESPACE, "cluster.x-k8s.io/cluster-name": CAPI_CLUSTER}},
        "spec": {"clusterName": CAPI_CLUSTER, "metaData": {"strings": [{"key": "role", "value": "slurm-worker"}]}},
    })
    return emu.create({
        "apiVersion": METAL3_VERSION, "kind": "Metal3Data",
        "metadata": {"name": f"{TEMPLATE}-0", "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": CAPI_CLUSTER},
                     "ownerReferences": [
                         {"apiVersion": METAL3_VERSION, "kind": "Metal3DataTemplate", "name": TEMPLATE,
                          "uid": tmpl["metadata"]["uid"], "controller": True},
                         {"apiVersion": METAL3_VERSION, "kind": "Metal3DataClaim", "name": f"{CAPI_CLUSTER}-workers-0",
                          "uid": "6a1d3f52-0000-4000-8000-000000000001"}]},
        "spec": {"index": 0, "template": {"name": TEMPLATE, "namespace": ns},
                 "claim": {"name": f"{CAPI_CLUSTER}-workers-0", "namespace": ns}},
    })


def seed_capi(emu: Emulator) -> None:
    """The MachineDeployment of the Slurm workers, at 0 (KEDA's minimum)."""
    selector = {"cluster.x-k8s.io/cluster-name": CAPI_CLUSTER, "cluster.x-k8s.io/deployment-name": MACHINE_DEPLOYMENT}
    emu.create({
        "apiVersion": CAPI_VERSION, "kind": "MachineDeployment",
        "metadata": {"name": MACHINE_DEPLOYMENT, "namespace": METAL3_NAMESPACE,
                     "labels": {"cluster.x-k8s.io/cluster-name": CAPI_CLUSTER}},
        "spec": {"clusterName": CAPI_CLUSTER, "replicas": 0, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": selector},
                              "spec": {"clusterName": CAPI_CLUSTER, "version": "v1.31.0",
                                       "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                                                   "kind": "VirtualKubeletConfigTemplate",
                                                                   "name": "slurm-workers"}},
                                       "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                             "kind": "Metal3MachineTemplate", "name": "slurm-workers"}}}},
        "status": {"replicas": 0, "selector": ",".join(f"{k}={v}" for k, v in selector.items())},
    })


def apply_chart_objects(emu: Emulator, rendered: list[dict[str, Any]]) -> list[str]:
    """Create the chart's scaling ConfigMap and mirror Deployments, as ``helm install`` would.

    A mirror has no ``replicas`` in the chart (KEDA owns it); the demo sets 0, KEDA's minimum,
    where a fresh install would get the API default of 1 until KEDA's first decision.
    """
    created = []
    _namespace(emu, SLIME_NAMESPACE)
    for obj in rendered:
        kind = obj.get("kind")
        if kind == "ConfigMap" or (kind == "Deployment" and (obj["metadata"].get("labels") or {}).get(
                "app.kubernetes.io/component") == "mirror"):
            obj = deepcopy(obj)
            if kind == "Deployment":
                obj["spec"]["replicas"] = 0
            _namespace(emu, obj["metadata"]["namespace"])
            emu.create(obj)
            created.append(f"{kind} {obj['metadata']['namespace']}/{obj['metadata']['name']}")
    return created


def seed(emu: Emulator, rendered: list[dict[str, Any]]) -> SeededCluster:
    _namespace(emu, SLIME_NAMESPACE)
    key, key_secret = seed_slinky(emu)
    data = seed_metal3(emu)
    seed_capi(emu)
    apply_chart_objects(emu, rendered)
    return SeededCluster(slurm_key=key, key_secret=key_secret, metal3_data=data)


def metadata_secret(data: dict[str, Any], machine: str = f"{CAPI_CLUSTER}-workers-0") -> dict[str, Any]:
    """The Secret CAPM3 creates for a machine: ``<Metal3Machine>-metadata``, owned by the Metal3Data."""
    meta = data["metadata"]
    content = {"local-hostname": "node-0", "providerid": f"{meta['namespace']}/node-0/{machine}", "role": "slurm-worker"}
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "infrastructure.cluster.x-k8s.io/secret",
        "metadata": {"name": f"{machine}-metadata", "namespace": meta["namespace"],
                     "labels": {"cluster.x-k8s.io/cluster-name": CAPI_CLUSTER},
                     "ownerReferences": [{"apiVersion": data["apiVersion"], "kind": "Metal3Data", "name": meta["name"],
                                          "uid": meta["uid"], "controller": True}]},
        "data": {"metaData": b64(yaml.safe_dump(content, sort_keys=False))},
    }
