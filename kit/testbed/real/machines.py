"""A machine simulator: CAPM3 + baremetal-operator/Ironic + cloud-init + the node's kubelet, for the real Cluster API.

Real Cluster API (:mod:`testbed.real.capi`) turns a MachineDeployment into MachineSets, Machines
and, from the Metal3MachineTemplate, Metal3Machines. Everything below the infrastructure contract
needs metal, so :class:`MachineSimulator` plays it, as CAPM3 v1.12 and BMO do it
(``baremetal/metal3machine_manager.go``, ``metal3datatemplate_manager.go``,
``metal3data_manager.go`` of CAPM3; ``../shared/reference/contracts.md``), every object through the
tier's kube-apiserver with the Metal3/BMO CRDs installed, so their schemas check what it writes:

**Metal3Cluster** (the Cluster's ``infrastructureRef``; CAPM3 v1.12 speaks the v1beta1 contract,
so CAPI reads ``status.ready``): once CAPI made the Cluster its owner, ``status.ready: true``.

**Metal3Machine** (CAPM3's machine controller), each pass:

1. finalizer ``metal3machine.infrastructure.cluster.x-k8s.io``; wait for the owner Machine, the
   Cluster's ``infrastructureProvisioned`` and the Machine's bootstrap data
   (``spec.bootstrap.dataSecretName``);
2. a ``Metal3DataClaim`` named after it (owner: it, finalizer) for its ``dataTemplate``;
3. choose a BareMetalHost as ``chooseHost`` does: same namespace, matching ``hostSelector``, no
   ``consumerRef``, not deleting, no ``errorMessage``, not paused or unhealthy, state
   ``available``/``ready`` (first by name, where CAPM3 picks at random). None: it waits, and so
   does its Machine (Provisioning), as with CAPM3. Chosen: ``consumerRef``, the Metal3Machine as
   controller owner, the ``cluster.x-k8s.io/cluster-name`` label on the host; the
   ``metal3.io/BareMetalHost`` annotation and ``status.userData`` on the Metal3Machine;
4. once its Metal3Data is ready: the host's ``image``, ``userData`` (the Machine's bootstrap Secret),
   ``metaData`` (the injected Secret) and ``online: true``;
5. once the host is ``provisioned``: ``spec.providerID`` ``metal3://<ns>/<bmh>/<m3m>`` (CAPM3's
   new format), ``status.ready: true``, ``status.addresses`` from the host's hardware details
   (its NIC's InternalIP, its hostname as Hostname and InternalDNS).

**Metal3DataTemplate / Metal3Data** (CAPM3's data controllers): a claim gets the lowest free index
``i`` and a Metal3Data ``<template>-<i>`` owned by the template (controller), the claim and the
Metal3Machine (CAPM3 v1.9–v1.13), the claim's labels, ``status.renderedData`` on the claim and the
index in the template's ``status.indexes``. Once the host is chosen the Metal3Data renders the
template's ``metaData`` (``strings``, ``objectNames``, ``namespaces``, ``indexes``, plus
``providerid: <ns>/<bmh>/<m3m>``) and **creates the ``<m3m>-metadata`` Secret through the API
server** (type ``infrastructure.cluster.x-k8s.io/secret``, the cluster label, the Metal3Data as
controller owner, one key ``metaData``), so the chart's injection webhook admits it as it would
CAPM3's. A refused create is retried, as CAPM3 requeues. Then ``spec.metaData`` and ``status.ready``.

**BareMetalHost** (BMO + Ironic): ``available`` with an image and ``online`` → ``provisioning`` →
after ``provision_seconds`` the host "boots": cloud-init (:func:`testbed.real.cloudinit.boot`)
renders the **user-data of the Machine's bootstrap Secret** (key ``value``) with the **metaData
Secret as stored** (after injection) and runs it in a network namespace with the address of the
host's NIC; the host is ``provisioned``, ``poweredOn``. Image removed or ``online: false`` → every
process of the host is stopped by PID and its namespace removed (a power-off) → ``deprovisioning``
→ after ``deprovision_seconds`` ``available`` again.

**Kubelet** (the node registers; with CABPV a virtual kubelet does): once provisioned, a Node
named after the metaData's ``local-hostname`` with ``spec.providerID`` ``metal3://`` + the
metaData's ``providerid``, Ready, its addresses; created in the workload cluster, which here is
the tier's API server (the ``<cluster>-kubeconfig`` Secret says so). CAPI finds it by providerID
and sets the Machine's ``nodeRef``: the Machine reaches Running.

**Deletion** (after CAPI ran the pre-drain hooks and drained the Node, it deletes the
Metal3Machine): the host's image, user-data, metaData are cleared and ``online: false`` (the
power-off above; before it, any job process still on the host or any job Slurm lists there as
RUNNING/COMPLETING is recorded in :attr:`MachineSimulator.violations`: a busy node was released);
once ``available``: ``consumerRef``, owner and label removed; the claim's finalizer removed and
the claim deleted, whose Metal3Data the data controller deletes (the Secret goes with it, by the
garbage collector); the Metal3Machine's finalizer removed. CAPI then deletes the Node.

**Shortcuts** (what is not simulated, or simpler than the real thing):

- No Ironic, no BMC, no image: "provisioning" is a fixed short wait, the "image" is the Slurm
  root every node shares, "booting" is cloud-init's part only (write_files, runcmd), the
  power-off is a SIGKILL of the host's processes. No inspection or registration: hosts start
  ``available`` with their hardware details (one NIC, its address on the test bridge, hostname =
  the host's name), as after BMO's inspection. No ``networkData``, no IP pools, no automated cleaning
  (deprovisioning is a fixed short wait), no node reuse, no ``failureDomain``, no remediation, no
  pausing, no status conditions (CAPI falls back to ``status.ready``), no Metal3Cluster finalizer
  or deletion.
- A host is chosen by name, not at random (deterministic tests; CAPM3's choice is random).
- One polling loop (every ``interval`` s, plus :meth:`MachineSimulator.step` on demand) instead of
  watches and work queues; each pass is idempotent and retries what failed, as a requeue would.
- The Node is the kubelet's registration only: no heartbeats (no node-lifecycle controller runs,
  so it stays Ready), no pods, no volumes. It is created as the tier's admin.
- The whole workload cluster is the tier's API server (the ``<cluster>-kubeconfig`` Secret points
  at it) and its control plane is :func:`testbed.real.capi.control_plane_crd`'s stand-in.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from common.names import CAPM3_MANAGER_USERNAME
from testbed.real.build import KUBE_VERSION  # the tier's control plane: what the stand-in and the Machines report
from testbed.real.capi import CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND, CONTROL_PLANE_PLURAL
from testbed.real.cloudinit import USER_DATA, Node, boot
from testbed.real.controlplane import ControlPlane
from testbed.real.netns import Network
from testbed.real.slurm import Slurm, SlurmRoot

log = logging.getLogger("slime.testbed.machines")

Obj = dict[str, Any]

INFRA = "infrastructure.cluster.x-k8s.io"
INFRA_V = f"{INFRA}/v1beta1"
CAPI_V = "cluster.x-k8s.io/v1beta2"
BMO_V = "metal3.io/v1alpha1"
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
HOST_ANNOTATION = "metal3.io/BareMetalHost"
M3M_FINALIZER = "metal3machine.infrastructure.cluster.x-k8s.io"
DATA_FINALIZER = "metal3data.infrastructure.cluster.x-k8s.io"
CLAIM_FINALIZER = "metal3dataclaim.infrastructure.cluster.x-k8s.io"
PAUSED_ANNOTATION = "baremetalhost.metal3.io/paused"
UNHEALTHY_ANNOTATIONS = ("capm3.metal3.io/unhealthy", "capi.metal3.io/unhealthy")
PROVIDER_ID_PREFIX = "metal3://"


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class Api:
    """The few calls the simulator makes, as the tier's admin (or impersonating ``as_user``), over one kept-alive
    HTTPS connection."""

    def __init__(self, cp: ControlPlane, as_user: str | None = None) -> None:
        pki = cp.workdir / "pki"
        context = ssl.create_default_context(cafile=str(cp.ca_file))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        headers = {"Impersonate-User": as_user} if as_user else {}
        self.client = httpx.Client(base_url=cp.url, verify=context, timeout=15, headers=headers)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    @staticmethod
    def path(api_version: str, plural: str, namespace: str = "", name: str = "", sub: str = "") -> str:
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def call(self, method: str, path: str, body: Any = None, merge: bool = False) -> Any:
        headers = {"Content-Type": "application/merge-patch+json" if merge else "application/json"}
        with self.lock:
            answer = self.client.request(method, path, json=body, headers=headers)
        if answer.status_code == 404 and method in ("GET", "DELETE"):
            return None
        if answer.status_code >= 300:
            raise ApiError(f"{method} {path}: {answer.status_code} {answer.text[:400]}", answer.status_code)
        return answer.json() if answer.content else None

    def list(self, api_version: str, plural: str, namespace: str = "") -> list[Obj]:
        listed = self.call("GET", self.path(api_version, plural, namespace)) or {}
        items: list[Obj] = listed.get("items") or []
        return items

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> Obj | None:
        found: Obj | None = self.call("GET", self.path(api_version, plural, namespace, name))
        return found

    def create(self, api_version: str, plural: str, namespace: str, obj: Obj) -> Obj:
        created: Obj = self.call("POST", self.path(api_version, plural, namespace), obj)
        return created

    def patch(self, api_version: str, plural: str, namespace: str, name: str, patch: Obj, sub: str = "") -> Obj:
        patched: Obj = self.call("PATCH", self.path(api_version, plural, namespace, name, sub), patch, merge=True)
        return patched

    def delete(self, api_version: str, plural: str, namespace: str, name: str) -> None:
        self.call("DELETE", self.path(api_version, plural, namespace, name))


class ApiError(RuntimeError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def _deleting(obj: Obj) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _owner(obj: Obj, kind: str, group: str) -> Obj | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("kind") == kind and str(ref.get("apiVersion", "")).split("/")[0] == group:
            owner: Obj = ref
            return owner
    return None


def _owner_ref(obj: Obj, controller: bool) -> Obj:
    meta = _meta(obj)
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
    }


def _state(host: Obj) -> str:
    return str(((host.get("status") or {}).get("provisioning") or {}).get("state") or "")


# --- seeding: what an operator and the inspection of hosts put in place ----------------------------


def bare_metal_host(name: str, namespace: str, address: str, labels: dict[str, str] | None = None) -> tuple[Obj, Obj]:
    """A BareMetalHost (spec) and the status BMO reports after registration and inspection (``available``)."""
    mac = "52:54:00:" + ":".join(f"{b:02x}" for b in os.urandom(3))
    spec = {
        "apiVersion": BMO_V,
        "kind": "BareMetalHost",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "online": False,
            "bootMACAddress": mac,
            "bmc": {
                "address": f"redfish-virtualmedia://bmc.invalid/redfish/v1/Systems/{name}",
                "credentialsName": f"{name}-bmc-secret",
            },
        },
    }
    status = {
        "operationalStatus": "OK",
        "errorMessage": "",
        "errorCount": 0,
        "poweredOn": False,
        "provisioning": {"state": "available", "ID": f"ironic-{name}"},
        "hardware": {"hostname": name, "nics": [{"name": "eth0", "mac": mac, "ip": address}]},
    }
    return spec, status


def add_host(api: Api, namespace: str, name: str, address: str, labels: dict[str, str] | None = None) -> Obj:
    """Enroll a host: the BareMetalHost, then its inspected status (as BMO writes it, through ``/status``)."""
    spec, status = bare_metal_host(name, namespace, address, labels)
    api.create(BMO_V, "baremetalhosts", namespace, spec)
    return api.patch(BMO_V, "baremetalhosts", namespace, name, {"status": status}, sub="status")


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


def seed_cluster(api: Api, cp: ControlPlane, spec: ClusterSpec, replicas: int = 0, user_data: Path = USER_DATA) -> None:
    """A Metal3 workload cluster as an operator writes it (complete objects: CAPI's defaulting webhooks are off).

    The workload cluster's kubeconfig Secret points at the tier's own API server; the control plane is
    the ``HostedControlPlane`` stand-in (externally managed, initialized, at the tier's version).
    """
    ns, name = spec.namespace, spec.cluster
    labels = {CLUSTER_LABEL: name}
    api.create(
        "v1",
        "secrets",
        ns,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "cluster.x-k8s.io/secret",
            "metadata": {"name": f"{name}-kubeconfig", "namespace": ns, "labels": labels},
            "data": {"value": b64(cp.kubeconfig.read_bytes())},
        },
    )
    host, port = "127.0.0.1", cp.port
    cp_version = f"{CONTROL_PLANE_GROUP}/v1alpha1"
    api.create(
        cp_version,
        CONTROL_PLANE_PLURAL,
        ns,
        {
            "apiVersion": cp_version,
            "kind": CONTROL_PLANE_KIND,
            "metadata": {"name": f"{name}-control-plane", "namespace": ns, "labels": labels},
            "spec": {"version": KUBE_VERSION, "controlPlaneEndpoint": {"host": host, "port": port}},
        },
    )
    api.patch(
        cp_version,
        CONTROL_PLANE_PLURAL,
        ns,
        f"{name}-control-plane",
        {
            "status": {
                "initialization": {"controlPlaneInitialized": True},
                "initialized": True,
                "ready": True,
                "externalManagedControlPlane": True,
                "version": KUBE_VERSION,
            }
        },
        sub="status",
    )
    api.create(
        INFRA_V,
        "metal3clusters",
        ns,
        {
            "apiVersion": INFRA_V,
            "kind": "Metal3Cluster",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"controlPlaneEndpoint": {"host": host, "port": port}, "cloudProviderEnabled": False},
        },
    )
    api.create(
        CAPI_V,
        "clusters",
        ns,
        {
            "apiVersion": CAPI_V,
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "controlPlaneRef": {
                    "apiGroup": CONTROL_PLANE_GROUP,
                    "kind": CONTROL_PLANE_KIND,
                    "name": f"{name}-control-plane",
                },
                "infrastructureRef": {"apiGroup": INFRA, "kind": "Metal3Cluster", "name": name},
            },
        },
    )
    # The Metal3DataTemplate opts in to SliMe's injection (docs/install.md); names as metal3-dev-env's templates.
    api.create(
        INFRA_V,
        "metal3datatemplates",
        ns,
        {
            "apiVersion": INFRA_V,
            "kind": "Metal3DataTemplate",
            "metadata": {
                "name": spec.data_template,
                "namespace": ns,
                "labels": {**labels, "slurm-controller-namespace": spec.slurm_namespace},
            },
            "spec": {
                "clusterName": name,
                "metaData": {
                    "objectNames": [
                        {"key": "name", "object": "machine"},
                        {"key": "local-hostname", "object": spec.hostname_object},
                    ]
                },
            },
        },
    )
    api.create(
        INFRA_V,
        "metal3machinetemplates",
        ns,
        {
            "apiVersion": INFRA_V,
            "kind": "Metal3MachineTemplate",
            "metadata": {"name": spec.pool, "namespace": ns, "labels": labels},
            "spec": {
                "template": {
                    "spec": {
                        "image": {
                            "url": "http://images.invalid/slurm-worker.qcow2",
                            "checksum": "http://images.invalid/slurm-worker.qcow2.sha256sum",
                            "checksumType": "sha256",
                            "format": "qcow2",
                        },
                        "dataTemplate": {"name": spec.data_template},
                        "hostSelector": {"matchLabels": dict(spec.host_labels)},
                    }
                }
            },
        },
    )
    # Bootstrap data without a bootstrap provider: the documented user-data, named by the MachineDeployment.
    api.create(
        "v1",
        "secrets",
        ns,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "cluster.x-k8s.io/secret",
            "metadata": {"name": spec.user_data_secret, "namespace": ns, "labels": labels},
            "data": {"value": b64(user_data.read_bytes()), "format": b64("cloud-config")},
        },
    )
    selector = {**labels, "cluster.x-k8s.io/deployment-name": spec.pool}
    api.create(
        CAPI_V,
        "machinedeployments",
        ns,
        {
            "apiVersion": CAPI_V,
            "kind": "MachineDeployment",
            "metadata": {"name": spec.pool, "namespace": ns, "labels": labels},
            "spec": {
                "clusterName": name,
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                "rollout": {
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
                },
                "deletion": {"order": "Random"},
                "template": {
                    "metadata": {"labels": selector},
                    "spec": {
                        "clusterName": name,
                        "version": KUBE_VERSION,
                        "bootstrap": {"dataSecretName": spec.user_data_secret},
                        "infrastructureRef": {"apiGroup": INFRA, "kind": "Metal3MachineTemplate", "name": spec.pool},
                    },
                },
            },
        },
    )


# --- the simulator ---------------------------------------------------------------------------------


@dataclass
class Booted:
    """A provisioned host: its BareMetalHost, its Metal3Machine, the booted node."""

    host: str
    metal3machine: str
    node: Node


@dataclass
class MachineSimulator:
    """CAPM3, BMO/Ironic, cloud-init and the kubelet for the Metal3Machines of one namespace (see the module doc)."""

    cp: ControlPlane
    root: SlurmRoot
    network: Network
    workdir: Path
    namespace: str
    slurm: Slurm | None = None  # for the busy-host check at power-off
    provision_seconds: float = 0.5
    deprovision_seconds: float = 1.0
    interval: float = 0.5
    booted: dict[str, Booted] = field(default_factory=dict)  # BareMetalHost name -> booted host
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the last failures of passes (retried, as a requeue)
    events: list[tuple[float, str]] = field(
        default_factory=list
    )  # (monotonic time, what happened), for the tests' timelines
    _since: dict[str, float] = field(default_factory=dict)  # BareMetalHost name -> when it entered its current state
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pass_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.api = Api(self.cp)
        self.capm3 = Api(self.cp, as_user=CAPM3_MANAGER_USERNAME)
        self.nodes_dir = self.workdir / "nodes"
        self.nodes_dir.mkdir(parents=True, exist_ok=True)

    # -- running

    def start(self) -> MachineSimulator:
        self._thread = threading.Thread(target=self._loop, name="machine-simulator", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.step()

    def stop(self) -> None:
        """Stop the loop and power off every host still on (its processes by PID, its namespace)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for booted in list(self.booted.values()):
            self._power_off(booted, check=False)
        self.api.close()
        self.capm3.close()

    def step(self) -> None:
        """One pass over every simulated controller; failures are recorded and retried next pass."""
        with self._pass_lock:
            for name, reconcile in (
                ("metal3clusters", self._clusters),
                ("metal3machines", self._machines),
                ("metal3dataclaims", self._claims),
                ("metal3datas", self._datas),
                ("baremetalhosts", self._hosts),
            ):
                try:
                    reconcile()
                except Exception as exc:  # noqa: BLE001 - a controller logs and requeues
                    message = f"{name}: {type(exc).__name__}: {exc}"
                    self.errors = (self.errors + [message])[-20:]
                    log.info("machine simulator: %s", message)

    def note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))
        log.info("machine simulator: %s", what)

    # -- Metal3Cluster

    def _clusters(self) -> None:
        for m3c in self.api.list(INFRA_V, "metal3clusters", self.namespace):
            if _owner(m3c, "Cluster", "cluster.x-k8s.io") and not (m3c.get("status") or {}).get("ready"):
                self.api.patch(
                    INFRA_V,
                    "metal3clusters",
                    self.namespace,
                    _meta(m3c)["name"],
                    {"status": {"ready": True}},
                    sub="status",
                )
                self.note(f"Metal3Cluster {_meta(m3c)['name']} ready")

    # -- Metal3Machine

    def _machines(self) -> None:
        hosts = self.api.list(BMO_V, "baremetalhosts", self.namespace)
        for m3m in self.api.list(INFRA_V, "metal3machines", self.namespace):
            if _deleting(m3m):
                self._delete_machine(m3m, hosts)
            else:
                self._machine(m3m, hosts)

    def _patch_m3m(self, name: str, patch: Obj, sub: str = "") -> Obj:
        return self.api.patch(INFRA_V, "metal3machines", self.namespace, name, patch, sub=sub)

    def _machine(self, m3m: Obj, hosts: list[Obj]) -> None:
        meta = _meta(m3m)
        name = meta["name"]
        if M3M_FINALIZER not in (meta.get("finalizers") or []):
            m3m = self._patch_m3m(name, {"metadata": {"finalizers": [*(meta.get("finalizers") or []), M3M_FINALIZER]}})
            meta = _meta(m3m)
        owner = _owner(m3m, "Machine", "cluster.x-k8s.io")
        if owner is None:
            return  # CAPI sets it right after creating the Metal3Machine
        machine = self.api.get(CAPI_V, "machines", self.namespace, owner["name"])
        if machine is None:
            return
        cluster = self.api.get(CAPI_V, "clusters", self.namespace, machine["spec"]["clusterName"])
        if not (((cluster or {}).get("status") or {}).get("initialization") or {}).get("infrastructureProvisioned"):
            return
        data_secret = ((machine.get("spec") or {}).get("bootstrap") or {}).get("dataSecretName")
        if not data_secret:
            return
        spec, status = m3m.get("spec") or {}, m3m.get("status") or {}
        template = spec.get("dataTemplate")
        if template and self.api.get(INFRA_V, "metal3dataclaims", self.namespace, name) is None:
            self.api.create(
                INFRA_V,
                "metal3dataclaims",
                self.namespace,
                {
                    "apiVersion": INFRA_V,
                    "kind": "Metal3DataClaim",
                    "metadata": {
                        "name": name,
                        "namespace": self.namespace,
                        "finalizers": [M3M_FINALIZER],
                        "labels": meta.get("labels") or {},
                        "ownerReferences": [_owner_ref(m3m, True)],
                    },
                    "spec": {
                        "template": {"name": template["name"], "namespace": template.get("namespace") or self.namespace}
                    },
                },
            )
        host = self._host_of(m3m, hosts)
        if host is None:
            host = self._choose_host(m3m, hosts)
            if host is None:
                return  # "No available host found. Requeuing." (the Machine stays Provisioning)
            self._associate(m3m, machine, host)
            return
        # The rendered data (metaData Secret) first, then the host gets its image and data.
        metadata_ref = status.get("metaData")
        if template and not metadata_ref:
            claim = self.api.get(INFRA_V, "metal3dataclaims", self.namespace, name) or {}
            rendered = (claim.get("status") or {}).get("renderedData")
            data = self.api.get(INFRA_V, "metal3datas", self.namespace, rendered["name"]) if rendered else None
            if not data or not (data.get("status") or {}).get("ready"):
                return
            metadata_ref = data["spec"]["metaData"]
            self._patch_m3m(
                name,
                {
                    "status": {
                        "renderedData": {"name": _meta(data)["name"], "namespace": self.namespace},
                        "metaData": metadata_ref,
                    }
                },
                sub="status",
            )
        host_spec = host.get("spec") or {}
        if not host_spec.get("image"):
            self.api.patch(
                BMO_V,
                "baremetalhosts",
                self.namespace,
                _meta(host)["name"],
                {
                    "spec": {
                        "image": {
                            "url": spec["image"]["url"],
                            "checksum": spec["image"]["checksum"],
                            "checksumType": spec["image"].get("checksumType") or "",
                            "format": spec["image"].get("format") or "",
                        },
                        "userData": {"name": data_secret, "namespace": self.namespace},
                        **(
                            {"metaData": {"name": metadata_ref["name"], "namespace": self.namespace}}
                            if metadata_ref
                            else {}
                        ),
                        "online": True,
                    }
                },
            )
            self.note(f"BareMetalHost {_meta(host)['name']} gets the image, user-data and metaData of {name}")
            return
        if _state(host) != "provisioned" or (status.get("ready") and spec.get("providerID")):
            return
        provider_id = f"{PROVIDER_ID_PREFIX}{self.namespace}/{_meta(host)['name']}/{name}"
        self._patch_m3m(name, {"spec": {"providerID": provider_id}})
        self._patch_m3m(name, {"status": {"ready": True, "addresses": self._addresses(host)}}, sub="status")
        self.note(f"Metal3Machine {name} provisioned: {provider_id}")

    @staticmethod
    def _addresses(host: Obj) -> list[Obj]:
        """CAPM3's ``nodeAddresses``: each NIC's IP as InternalIP, the hostname as Hostname and InternalDNS."""
        hardware = (host.get("status") or {}).get("hardware") or {}
        addresses = [
            {"type": "InternalIP", "address": nic["ip"]} for nic in hardware.get("nics") or [] if nic.get("ip")
        ]
        if hardware.get("hostname"):
            addresses += [
                {"type": "Hostname", "address": hardware["hostname"]},
                {"type": "InternalDNS", "address": hardware["hostname"]},
            ]
        return addresses

    def _host_of(self, m3m: Obj, hosts: list[Obj]) -> Obj | None:
        key = (_meta(m3m).get("annotations") or {}).get(HOST_ANNOTATION)
        if key:
            return next((h for h in hosts if f"{_meta(h)['namespace']}/{_meta(h)['name']}" == key), None)
        return next((h for h in hosts if self._consumer_is(h, m3m)), None)

    def _consumer_is(self, host: Obj, m3m: Obj) -> bool:
        ref = (host.get("spec") or {}).get("consumerRef") or {}
        return (
            ref.get("kind") == "Metal3Machine"
            and ref.get("name") == _meta(m3m)["name"]
            and (ref.get("namespace") or self.namespace) == self.namespace
            and str(ref.get("apiVersion", "")).startswith(INFRA + "/")
        )

    def _choose_host(self, m3m: Obj, hosts: list[Obj]) -> Obj | None:
        """CAPM3's ``chooseHost`` (matchLabels only; by name instead of at random)."""
        wanted = ((m3m.get("spec") or {}).get("hostSelector") or {}).get("matchLabels") or {}
        for host in sorted(hosts, key=lambda h: str(_meta(h)["name"])):
            meta, spec, status = _meta(host), host.get("spec") or {}, host.get("status") or {}
            annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
            if (
                spec.get("consumerRef")
                or meta.get("deletionTimestamp")
                or status.get("errorMessage")
                or PAUSED_ANNOTATION in annotations
                or any(a in annotations for a in UNHEALTHY_ANNOTATIONS)
                or _state(host) not in ("available", "ready")
                or any(labels.get(k) != v for k, v in wanted.items())
            ):
                continue
            return host
        return None

    def _associate(self, m3m: Obj, machine: Obj, host: Obj) -> None:
        meta, host_meta = _meta(m3m), _meta(host)
        owners = [o for o in host_meta.get("ownerReferences") or [] if o.get("kind") != "Metal3Machine"]
        self.api.patch(
            BMO_V,
            "baremetalhosts",
            self.namespace,
            host_meta["name"],
            {
                "metadata": {
                    "labels": {CLUSTER_LABEL: machine["spec"]["clusterName"]},
                    "ownerReferences": [*owners, _owner_ref(m3m, True)],
                },
                "spec": {
                    "consumerRef": {
                        "apiVersion": INFRA_V,
                        "kind": "Metal3Machine",
                        "name": meta["name"],
                        "namespace": self.namespace,
                    }
                },
            },
        )
        self._patch_m3m(
            meta["name"], {"metadata": {"annotations": {HOST_ANNOTATION: f"{self.namespace}/{host_meta['name']}"}}}
        )
        self._patch_m3m(
            meta["name"],
            {
                "status": {
                    "userData": {"name": machine["spec"]["bootstrap"]["dataSecretName"], "namespace": self.namespace}
                }
            },
            sub="status",
        )
        # The pass's list of hosts is now stale: mark this one taken, so the next Metal3Machine of the pass
        # does not choose it too (CAPM3 serializes Associate with a mutex and reads the hosts again).
        host.setdefault("spec", {})["consumerRef"] = {
            "apiVersion": INFRA_V,
            "kind": "Metal3Machine",
            "name": meta["name"],
            "namespace": self.namespace,
        }
        self.note(f"Metal3Machine {meta['name']} claimed BareMetalHost {host_meta['name']}")

    def _delete_machine(self, m3m: Obj, hosts: list[Obj]) -> None:
        meta = _meta(m3m)
        name = meta["name"]
        host = self._host_of(m3m, hosts)
        if host is not None and self._consumer_is(host, m3m):
            host_name, spec = _meta(host)["name"], host.get("spec") or {}
            if spec.get("image") or spec.get("userData") or spec.get("metaData") or spec.get("online"):
                self.api.patch(
                    BMO_V,
                    "baremetalhosts",
                    self.namespace,
                    host_name,
                    {"spec": {"image": None, "userData": None, "metaData": None, "online": False}},
                )
                self.note(f"Metal3Machine {name} deleting: BareMetalHost {host_name} deprovisioned")
                return
            if _state(host) not in ("available", "ready"):
                return  # "Deprovisioning BareMetalHost, requeuing"
            owners = [o for o in _meta(host).get("ownerReferences") or [] if o.get("kind") != "Metal3Machine"]
            self.api.patch(
                BMO_V,
                "baremetalhosts",
                self.namespace,
                host_name,
                {
                    "metadata": {"ownerReferences": owners, "labels": {CLUSTER_LABEL: None}},
                    "spec": {"consumerRef": None},
                },
            )
            self.note(f"BareMetalHost {host_name} released by {name}")
        claim = self.api.get(INFRA_V, "metal3dataclaims", self.namespace, name)
        if claim is not None:
            finalizers = [f for f in _meta(claim).get("finalizers") or [] if f != M3M_FINALIZER]
            if finalizers != (_meta(claim).get("finalizers") or []):
                self.api.patch(
                    INFRA_V, "metal3dataclaims", self.namespace, name, {"metadata": {"finalizers": finalizers}}
                )
            if not _deleting(claim):
                self.api.delete(INFRA_V, "metal3dataclaims", self.namespace, name)
        finalizers = [f for f in meta.get("finalizers") or [] if f != M3M_FINALIZER]
        self._patch_m3m(name, {"metadata": {"finalizers": finalizers}})
        self.note(f"Metal3Machine {name} gone")

    # -- Metal3DataTemplate (claims) and Metal3Data

    def _claims(self) -> None:
        for claim in self.api.list(INFRA_V, "metal3dataclaims", self.namespace):
            meta = _meta(claim)
            template_name = claim["spec"]["template"]["name"]
            template = self.api.get(INFRA_V, "metal3datatemplates", self.namespace, template_name)
            if template is None:
                continue
            indexes: dict[str, int] = dict((template.get("status") or {}).get("indexes") or {})
            if _deleting(claim):
                index = indexes.pop(meta["name"], None)
                if index is not None:
                    data_name = f"{template_name}-{index}"
                    data = self.api.get(INFRA_V, "metal3datas", self.namespace, data_name)
                    if data is not None:
                        self.api.patch(
                            INFRA_V,
                            "metal3datas",
                            self.namespace,
                            data_name,
                            {
                                "metadata": {
                                    "finalizers": [
                                        f for f in _meta(data).get("finalizers") or [] if f != CLAIM_FINALIZER
                                    ]
                                }
                            },
                        )
                        self.api.delete(INFRA_V, "metal3datas", self.namespace, data_name)
                    self.api.call(
                        "PATCH",
                        self.api.path(INFRA_V, "metal3datatemplates", self.namespace, template_name, "status"),
                        {"status": {"indexes": {meta["name"]: None}}},
                        merge=True,
                    )
                finalizers = [f for f in meta.get("finalizers") or [] if f != CLAIM_FINALIZER]
                self.api.patch(
                    INFRA_V, "metal3dataclaims", self.namespace, meta["name"], {"metadata": {"finalizers": finalizers}}
                )
                continue
            if (claim.get("status") or {}).get("renderedData"):
                continue
            m3m_ref = _owner(claim, "Metal3Machine", INFRA)
            if m3m_ref is None:
                continue
            index = indexes.get(meta["name"])
            if index is None:
                taken = set(indexes.values())
                index = next(i for i in range(len(taken) + 1) if i not in taken)
            data_name = f"{template_name}-{index}"
            if self.api.get(INFRA_V, "metal3datas", self.namespace, data_name) is None:
                self.api.create(
                    INFRA_V,
                    "metal3datas",
                    self.namespace,
                    {
                        "apiVersion": INFRA_V,
                        "kind": "Metal3Data",
                        "metadata": {
                            "name": data_name,
                            "namespace": self.namespace,
                            "finalizers": [CLAIM_FINALIZER],
                            "labels": meta.get("labels") or {},
                            "ownerReferences": [
                                _owner_ref(template, True),
                                _owner_ref(claim, False),
                                {
                                    "apiVersion": INFRA_V,
                                    "kind": "Metal3Machine",
                                    "name": m3m_ref["name"],
                                    "uid": m3m_ref["uid"],
                                },
                            ],
                        },
                        "spec": {
                            "index": index,
                            "template": {"name": template_name, "namespace": self.namespace},
                            "claim": {"name": meta["name"], "namespace": self.namespace},
                        },
                    },
                )
            self.api.patch(
                INFRA_V,
                "metal3datatemplates",
                self.namespace,
                template_name,
                {"status": {"indexes": {meta["name"]: index}}},
                sub="status",
            )
            if CLAIM_FINALIZER not in (meta.get("finalizers") or []):
                self.api.patch(
                    INFRA_V,
                    "metal3dataclaims",
                    self.namespace,
                    meta["name"],
                    {"metadata": {"finalizers": [*(meta.get("finalizers") or []), CLAIM_FINALIZER]}},
                )
            self.api.patch(
                INFRA_V,
                "metal3dataclaims",
                self.namespace,
                meta["name"],
                {"status": {"renderedData": {"name": data_name, "namespace": self.namespace}}},
                sub="status",
            )
            self.note(f"Metal3DataClaim {meta['name']} rendered as Metal3Data {data_name}")

    def _datas(self) -> None:
        for data in self.api.list(INFRA_V, "metal3datas", self.namespace):
            meta = _meta(data)
            if _deleting(data):
                if DATA_FINALIZER in (meta.get("finalizers") or []):
                    self.api.patch(
                        INFRA_V,
                        "metal3datas",
                        self.namespace,
                        meta["name"],
                        {"metadata": {"finalizers": [f for f in meta.get("finalizers") or [] if f != DATA_FINALIZER]}},
                    )
                continue
            if (data.get("status") or {}).get("ready"):
                continue
            if DATA_FINALIZER not in (meta.get("finalizers") or []):
                data = self.api.patch(
                    INFRA_V,
                    "metal3datas",
                    self.namespace,
                    meta["name"],
                    {"metadata": {"finalizers": [*(meta.get("finalizers") or []), DATA_FINALIZER]}},
                )
                meta = _meta(data)
            self._render(data)

    def _render(self, data: Obj) -> None:
        meta = _meta(data)
        template = self.api.get(INFRA_V, "metal3datatemplates", self.namespace, data["spec"]["template"]["name"])
        m3m_ref = _owner(data, "Metal3Machine", INFRA)
        m3m = self.api.get(INFRA_V, "metal3machines", self.namespace, m3m_ref["name"]) if m3m_ref else None
        if template is None or m3m is None:
            return
        host_key = (_meta(m3m).get("annotations") or {}).get(HOST_ANNOTATION)
        machine_ref = _owner(m3m, "Machine", "cluster.x-k8s.io")
        if not host_key or machine_ref is None:
            return  # "Waiting for BareMetalHost to become available"
        host = self.api.get(BMO_V, "baremetalhosts", self.namespace, host_key.split("/", 1)[1])
        machine = self.api.get(CAPI_V, "machines", self.namespace, machine_ref["name"])
        if host is None or machine is None:
            return
        secret_name = f"{_meta(m3m)['name']}-metadata"
        if self.api.get("v1", "secrets", self.namespace, secret_name) is None:
            content = render_meta_data(template, data, m3m, machine, host)
            self.capm3.create(  # as CAPM3's ServiceAccount: only that identity gets the join data
                "v1",
                "secrets",
                self.namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "infrastructure.cluster.x-k8s.io/secret",
                    "metadata": {
                        "name": secret_name,
                        "namespace": self.namespace,
                        "labels": {CLUSTER_LABEL: (_meta(template).get("labels") or {}).get(CLUSTER_LABEL, "")},
                        "ownerReferences": [_owner_ref(data, True)],
                    },
                    "data": {"metaData": b64(yaml.safe_dump(content))},
                },
            )
            self.note(f"Secret {secret_name} created through the API server (admitted by the injection webhook)")
        self.api.patch(
            INFRA_V,
            "metal3datas",
            self.namespace,
            meta["name"],
            {"spec": {"metaData": {"name": secret_name, "namespace": self.namespace}}},
        )
        self.api.patch(INFRA_V, "metal3datas", self.namespace, meta["name"], {"status": {"ready": True}}, sub="status")

    # -- BareMetalHost (BMO + Ironic), cloud-init and the kubelet

    def _hosts(self) -> None:
        now = time.monotonic()
        for host in self.api.list(BMO_V, "baremetalhosts", self.namespace):
            meta, spec = _meta(host), host.get("spec") or {}
            name, state = meta["name"], _state(host)
            since = self._since.setdefault(f"{name}/{state}", now)
            if state in ("available", "ready") and spec.get("consumerRef") and spec.get("image") and spec.get("online"):
                self._set_state(host, "provisioning")
            elif state == "provisioning" and now - since >= self.provision_seconds:
                if not spec.get("image") or not spec.get("online"):
                    self._set_state(host, "deprovisioning")
                    continue
                self._boot(host)
                self._set_state(host, "provisioned", powered_on=True)
            elif state == "provisioned" and (not spec.get("image") or not spec.get("online")):
                booted = self.booted.get(name)
                if booted is not None:
                    self._power_off(booted)
                self._set_state(host, "deprovisioning", powered_on=False)
            elif state == "deprovisioning" and now - since >= self.deprovision_seconds:
                self._set_state(host, "available")

    def _set_state(self, host: Obj, state: str, powered_on: bool | None = None) -> None:
        name = _meta(host)["name"]
        status: Obj = {"provisioning": {"state": state}}
        if powered_on is not None:
            status["poweredOn"] = powered_on
        self.api.patch(BMO_V, "baremetalhosts", self.namespace, name, {"status": status}, sub="status")
        for key in [k for k in self._since if k.startswith(f"{name}/")]:
            del self._since[key]
        self._since[f"{name}/{state}"] = time.monotonic()
        self.note(f"BareMetalHost {name} {state}")

    def _secret_data(self, ref: Obj, key: str) -> bytes:
        secret = self.api.get("v1", "secrets", ref.get("namespace") or self.namespace, ref["name"])
        if secret is None or key not in (secret.get("data") or {}):
            raise ApiError(f"Secret {ref['name']} has no {key}", 404)
        return base64.b64decode(secret["data"][key])

    def _boot(self, host: Obj) -> None:
        """Ironic writes the image and the config drive, the host boots, cloud-init runs, the kubelet registers."""
        meta, spec = _meta(host), host["spec"]
        name = meta["name"]
        user_data = self._secret_data(spec["userData"], "value")
        meta_data: Obj = yaml.safe_load(self._secret_data(spec["metaData"], "metaData"))
        user_data_file = self.nodes_dir / f"{name}-user-data.yaml"
        user_data_file.write_bytes(user_data)
        address = ((host.get("status") or {}).get("hardware") or {}).get("nics", [{}])[0].get("ip")
        node = boot(
            self.root,
            self.network,
            meta_data,
            self.nodes_dir,
            shared=self.slurm.shared if self.slurm else None,
            user_data=user_data_file,
            address=address,
        )
        consumer = spec["consumerRef"]["name"]
        self.booted[name] = Booted(name, consumer, node)
        self.note(f"BareMetalHost {name} booted {node.hostname} at {node.net.address} (netns {node.net.netns})")
        self._register_node(meta_data, node)

    def _register_node(self, meta_data: Obj, node: Node) -> None:
        provider_id = PROVIDER_ID_PREFIX + str(meta_data["providerid"])
        existing = self.api.get("v1", "nodes", "", node.hostname)
        if existing is not None:  # a node of the same name from an earlier life (CAPI deletes it after the Machine)
            self.api.delete("v1", "nodes", "", node.hostname)
        self.api.create(
            "v1",
            "nodes",
            "",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node.hostname,
                    "labels": {"kubernetes.io/hostname": node.hostname, "node.slime.local/simulated": "true"},
                },
                "spec": {"providerID": provider_id},
            },
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.api.patch(
            "v1",
            "nodes",
            "",
            node.hostname,
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "simulated kubelet",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": node.net.address},
                        {"type": "Hostname", "address": node.hostname},
                    ],
                    "nodeInfo": {
                        "kubeletVersion": KUBE_VERSION,
                        "machineID": "",
                        "systemUUID": "",
                        "bootID": "",
                        "kernelVersion": "",
                        "osImage": "Debian GNU/Linux 13 (trixie)",
                        "containerRuntimeVersion": "",
                        "kubeProxyVersion": "",
                        "operatingSystem": "linux",
                        "architecture": "amd64",
                    },
                }
            },
            sub="status",
        )
        self.note(f"Node {node.hostname} registered ({provider_id})")

    def _power_off(self, booted: Booted, check: bool = True) -> None:
        node = booted.node
        if check:
            busy = [command_line(p) for p in node.job_processes()]
            jobs = self._jobs_on(node.hostname)
            if busy or jobs:
                self.violations.append(f"host {booted.host} ({node.hostname}) powered off while it ran {jobs or busy}")
        node.power_off(self.network)
        self.booted.pop(booted.host, None)
        self.note(f"BareMetalHost {booted.host} powered off ({node.hostname} stopped, netns {node.net.netns} removed)")

    def _jobs_on(self, hostname: str) -> list[str]:
        if self.slurm is None:
            return []
        found = []
        with suppress(Exception):
            for job_id, job in self.slurm.jobs().items():
                states = set(job.get("job_state") or [])
                if states & {"RUNNING", "COMPLETING"} and hostname in self.slurm.hostnames(job.get("nodes") or ""):
                    found.append(f"job {job_id} {'+'.join(sorted(states))}")
        return found

    def node_logs(self) -> dict[str, str]:
        """Every booted node's cloud-init output and slurmd log (for the session's secret scan)."""
        logs = {}
        for directory in sorted(p for p in self.nodes_dir.iterdir() if p.is_dir()):
            for path in (directory / "cloud-init-output.log", directory / "log" / "slurmd.log"):
                if path.is_file():
                    logs[f"{directory.name}/{path.name}"] = path.read_text(errors="replace")
        return logs


