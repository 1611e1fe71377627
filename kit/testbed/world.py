"""Seed a management cluster the way Slinky, CAPI and CAPM3 shape it, and read it back.

The shapes follow docs/interfaces.md and the upstream contracts: a Slinky ``Controller`` with its
slurmctld StatefulSet and pod (with a ``hostIP``), the auth Secrets (``slurm.key``: 1024 random
ASCII characters, like Slinky's Helm default; ``jwt_hs256.key``: 32 random bytes), a NodePort or
LoadBalancer Service, an opted-in
``Metal3DataTemplate`` and its ``Metal3Data``, the ``metaData`` Secret CAPM3 creates, CAPI
``MachineDeployment``s, the mirror Deployments and the scaling ConfigMap.

Every seeding function takes an :class:`ObjectApi`: kubemu's :class:`~kubemu.Emulator` is one.
"""

from __future__ import annotations

import base64
import secrets
import string
from dataclasses import dataclass
from typing import Any, Protocol

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


class ObjectApi(Protocol):
    """Create and read objects by apiVersion and kind (what kubemu's Emulator offers)."""

    def create(self, obj: Obj, namespace: str | None = None) -> Obj: ...

    def get(self, api_version: str, kind_or_plural: str, namespace: str, name: str) -> Obj | None: ...

    def list(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]: ...


class MutableObjectApi(ObjectApi, Protocol):
    """An :class:`ObjectApi` that can also change objects (kubemu's Emulator is one)."""

    def update(self, obj: Obj) -> Obj: ...

    def patch(self, api_version: str, kind_or_plural: str, namespace: str, name: str, patch: Obj) -> Obj: ...


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


# Every secret this process made, so a test session can prove none of them leaked.
_ISSUED_SECRETS: list[bytes] = []


def issued_secrets() -> list[bytes]:
    """The slurm.key and JWT signing keys made by :func:`make_slurm_key` / :func:`make_jwt_key` so far."""
    return list(_ISSUED_SECRETS)


def make_slurm_key() -> bytes:
    """Like Slinky's Helm default: 1024 random ASCII characters."""
    key = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(1024)).encode()
    _ISSUED_SECRETS.append(key)
    return key


def make_jwt_key() -> bytes:
    """An HS256 signing key like Slinky's ``jwt_hs256.key`` (32 random bytes)."""
    key = secrets.token_bytes(32)
    _ISSUED_SECRETS.append(key)
    return key


def ensure_namespace(api: ObjectApi, name: str) -> None:
    if api.get("v1", "Namespace", "", name) is None:
        # kube-apiserver labels every namespace with its name; namespaceSelectors rely on it.
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            }
        )


# --- Slinky ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmCluster:
    """What was seeded for one Slinky controller (the key never shows in a repr)."""

    namespace: str
    controller: str
    key: bytes
    host_ip: str
    key_secret: str = ""
    jwt_key: bytes = b""
    jwt_secret: str = ""

    def __repr__(self) -> str:  # never show the keys, even in a traceback
        return (
            f"SlurmCluster({self.namespace}/{self.controller}, key_secret={self.key_secret!r}, key=<{len(self.key)} "
            f"bytes>, jwt_secret={self.jwt_secret!r}, jwt_key=<{len(self.jwt_key)} bytes>)"
        )

    @property
    def pod(self) -> str:
        return f"{self.controller}-controller-0"


