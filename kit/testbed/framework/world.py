"""Seed a site's objects into a cluster the way Slinky, CAPI and CAPM3 make them, and read them back.

Every function takes a :class:`~testbed.framework.cluster.Cluster`: kubemu's ``Emulator`` (its
direct store access keeps a seeded ``status``) or a :class:`~testbed.framework.cluster.KubeClient`
on a real API server (it writes ``status`` through ``/status``). The objects themselves are
:mod:`testbed.framework.objects`'. The keys made here (``slurm.key``: 1024 random ASCII characters,
like Slinky's Helm default; ``jwt_hs256.key``: 32 random bytes) are remembered, so a test session
can prove none of them leaked (:func:`issued_secrets`).
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from typing import Any

from common.names import ACTIVE_CONTROLLER_LABEL, CAPM3_MANAGER_USERNAME
from testbed.framework.cluster import Cluster, MutableCluster
from testbed.framework.objects import (
    CAPI,
    CONTROLLER_SELECTOR_LABELS,
    Obj,
    opaque_secret,
    owner,
    slinky_controller,
    slurmctld_pod,
    slurmctld_statefulset,
)

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


def ensure_namespace(api: Cluster, name: str) -> None:
    if api.get("v1", "Namespace", "", name) is None:
        # kube-apiserver labels every namespace with its name; namespaceSelectors rely on it.
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            }
        )


# --- Slinky ---------------------------------------------------------------------------------------------------


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
    api: Cluster,
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
    complete_refs: bool = False,
) -> SlurmCluster:
    """A Slinky Controller, its slurmctld StatefulSet and pods, and the auth key Secrets.

    ``jwt_ref_field``: ``jwtKeyRef`` (Slinky 1.x) or ``jwtHs256KeyRef`` (v1alpha1, and its
    deprecated 1.x alias); the ref is written only when ``jwt_key_ref`` is given.
    ``standby_host_ips``: Slinky >= 1.3's high availability: more controller pods (``-1``, ``-2``,
    ...) on those hosts, and pod 0 labelled ``controller.slinky.slurm.net/active=true``.
    ``complete_refs``: both key references spelled out, as Slinky 1.0's CRD requires on a real
    API server (kubemu has no schema to require them)."""
    labels = labels or {**CONTROLLER_SELECTOR_LABELS, "app.kubernetes.io/instance": controller}
    ensure_namespace(api, namespace)
    secret_name = (key_ref or {}).get("name", f"{controller}-auth-slurm")
    jwt_name = (jwt_key_ref or {}).get("name", f"{controller}-auth-jwths256")
    spec: dict[str, Any] = {}
    if key_ref or complete_refs:
        spec["slurmKeyRef"] = key_ref or {"name": secret_name, "key": "slurm.key"}
    if jwt_key_ref:
        spec[jwt_ref_field] = jwt_key_ref
    if complete_refs:
        spec.setdefault("jwtHs256KeyRef", {"name": jwt_name, "key": "jwt_hs256.key"})
    ctrl = slinky_controller(controller, namespace, controller_version, spec)
    stored = api.create(ctrl) if with_controller else {**ctrl, "metadata": {**ctrl["metadata"], "uid": "missing-uid"}}
    sts = api.create(slurmctld_statefulset(controller, namespace, labels, owner(stored)))
    for index, pod_host in enumerate((host_ip, *standby_host_ips)):
        status: dict[str, Any] = {"phase": phase}
        if pod_host:
            status.update(hostIP=pod_host, podIP=f"10.244.1.{17 + index}")
        api.create(slurmctld_pod(sts, index, labels, status, active=bool(standby_host_ips) and index == 0))
    key, jwt_key = make_slurm_key(), make_jwt_key()
    if with_key_secret:
        api.create(opaque_secret(secret_name, namespace, {(key_ref or {}).get("key", "slurm.key"): key}))
    if with_jwt_secret:
        api.create(opaque_secret(jwt_name, namespace, {(jwt_key_ref or {}).get("key", "jwt_hs256.key"): jwt_key}))
    return SlurmCluster(namespace, controller, key, host_ip, secret_name, jwt_key, jwt_name)


def fail_over(api: MutableCluster, slurm: SlurmCluster, to: int) -> None:
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


def move_slurmctld(api: MutableCluster, slurm: SlurmCluster, host_ip: str, phase: str = "Running") -> None:
    """slurmctld rescheduled: its pod (same name, as a StatefulSet recreates it) now on ``host_ip``."""
    pod = api.get("v1", "Pod", slurm.namespace, slurm.pod)
    assert pod is not None, f"no slurmctld pod {slurm.namespace}/{slurm.pod}"
    pod["status"] = {**pod["status"], "phase": phase, "hostIP": host_ip}
    if not host_ip:
        pod["status"].pop("hostIP")
    api.update(pod)


def seed_nodeport(
    api: Cluster, namespace: str, controller: str, node_port: int = 30817, target: int | str = 6817
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
    api: Cluster, namespace: str, controller: str, name: str = "", port: int = 6817, node_port: int = 31817
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


def assign_ingress(api: MutableCluster, namespace: str, name: str, ip: str = "", hostname: str = "") -> None:
    """The load balancer controller assigns the Service's ingress (``status.loadBalancer.ingress``)."""
    entry = {"ip": ip} if ip else {"hostname": hostname}
    api.patch("v1", "Service", namespace, name, {"status": {"loadBalancer": {"ingress": [entry]}}})


def seed_metal3(
    api: Cluster,
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


def md_replicas(api: Cluster, namespace: str, name: str) -> int | None:
    obj = api.get(f"{CAPI}/v1beta1", "MachineDeployment", namespace, name)
    return None if obj is None else obj["spec"].get("replicas")


def md_events(api: Cluster, namespace: str, name: str, reason: str | None = None) -> list[Obj]:
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


def seed_capm3_identity(api: Cluster, metal3_namespaces: tuple[str, ...] = ("metal3",)) -> str:
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
