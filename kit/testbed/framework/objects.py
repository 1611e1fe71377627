"""The objects of a Slinky + CAPI + CAPM3 site as their controllers and operators write them: pure data.

The shapes follow docs/interfaces.md and the upstream contracts: Slinky's ``Controller`` with its
slurmctld StatefulSet and pods, the key Secrets, CAPM3's ``metaData`` Secret, CAPI
``MachineDeployment``s, SliMe's mirror Deployments and scaling ConfigMap, BareMetalHosts as BMO
reports them. :mod:`testbed.framework.world` seeds them into a cluster.
"""

from __future__ import annotations

import base64
from typing import Any

import yaml

from common.names import (
    ACTIVE_CONTROLLER_LABEL,
    ADOPTED_ANNOTATION,
    CAPI_PROVIDER_LABEL,
    CAPI_SECRET_TYPE,
    CAPM3_MANAGER_USERNAME,
    CAPM3_PROVIDER,
    CLUSTER_NAME_LABEL,
)

Obj = dict[str, Any]

CAPI = "cluster.x-k8s.io"
SLIME_NAMESPACE = "slime-system"  # where the tests, the demo and the docs install SliMe (docs/install.md says why)
# The test world's operator binds its tenant namespace (Metal3 objects) to its Slurm namespace (Slinky).
SLURM_BINDINGS = "metal3=slurm"
SCALING_CONFIG_MAP = "scaling-webhook-configmap"
CONTROLLER_SELECTOR_LABELS = {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/component": "controller"}
SLURMCTLD_IMAGE = "ghcr.io/slinkyproject/slurmctld:25.05"
SLINKY_GROUP = "slinky.slurm.net"


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


# Every secret this process made, so a test session can prove none of them leaked.
_ISSUED_SECRETS: list[bytes] = []

# --- Slinky ------------------------------------------------------------------------------------------------------


def owner(obj: Obj) -> Obj:
    """The controller ownerReference to ``obj`` (a stored object: it has a uid)."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def slinky_controller(name: str, namespace: str, version: str, spec: Obj) -> Obj:
    return {
        "apiVersion": f"{SLINKY_GROUP}/{version}",
        "kind": "Controller",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterName": name, **spec},
    }


def slurmctld_container() -> Obj:
    return {"name": "slurmctld", "image": SLURMCTLD_IMAGE, "ports": [{"name": "slurmctld", "containerPort": 6817}]}


def slurmctld_statefulset(controller: str, namespace: str, labels: dict[str, str], owned_by: Obj) -> Obj:
    """The slurmctld StatefulSet Slinky's operator makes for Controller ``controller`` (``owned_by``)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": f"{controller}-controller",
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owned_by],
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "serviceName": f"{controller}-controller",
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [slurmctld_container()]}},
        },
        "status": {"replicas": 1, "readyReplicas": 1},
    }


def slurmctld_pod(statefulset: Obj, index: int, labels: dict[str, str], status: Obj, active: bool = False) -> Obj:
    """Pod ``index`` of the slurmctld StatefulSet (``active``: Slinky >= 1.3's label of the serving one)."""
    meta = statefulset["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{index}",
            "namespace": meta["namespace"],
            "labels": {**labels, **({ACTIVE_CONTROLLER_LABEL: "true"} if active else {})},
            "ownerReferences": [owner(statefulset)],
        },
        "spec": {"nodeName": f"k8s-node-{index + 1}", "containers": [slurmctld_container()]},
        "status": status,
    }


def opaque_secret(name: str, namespace: str, data: dict[str, bytes]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {key: b64(value) for key, value in data.items()},
    }


# --- CAPM3, CAPI and the scaling webhook -------------------------------------------------------------------------


def kubeconfig_secret(
    kubeconfig: dict[str, Any] | str,
    cluster: str = "bm-cluster",
    namespace: str = "metal3",
    secret_type: str = CAPI_SECRET_TYPE,
    cluster_label: str | None = None,
) -> Obj:
    """The ``<cluster>-kubeconfig`` Secret Cluster API writes for a Cluster (type, label and ``value``);
    a kubeconfig given as a string is stored as it is (for kubeconfigs no YAML dump would make)."""
    text = kubeconfig if isinstance(kubeconfig, str) else yaml.safe_dump(kubeconfig)
    labels = {CLUSTER_NAME_LABEL: cluster if cluster_label is None else cluster_label}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": secret_type,
        "metadata": {"name": f"{cluster}-kubeconfig", "namespace": namespace, "labels": labels},
        "data": {"value": b64(text)},
    }