def seed_slinky(
    api: ObjectApi,
    namespace: str = "slurm",
    controller: str = "slurm",
    host_ip: str = "192.0.2.10",
    phase: str = "Running",
    key_ref: dict[str, str] | None = None,
    controller_version: str = "v1beta1",
    labels: dict[str, str] | None = None,
    with_controller: bool = True,
    with_key_secret: bool = True,
    jwt_key_ref: dict[str, str] | None = None,
    jwt_ref_field: str = "jwtKeyRef",
    with_jwt_secret: bool = True,
    standby_host_ips: tuple[str, ...] = (),
) -> SlurmCluster:
    """A Slinky Controller, its slurmctld StatefulSet and pod, and the auth key Secrets.

    ``jwt_ref_field``: ``jwtKeyRef`` (Slinky 1.x) or ``jwtHs256KeyRef`` (v1alpha1, and its
    deprecated 1.x alias); the ref is written only when ``jwt_key_ref`` is given.
    ``standby_host_ips``: Slinky >= 1.3's high availability: more controller pods (``-1``, ``-2``,
    ...) on those hosts, and pod 0 labelled ``controller.slinky.slurm.net/active=true``."""
    labels = labels or {**CONTROLLER_SELECTOR_LABELS, "app.kubernetes.io/instance": controller}
    ensure_namespace(api, namespace)
    spec: dict[str, Any] = {"clusterName": controller}
    if key_ref:
        spec["slurmKeyRef"] = key_ref
    if jwt_key_ref:
        spec[jwt_ref_field] = jwt_key_ref
    ctrl = {
        "apiVersion": f"slinky.slurm.net/{controller_version}",
        "kind": "Controller",
        "metadata": {"name": controller, "namespace": namespace},
        "spec": spec,
    }
    ctrl_uid = api.create(ctrl)["metadata"]["uid"] if with_controller else "missing-uid"
    container = {"name": "slurmctld", "image": SLURMCTLD_IMAGE, "ports": [{"name": "slurmctld", "containerPort": 6817}]}
    sts = api.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": f"{controller}-controller",
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": f"slinky.slurm.net/{controller_version}",
                        "kind": "Controller",
                        "name": controller,
                        "uid": ctrl_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "serviceName": f"{controller}-controller",
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
            "status": {"replicas": 1, "readyReplicas": 1},
        }
    )
    for index, pod_host in enumerate((host_ip, *standby_host_ips)):
        status: dict[str, Any] = {"phase": phase}
        if pod_host:
            status["hostIP"] = pod_host
            status["podIP"] = f"10.244.1.{17 + index}"
        pod_labels = {**labels, **({ACTIVE_CONTROLLER_LABEL: "true"} if standby_host_ips and index == 0 else {})}
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{controller}-controller-{index}",
                    "namespace": namespace,
                    "labels": pod_labels,
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "StatefulSet",
                            "name": sts["metadata"]["name"],
                            "uid": sts["metadata"]["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": {"nodeName": f"k8s-node-{index + 1}", "containers": [container]},
                "status": status,
            }
        )
    key = make_slurm_key()
    secret_name = (key_ref or {}).get("name", f"{controller}-auth-slurm")
    secret_key = (key_ref or {}).get("key", "slurm.key")
    if with_key_secret:
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": namespace},
                "type": "Opaque",
                "data": {secret_key: b64(key)},
            }
        )
    jwt_key = make_jwt_key()
    jwt_name = (jwt_key_ref or {}).get("name", f"{controller}-auth-jwths256")
    if with_jwt_secret:
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": jwt_name, "namespace": namespace},
                "type": "Opaque",
                "data": {(jwt_key_ref or {}).get("key", "jwt_hs256.key"): b64(jwt_key)},
            }
        )
    return SlurmCluster(namespace, controller, key, host_ip, secret_name, jwt_key, jwt_name)


def fail_over(api: MutableObjectApi, slurm: SlurmCluster, to: int) -> None:
    """Slinky >= 1.3's failover: the active label moves to controller pod ``to``."""
    for pod in api.list("v1", "Pod", slurm.namespace):
        name = pod["metadata"]["name"]
        if not name.startswith(f"{slurm.controller}-controller-"):
            continue
        labels = dict(pod["metadata"].get("labels") or {})
        if name.endswith(f"-{to}"):
            labels[ACTIVE_CONTROLLER_LABEL] = "true"
        else:
            labels.pop(ACTIVE_CONTROLLER_LABEL, None)
        pod["metadata"]["labels"] = labels
        api.update(pod)


