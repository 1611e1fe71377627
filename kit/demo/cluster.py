"""The demo's emulated management cluster, shaped the way Slinky, CAPI and CAPM3 shape it.

Object shapes follow docs/interfaces.md and the upstream contracts (seeded by
:mod:`testbed.framework.world`): a Slinky ``Controller`` with its slurmctld StatefulSet and pod (with a
``hostIP``), the auth Secret ``<controller>-auth-slurm`` (``slurm.key``: 1024 random ASCII
characters), a NodePort Service, an opted-in ``Metal3DataTemplate`` and one ``Metal3Data``, a
CAPI ``MachineDeployment`` at 0 replicas, and CAPM3's own Deployment (its ServiceAccount is the
identity that gets join data). The mirror Deployment and the scaling ConfigMap come from the
rendered chart (:func:`apply_chart_objects`), as ``helm install`` would create them; so do the
release's webhook Deployments, Services, TLS Secrets and webhook configurations
(:func:`install_release`), pointed at the webhooks the demo runs, so ``slime-check`` can check
the demo like an install.
"""

from __future__ import annotations

import base64
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubemu import Emulator
from testbed.framework import objects, world

SLURM_NAMESPACE = "slurm"
CONTROLLER = "slurm"
HOST_IP = "192.0.2.10"
NODE_PORT = 30817
METAL3_NAMESPACE = "metal3"
# The operator's choices for a shared management cluster: the tenant namespace that holds the Metal3
# objects may take join data from the Slinky Controller in the Slurm namespace, and its templates may
# ask for the controller name.
SLURM_BINDINGS = f"{METAL3_NAMESPACE}={SLURM_NAMESPACE}"
MAX_REPLICAS = 8  # the pool's ceiling: a mapping without one is refused
TEMPLATE_OPT_INS = "controller-name"
CAPI_CLUSTER = "bm-cluster"
TEMPLATE = "slurm-workers"
MACHINE_DEPLOYMENT = "md-slurm-workers"
SLIME_NAMESPACE = objects.SLIME_NAMESPACE
MIRROR = "mirror-slurm-workers"
PARTITION = "workers"
CAPI_VERSION = "cluster.x-k8s.io/v1beta2"
METAL3_VERSION = "infrastructure.cluster.x-k8s.io/v1beta1"
b64 = objects.b64


@dataclass(frozen=True)
class SeededCluster:
    """What the demo needs to know about what it seeded (the key stays out of any output)."""

    slurm_key: bytes
    key_secret: str
    metal3_data: dict[str, Any]

    def __repr__(self) -> str:  # never show the key, even in a traceback
        return f"SeededCluster(key_secret={self.key_secret!r}, slurm_key=<{len(self.slurm_key)} bytes>)"


def chart_values(ports: dict[str, int] | None = None) -> dict[str, Any]:
    """Helm values whose mapping matches the seeded objects; ``ports``: each webhook's admission port."""
    ports = ports or {}
    return {
        "certManager": {"enabled": False},
        "selfSignedTLS": {"generator": "helm"},  # kubemu runs no hook Job; the demo sets the caBundle itself
        "injection": {
            "replicas": 1,
            "port": ports.get("injection", 8443),
            "slurmBindings": [SLURM_BINDINGS],
            "templateOptIns": [TEMPLATE_OPT_INS],
        },
        "scaling": {
            "replicas": 1,
            "port": ports.get("scaling", 8444),
            "resyncSeconds": 1,
            "mappings": [
                {
                    "mirror": {"name": MIRROR, "namespace": SLIME_NAMESPACE},
                    "machineDeployment": {"name": MACHINE_DEPLOYMENT, "namespace": METAL3_NAMESPACE},
                    "maxReplicas": MAX_REPLICAS,
                    "partition": PARTITION,
                }
            ],
        },
    }


def seed_slinky(emu: Emulator) -> tuple[bytes, str]:
    """Controller (with ``slurmKeyRef``), slurmctld StatefulSet and pod, auth key Secret, NodePort Service."""
    key_secret = f"{CONTROLLER}-auth-slurm"
    slurm = world.seed_slinky(
        emu, SLURM_NAMESPACE, CONTROLLER, host_ip=HOST_IP, key_ref={"name": key_secret, "key": "slurm.key"}
    )
    world.seed_nodeport(emu, SLURM_NAMESPACE, CONTROLLER, NODE_PORT)
    return slurm.key, key_secret


def seed_metal3(emu: Emulator) -> dict[str, Any]:
    """An opted-in Metal3DataTemplate and one Metal3Data (CAPM3 <= 1.13: the template owns it).

    The template keeps the default address policy (hostIP) and opts in to the controller name, which the
    demo's operator lets templates choose (:data:`TEMPLATE_OPT_INS`)."""
    labels = {"slurm-controller-namespace": SLURM_NAMESPACE, "cluster.x-k8s.io/cluster-name": CAPI_CLUSTER}
    _, data = world.seed_metal3(
        emu,
        METAL3_NAMESPACE,
        CAPI_CLUSTER,
        TEMPLATE,
        labels,
        version=METAL3_VERSION.split("/")[1],
        template_annotations={"slurm-extra-join-data": "controller-name"},
    )
    return data


