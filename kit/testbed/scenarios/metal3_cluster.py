"""What an operator writes for a Metal3 workload cluster on the real tiers: the cluster, its pool, its hosts.

- :func:`seed_cluster`: the workload cluster as an operator writes it (Cluster, the control plane
  stand-in, Metal3Cluster, Metal3MachineTemplate, an opted-in Metal3DataTemplate, the bootstrap
  user-data Secret, the MachineDeployment), complete objects since no admission webhook of CAPI or
  CAPM3 runs to default them;
- :func:`register_host`: a host enrolled as an operator enrolls one: its BMC credentials Secret
  and a BareMetalHost whose BMC address (``redfish://<host>.bmc.invalid/...``) nothing serves
  (BMO's test mode never dials it), inspection disabled and the hardware details an inspection
  would find (its NIC's address on the test bridge, its name) in BMO's
  ``inspect.metal3.io/hardwaredetails`` annotation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.components.capi import CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND
from testbed.components.cloudinit import USER_DATA
from testbed.components.controlplane import ControlPlane
from testbed.components.ironic import BMO_V
from testbed.framework.cluster import Cluster
from testbed.framework.objects import b64
from testbed.framework.pins import KUBE_VERSION

Obj = dict[str, Any]

INFRA = "infrastructure.cluster.x-k8s.io"
INFRA_V = f"{INFRA}/v1beta2"  # CAPM3 v1.13's storage version; its CRDs carry the v1beta2 contract label
CAPI_V = "cluster.x-k8s.io/v1beta2"
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
HARDWARE_DETAILS_ANNOTATION = "inspect.metal3.io/hardwaredetails"
IMAGE = "http://images.invalid/slurm-worker.qcow2"  # BMO's test mode never fetches it


@dataclass(frozen=True)
class ClusterSpec:
    """The names of one CAPI cluster with one Metal3 worker pool."""

    namespace: str = "metal3"
    cluster: str = "bm-cluster"
    pool: str = "md-a"
    slurm_namespace: str = "slurm"  # the opt-in label of the Metal3DataTemplate: where slurmctld runs
    host_labels: tuple[tuple[str, str], ...] = (("pool", "workers"),)  # the template's hostSelector.matchLabels
    # Where the metaData's local-hostname (so the Slurm node's name) comes from: "machine" (a new
    # name per Machine), or "baremetalhost" (the host's name, known in advance: Slurm can hold FUTURE
    # node records for the pool's hosts, so jobs bigger than the nodes up queue instead of failing).
    hostname_object: str = "machine"

    @property
    def data_template(self) -> str:
        return f"{self.pool}-data"

    @property
    def user_data_secret(self) -> str:
        return f"{self.pool}-user-data"

    @property
    def control_plane(self) -> str:
        return f"{self.cluster}-control-plane"

    @property
    def labels(self) -> dict[str, str]:
        return {CLUSTER_LABEL: self.cluster}


def _object(api_version: str, kind: str, name: str, namespace: str, labels: dict[str, str], **rest: Any) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        **rest,
    }


def hardware_details(name: str, mac: str, address: str) -> Obj:
    """What BMO's inspection would report for a host (``status.hardware``): one NIC on the test bridge, its name."""
    return {
        "hostname": name,
        "nics": [{"name": "eth0", "mac": mac, "ip": address, "pxe": True, "speedGbps": 10}],
        "cpu": {"arch": "x86_64", "model": "test bridge host", "count": 2, "clockMegahertz": 2000.0},
        "ramMebibytes": 2048,
        "storage": [{"name": "/dev/vda", "sizeBytes": 64 * 2**30, "rotational": False, "type": "SSD"}],
    }


def register_host(api: Cluster, namespace: str, name: str, address: str, labels: dict[str, str] | None = None) -> Obj:
    """Enroll a host as an operator does: its BMC credentials Secret and its BareMetalHost (BMO takes it from there)."""
    mac = "52:54:00:" + ":".join(f"{b:02x}" for b in os.urandom(3))
    credentials = f"{name}-bmc-secret"
    data = {"username": b64("admin"), "password": b64(os.urandom(12).hex())}
    api.create(_object("v1", "Secret", credentials, namespace, {}, data=data))
    host = _object(BMO_V, "BareMetalHost", name, namespace, labels or {})
    host["metadata"]["annotations"] = {HARDWARE_DETAILS_ANNOTATION: json.dumps(hardware_details(name, mac, address))}
    host["spec"] = {
        "online": False,
        "bootMACAddress": mac,
        "bootMode": "UEFI",
        "bmc": {
            "address": f"redfish://{name}.bmc.invalid/redfish/v1/Systems/1",
            "credentialsName": credentials,
            "disableCertificateVerification": True,
        },
        "inspectionMode": "disabled",
        "automatedCleaningMode": "disabled",
    }
    return api.create(host)