def move_slurmctld(api: MutableObjectApi, slurm: SlurmCluster, host_ip: str, phase: str = "Running") -> None:
    """slurmctld rescheduled: its pod (same name, as a StatefulSet recreates it) now on ``host_ip``."""
    pod = api.get("v1", "Pod", slurm.namespace, slurm.pod)
    assert pod is not None, f"no slurmctld pod {slurm.namespace}/{slurm.pod}"
    pod["status"] = {**pod["status"], "phase": phase, "hostIP": host_ip}
    if not host_ip:
        pod["status"].pop("hostIP")
    api.update(pod)


def seed_nodeport(
    api: ObjectApi, namespace: str, controller: str, node_port: int = 30817, target: int | str = 6817
) -> None:
    """The NodePort Service the thesis uses to expose slurmctld to bare-metal nodes."""
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{controller}-controller-nodeport", "namespace": namespace},
            "spec": {
                "type": "NodePort",
                "externalTrafficPolicy": "Local",
                "selector": {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": controller},
                "ports": [{"name": "slurmctld", "port": 6817, "targetPort": target, "nodePort": node_port}],
            },
        }
    )


def seed_loadbalancer(
    api: ObjectApi, namespace: str, controller: str, name: str = "", port: int = 6817, node_port: int = 31817
) -> str:
    """A LoadBalancer Service for slurmctld with no ingress yet (as MetalLB creates it, pending); its name."""
    name = name or f"{controller}-controller-lb"
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "type": "LoadBalancer",
                "selector": {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": controller},
                "ports": [{"name": "slurmctld", "port": port, "targetPort": 6817, "nodePort": node_port}],
            },
        }
    )
    return name


def assign_ingress(api: MutableObjectApi, namespace: str, name: str, ip: str = "", hostname: str = "") -> None:
    """The load balancer controller assigns the Service's ingress (``status.loadBalancer.ingress``)."""
    entry = {"ip": ip} if ip else {"hostname": hostname}
    api.patch("v1", "Service", namespace, name, {"status": {"loadBalancer": {"ingress": [entry]}}})


# --- CAPM3 -----------------------------------------------------------------------------------------


def seed_metal3(
    api: ObjectApi,
    namespace: str = "metal3",
    cluster: str = "bm-cluster",
    template: str = "workers-template",
    template_labels: dict[str, str] | None = None,
    index: int = 0,
    version: str = "v1beta1",
    template_owner: bool = True,
    template_annotations: dict[str, str] | None = None,
) -> tuple[Obj, Obj]:
    """A Metal3DataTemplate and one Metal3Data (CAPM3 <= 1.13 with the template owner, else without)."""
    ensure_namespace(api, namespace)
    group = f"infrastructure.cluster.x-k8s.io/{version}"
    tmpl = api.get(group, "Metal3DataTemplate", namespace, template) or api.create(
        {
            "apiVersion": group,
            "kind": "Metal3DataTemplate",
            "metadata": {
                "name": template,
                "namespace": namespace,
                "labels": template_labels or {},
                "annotations": template_annotations or {},
            },
            "spec": {"clusterName": cluster},
        }
    )
    claim = f"{cluster}-claim-{index}"
    owners = [
        {
            "apiVersion": group,
            "kind": "Metal3DataClaim",
            "name": claim,
            "uid": f"6a1d3f52-0000-4000-8000-{index:012d}",
            "controller": not template_owner,
        }
    ]
    if template_owner:
        owners.insert(
            0,
            {
                "apiVersion": group,
                "kind": "Metal3DataTemplate",
                "name": template,
                "uid": tmpl["metadata"]["uid"],
                "controller": True,
            },
        )
    data = api.create(
        {
            "apiVersion": group,
            "kind": "Metal3Data",
            "metadata": {
                "name": f"{template}-{index}",
                "namespace": namespace,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster},
                "ownerReferences": owners,
            },
            "spec": {
                "index": index,
                "template": {"name": template, "namespace": namespace},
                "claim": {"name": claim, "namespace": namespace},
            },
        }
    )
    return tmpl, data


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