def seed_capi(emu: Emulator) -> None:
    """The MachineDeployment of the Slurm workers, at 0 (KEDA's minimum)."""
    emu.create(
        objects.machine_deployment(
            MACHINE_DEPLOYMENT,
            METAL3_NAMESPACE,
            replicas=0,
            version=CAPI_VERSION.split("/")[1],
            cluster=CAPI_CLUSTER,
            full=True,
        )
    )


def apply_chart_objects(emu: Emulator, rendered: list[dict[str, Any]]) -> list[str]:
    """Create the chart's scaling ConfigMap and mirror Deployments, as ``helm install`` would.

    A mirror has no ``replicas`` in the chart (KEDA owns it); the demo sets 0, KEDA's minimum,
    where a fresh install would get the API default of 1 until KEDA's first decision.
    """
    created = []
    world.ensure_namespace(emu, SLIME_NAMESPACE)
    for obj in rendered:
        kind = obj.get("kind")
        if kind == "ConfigMap" or (
            kind == "Deployment"
            and (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "mirror"
        ):
            obj = deepcopy(obj)
            if kind == "Deployment":
                obj["spec"]["replicas"] = 0
            world.ensure_namespace(emu, obj["metadata"]["namespace"])
            emu.create(obj)
            created.append(f"{kind} {obj['metadata']['namespace']}/{obj['metadata']['name']}")
    return created


def seed_capm3(emu: Emulator) -> None:
    """CAPM3's controller Deployment (its ServiceAccount is the identity the injection webhook allows), ready."""
    deployment = objects.capm3_deployment()
    world.ensure_namespace(emu, deployment["metadata"]["namespace"])
    deployment["status"] = {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1}
    emu.create(deployment)


def install_release(emu: Emulator, rendered: list[dict[str, Any]], tls: dict[str, Path], ca_pem: bytes) -> list[str]:
    """The release's webhook objects, as ``helm install`` leaves them, pointed at the demo's own webhooks.

    Each webhook Deployment is stored as ready (the demo runs its one replica in-process); each
    webhook Service is an ``ExternalName`` for ``localhost`` (the chart's port is the port the demo's
    webhook listens on), as the real-Kubernetes tier routes them; each TLS Secret holds the pair the
    webhook serves, and each webhook configuration the demo CA as its ``caBundle``. RBAC objects and
    PodDisruptionBudgets are left out: kubemu authorizes nothing and schedules nothing.
    """
    created = []
    bundle = base64.b64encode(ca_pem).decode()
    for obj in rendered:
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        component = (meta.get("labels") or {}).get("app.kubernetes.io/component", "")
        obj = deepcopy(obj)
        if kind == "Deployment" and component.endswith("-webhook"):
            replicas = obj["spec"].get("replicas", 1)
            obj["status"] = {k: replicas for k in ("replicas", "readyReplicas", "availableReplicas", "updatedReplicas")}
        elif kind == "Service" and component.endswith("-webhook"):
            obj["spec"] = {"type": "ExternalName", "externalName": "localhost", "ports": obj["spec"].get("ports")}
        elif kind == "Secret" and component.endswith("-webhook") and component.split("-")[0] in tls:
            directory = tls[component.split("-")[0]]
            obj["data"] = {
                "tls.crt": base64.b64encode((directory / "tls.crt").read_bytes()).decode(),
                "tls.key": base64.b64encode((directory / "tls.key").read_bytes()).decode(),
                "ca.crt": bundle,
            }
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in obj.get("webhooks") or []:
                hook["clientConfig"]["caBundle"] = bundle
        else:
            continue
        emu.create(obj)
        created.append(f"{kind} {meta.get('namespace', '')}/{meta['name']}".replace(" /", " "))
    return created


def seed(emu: Emulator, rendered: list[dict[str, Any]]) -> SeededCluster:
    world.ensure_namespace(emu, SLIME_NAMESPACE)
    key, key_secret = seed_slinky(emu)
    data = seed_metal3(emu)
    seed_capi(emu)
    seed_capm3(emu)
    apply_chart_objects(emu, rendered)
    return SeededCluster(slurm_key=key, key_secret=key_secret, metal3_data=data)


def metadata_secret(data: dict[str, Any], machine: str = f"{CAPI_CLUSTER}-workers-0") -> dict[str, Any]:
    """The Secret CAPM3 creates for a machine: ``<Metal3Machine>-metadata``, owned by the Metal3Data."""
    return objects.metadata_secret(data, machine, extra={"role": "slurm-worker"}, host="node-0")