def _control_plane(spec: ClusterSpec, endpoint: Obj) -> tuple[Obj, Obj]:
    """The ``HostedControlPlane`` stand-in and the status its provider would report (initialized, externally
    managed, at the tier's version)."""
    stand_in = _object(
        f"{CONTROL_PLANE_GROUP}/v1alpha1",
        CONTROL_PLANE_KIND,
        spec.control_plane,
        spec.namespace,
        spec.labels,
        spec={"version": KUBE_VERSION, "controlPlaneEndpoint": endpoint},
    )
    status = {
        "initialization": {"controlPlaneInitialized": True},
        "initialized": True,
        "ready": True,
        "externalManagedControlPlane": True,
        "version": KUBE_VERSION,
    }
    return stand_in, status


def _templates(spec: ClusterSpec) -> list[Obj]:
    """The opted-in Metal3DataTemplate (names as metal3-dev-env's templates) and the Metal3MachineTemplate."""
    data_template = _object(
        INFRA_V,
        "Metal3DataTemplate",
        spec.data_template,
        spec.namespace,
        {**spec.labels, "slurm-controller-namespace": spec.slurm_namespace},
        spec={
            "clusterName": spec.cluster,
            "metaData": {
                "objectNames": [
                    {"key": "name", "object": "machine"},
                    {"key": "local-hostname", "object": spec.hostname_object},
                ]
            },
        },
    )
    machine = {
        "image": {"url": IMAGE, "checksum": f"{IMAGE}.sha256sum", "checksumType": "sha256", "diskFormat": "qcow2"},
        "automatedCleaningMode": "disabled",  # no cleaning between uses (BMO's test mode would only wait for it)
        "dataTemplate": {"name": spec.data_template},
        "hostSelector": {"matchLabels": dict(spec.host_labels)},
    }
    machine_template = _object(
        INFRA_V, "Metal3MachineTemplate", spec.pool, spec.namespace, spec.labels, spec={"template": {"spec": machine}}
    )
    return [data_template, machine_template]


def _machine_deployment(spec: ClusterSpec, replicas: int) -> Obj:
    selector = {**spec.labels, "cluster.x-k8s.io/deployment-name": spec.pool}
    machine = {
        "clusterName": spec.cluster,
        "version": KUBE_VERSION,
        "bootstrap": {"dataSecretName": spec.user_data_secret},
        "infrastructureRef": {"apiGroup": INFRA, "kind": "Metal3MachineTemplate", "name": spec.pool},
    }
    rollout = {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}
    return _object(
        CAPI_V,
        "MachineDeployment",
        spec.pool,
        spec.namespace,
        spec.labels,
        spec={
            "clusterName": spec.cluster,
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "rollout": rollout,
            "deletion": {"order": "Random"},
            "template": {"metadata": {"labels": selector}, "spec": machine},
        },
    )


def seed_cluster(
    api: Cluster, cp: ControlPlane, spec: ClusterSpec, replicas: int = 0, user_data: Path = USER_DATA
) -> None:
    """A Metal3 workload cluster as an operator writes it (complete objects: CAPI's defaulting webhooks are off).

    The workload cluster's kubeconfig Secret points at the tier's own API server; the control plane is
    the ``HostedControlPlane`` stand-in (externally managed, initialized, at the tier's version). The
    bootstrap data comes from no bootstrap provider: the documented user-data, named by the
    MachineDeployment.
    """
    ns, labels, endpoint = spec.namespace, spec.labels, {"host": "127.0.0.1", "port": cp.port}
    secret_type = "cluster.x-k8s.io/secret"
    kubeconfig = {"value": b64(cp.kubeconfig.read_bytes())}
    api.create(_object("v1", "Secret", f"{spec.cluster}-kubeconfig", ns, labels, type=secret_type, data=kubeconfig))
    stand_in, status = _control_plane(spec, endpoint)
    api.create({**stand_in, "status": status})  # the status is written through /status, as its provider would
    infra = {"controlPlaneEndpoint": endpoint, "cloudProviderEnabled": False}
    api.create(_object(INFRA_V, "Metal3Cluster", spec.cluster, ns, labels, spec=infra))
    refs = {
        "controlPlaneRef": {"apiGroup": CONTROL_PLANE_GROUP, "kind": CONTROL_PLANE_KIND, "name": spec.control_plane},
        "infrastructureRef": {"apiGroup": INFRA, "kind": "Metal3Cluster", "name": spec.cluster},
    }
    api.create(_object(CAPI_V, "Cluster", spec.cluster, ns, labels, spec=refs))
    for template in _templates(spec):
        api.create(template)
    bootstrap = {"value": b64(user_data.read_bytes()), "format": b64("cloud-config")}
    api.create(_object("v1", "Secret", spec.user_data_secret, ns, labels, type=secret_type, data=bootstrap))
    api.create(_machine_deployment(spec, replicas))