def metadata_secret(data: Obj, machine: str = "m3m-0", extra: dict[str, str] | None = None, host: str = "bmh-0") -> Obj:
    """The Secret CAPM3 creates: ``<Metal3Machine>-metadata`` owned by the Metal3Data."""
    meta = data["metadata"]
    content = {"local-hostname": machine, "providerid": f"{meta['namespace']}/{host}/{machine}", **(extra or {})}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "infrastructure.cluster.x-k8s.io/secret",
        "metadata": {
            "name": f"{machine}-metadata",
            "namespace": meta["namespace"],
            "labels": {"cluster.x-k8s.io/cluster-name": meta["labels"]["cluster.x-k8s.io/cluster-name"]},
            "ownerReferences": [
                {
                    "apiVersion": data["apiVersion"],
                    "kind": "Metal3Data",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "data": {"metaData": b64(yaml.safe_dump(content))},
    }


def decoded_metadata(patch_value: str) -> dict[str, str]:
    """The flat map a ``metaData`` value (base64 YAML) holds."""
    decoded: dict[str, str] = yaml.safe_load(base64.b64decode(patch_value))
    return decoded


def machine_deployment(
    name: str, namespace: str, replicas: int = 1, version: str = "v1beta1", cluster: str = "c1", full: bool = False
) -> Obj:
    """A MachineDeployment; ``full`` adds what a real one carries (selector, Machine template, status)."""
    obj: Obj = {
        "apiVersion": f"{CAPI}/{version}",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "clusterName": cluster},
    }
    if full:
        selector = {"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": name}
        # v1beta2 names referenced templates by apiGroup, v1beta1 by apiVersion.
        group_key, infra, bootstrap = (
            ("apiGroup", "infrastructure.cluster.x-k8s.io", "bootstrap.cluster.x-k8s.io")
            if version == "v1beta2"
            else ("apiVersion", "infrastructure.cluster.x-k8s.io/v1beta1", "bootstrap.cluster.x-k8s.io/v1alpha1")
        )
        obj["metadata"]["labels"] = {"cluster.x-k8s.io/cluster-name": cluster}
        obj["spec"]["selector"] = {"matchLabels": selector}
        obj["spec"]["template"] = {
            "metadata": {"labels": selector},
            "spec": {
                "clusterName": cluster,
                "version": "v1.31.0",
                "bootstrap": {
                    "configRef": {group_key: bootstrap, "kind": "VirtualKubeletConfigTemplate", "name": name}
                },
                "infrastructureRef": {group_key: infra, "kind": "Metal3MachineTemplate", "name": name},
            },
        }
        obj["status"] = {"replicas": replicas, "selector": ",".join(f"{k}={v}" for k, v in selector.items())}
    return obj


def mirror(
    name: str, namespace: str = SLIME_NAMESPACE, replicas: int | None = 1, adopted_from: str | None = None
) -> Obj:
    """A mirror Deployment (``replicas=None``: left out, as the chart renders it).

    ``adopted_from``: the ``<namespace>/<name>`` of the MachineDeployment it was already adopted
    from, as the scaling webhook marks it (a mapping that existed before this test).
    """
    labels = {"app": name}
    spec: Obj = {
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "pause", "image": "pause"}]}},
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    metadata: Obj = {"name": name, "namespace": namespace}
    if adopted_from is not None:
        metadata["annotations"] = {ADOPTED_ANNOTATION: adopted_from}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec}


def metal3_machine_template(
    name: str, namespace: str, host_selector: Obj | None = None, version: str = "v1beta1"
) -> Obj:
    """A Metal3MachineTemplate (only what capacity counting reads: ``hostSelector``)."""
    spec: Obj = {"image": {"url": "http://images/node.qcow2", "checksum": "http://images/node.qcow2.sha256sum"}}
    if host_selector is not None:
        spec["hostSelector"] = host_selector
    return {
        "apiVersion": f"infrastructure.cluster.x-k8s.io/{version}",
        "kind": "Metal3MachineTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": spec}},
    }


def baremetal_host(
    name: str,
    namespace: str,
    state: str = "available",
    labels: dict[str, str] | None = None,
    consumer: str | None = None,
    annotations: dict[str, str] | None = None,
    error: str = "",
    consumer_ref: Obj | None = None,
) -> Obj:
    """A BareMetalHost as BMO reports it: ``state`` is ``status.provisioning.state``;
    ``consumer`` a Metal3Machine name, or ``consumer_ref`` any reference (:func:`reuse_booking`)."""
    spec: Obj = {"online": True, "bmc": {"address": f"redfish://bmc.example/{name}", "credentialsName": f"{name}-bmc"}}
    if consumer is not None:
        spec["consumerRef"] = {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "kind": "Metal3Machine",
            "name": consumer,
            "namespace": namespace,
        }
    if consumer_ref is not None:
        spec["consumerRef"] = consumer_ref
    status: Obj = {
        "provisioning": {"state": state},
        "operationalStatus": "error" if error else "OK",
        "errorMessage": error,
    }
    return {
        "apiVersion": "metal3.io/v1alpha1",
        "kind": "BareMetalHost",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
        "status": status,
    }


def reuse_booking(cluster: str, namespace: str, version: str = "v1beta2") -> Obj:
    """The ``consumerRef`` CAPM3 v1.14 leaves on a host it keeps for node reuse: the Cluster (CAPM3 #3474; the
    host also carries the label ``infrastructure.cluster.x-k8s.io/node-reuse: md-<MachineDeployment>``)."""
    return {"apiVersion": f"{CAPI}/{version}", "kind": "Cluster", "name": cluster, "namespace": namespace}


def config_map(data: dict[str, str], name: str = SCALING_CONFIG_MAP, namespace: str = SLIME_NAMESPACE) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def capm3_deployment(username: str = CAPM3_MANAGER_USERNAME) -> Obj:
    """CAPM3's controller Deployment as clusterctl installs it: labelled with its provider
    (``cluster.x-k8s.io/provider=infrastructure-metal3``), running as the ServiceAccount of ``username``."""
    _, namespace, account = username.rsplit(":", 2)
    labels = {CAPI_PROVIDER_LABEL: CAPM3_PROVIDER, "control-plane": "controller-manager"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "capm3-controller-manager", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": account,
                    "containers": [{"name": "manager", "image": "quay.io/metal3-io/cluster-api-provider-metal3"}],
                },
            },
        },
    }