# --- CAPI and the scaling webhook ------------------------------------------------------------------


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
) -> Obj:
    """A BareMetalHost as BMO reports it: ``state`` is ``status.provisioning.state``;
    ``consumer`` a Metal3Machine name."""
    spec: Obj = {"online": True, "bmc": {"address": f"redfish://bmc.example/{name}", "credentialsName": f"{name}-bmc"}}
    if consumer is not None:
        spec["consumerRef"] = {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "kind": "Metal3Machine",
            "name": consumer,
            "namespace": namespace,
        }
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


def config_map(data: dict[str, str], name: str = SCALING_CONFIG_MAP, namespace: str = SLIME_NAMESPACE) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def md_replicas(api: ObjectApi, namespace: str, name: str) -> int | None:
    obj = api.get(f"{CAPI}/v1beta1", "MachineDeployment", namespace, name)
    return None if obj is None else obj["spec"].get("replicas")


def md_events(api: ObjectApi, namespace: str, name: str, reason: str | None = None) -> list[Obj]:
    """The Events recorded on MachineDeployment ``namespace/name`` (with ``reason`` when given)."""
    events = [
        e
        for e in api.list("v1", "Event", namespace)
        if e.get("involvedObject", {}).get("name") == name
        and e.get("involvedObject", {}).get("kind") == "MachineDeployment"
    ]
    return [e for e in events if reason is None or e.get("reason") == reason]


def scale_mirror(emulator: Any, namespace: str, name: str, replicas: int, dry_run: bool = False) -> Obj:
    """``PATCH deployments/<name>/scale`` through the API, as KEDA's HPA does: admission runs,
    then the mirror is stored.

    Raises the kubernetes client's ``ApiException`` when the API server (an admission webhook) refuses it.
    """
    from kubernetes import client

    api = emulator.api_client()
    try:
        apps = client.AppsV1Api(api)
        answer = apps.patch_namespaced_deployment_scale(
            name, namespace, {"spec": {"replicas": replicas}}, dry_run="All" if dry_run else None
        )
        result: Obj = api.sanitize_for_serialization(answer)
        return result
    finally:
        api.close()


def impersonating(api_client: Any, username: str = CAPM3_MANAGER_USERNAME) -> Any:
    """``api_client`` sending every request as ``username`` (``Impersonate-User``), as CAPM3's manager by
    default: kube-apiserver (and kubemu) then name that user in admission reviews. The caller's own
    identity needs the ``impersonate`` verb, which cluster admins have."""
    api_client.set_default_header("Impersonate-User", username)
    return api_client


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


def seed_capm3_identity(api: ObjectApi, metal3_namespaces: tuple[str, ...] = ("metal3",)) -> str:
    """CAPM3's manager identity on a real API server: its ServiceAccount, and the Secret rights its
    ClusterRole grants (create, read and update the metaData Secrets), so a tier can create those
    Secrets as CAPM3 does (impersonating it; see :func:`impersonating`). Returns the username."""
    ensure_namespace(api, "capm3-system")
    for namespace in metal3_namespaces:
        ensure_namespace(api, namespace)
    if api.get("v1", "ServiceAccount", "capm3-system", "capm3-manager") is None:
        api.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "capm3-manager", "namespace": "capm3-system"},
            }
        )
    rbac = "rbac.authorization.k8s.io/v1"
    if api.get(rbac, "ClusterRole", "", "slime-test-capm3-secrets") is None:
        api.create(
            {
                "apiVersion": rbac,
                "kind": "ClusterRole",
                "metadata": {"name": "slime-test-capm3-secrets"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["secrets"],
                        "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"],
                    }
                ],
            }
        )
        api.create(
            {
                "apiVersion": rbac,
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "slime-test-capm3-secrets"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "slime-test-capm3-secrets",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "capm3-manager", "namespace": "capm3-system"}],
            }
        )
    return CAPM3_MANAGER_USERNAME