def render_meta_data(template: Obj, data: Obj, m3m: Obj, machine: Obj, host: Obj) -> dict[str, str]:
    """CAPM3's ``renderMetaData`` for what this tier's templates use: strings, objectNames, namespaces, indexes."""
    spec = (template.get("spec") or {}).get("metaData") or {}
    objects = {"metal3machine": m3m, "machine": machine, "baremetalhost": host}
    content: dict[str, str] = {}
    for entry in spec.get("indexes") or []:
        index = int(data["spec"].get("index") or 0) * int(entry.get("step") or 1) + int(entry.get("offset") or 0)
        content[entry["key"]] = f"{entry.get('prefix', '')}{index}{entry.get('suffix', '')}"
    for entry in spec.get("namespaces") or []:
        content[entry["key"]] = _meta(data)["namespace"]
    for entry in spec.get("objectNames") or []:
        content[entry["key"]] = _meta(objects[entry["object"].lower()])["name"]
    for entry in spec.get("strings") or []:
        content[entry["key"]] = entry["value"]
    unsupported = sorted(k for k in spec if k not in ("indexes", "namespaces", "objectNames", "strings"))
    if unsupported:
        raise ValueError(f"metaData {unsupported} is not simulated here")
    content["providerid"] = f"{_meta(data)['namespace']}/{_meta(host)['name']}/{_meta(m3m)['name']}"
    return content


def command_line(pid: int) -> str:
    """A process's command line (its first 80 characters), or its PID once it is gone: for reports of busy hosts."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return str(pid)


def machine_phase(machine: Obj) -> str:
    return str((machine.get("status") or {}).get("phase") or "")
