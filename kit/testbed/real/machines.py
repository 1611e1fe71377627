"""The metal under real Cluster API, CAPM3 and the baremetal-operator: the tier's hosts, their config drives, their
boots.

CAPI v1.14.2 (:mod:`testbed.real.capi`), CAPM3 v1.13.2 and BMO v0.13.2 in ``--test-mode``
(:mod:`testbed.real.metal3`) run for real: CAPM3 claims a BareMetalHost for each Metal3Machine,
renders the Metal3Data and creates the ``<Metal3Machine>-metadata`` Secret (admitted by the
chart's injection webhook), gives the host its image, user-data and metaData; BMO takes the host
through registering, available, provisioning, provisioned and, on deletion, deprovisioning back to
available. What no controller does on this machine is here:

- :func:`seed_cluster`: the workload cluster as an operator writes it (Cluster, the control plane
  stand-in, Metal3Cluster, Metal3MachineTemplate, an opted-in Metal3DataTemplate, the bootstrap
  user-data Secret, the MachineDeployment), complete objects since no admission webhook of CAPI or
  CAPM3 runs to default them;
- :func:`register_host`: a host enrolled as an operator enrolls one: its BMC credentials Secret
  and a BareMetalHost whose BMC address (``redfish://<host>.bmc.invalid/...``) nothing serves
  (BMO's test mode never dials it), inspection disabled and the hardware details an inspection
  would find (its NIC's address on the test bridge, its name) in BMO's
  ``inspect.metal3.io/hardwaredetails`` annotation;
- :class:`HostBooter`: what Ironic and the machine do. When BMO reports a host ``provisioned``
  with an image, it builds the **config drive** (:func:`config_drive`) from what the
  BareMetalHost references, as BMO's Ironic provisioner (``getConfigDrive``) and Ironic
  (``build_configdrive``) do, and **boots the host** (:func:`testbed.real.host.boot`: real
  cloud-init in a network namespace). When the host is deprovisioned (its image or ``online``
  taken away, its state no longer ``provisioned``, or it is gone) the host is **powered off**: every
  process in its namespace stopped by PID, the namespace removed. Before a power-off it records
  a **violation** if the host still runs a job (a job process in it, or a job Slurm lists there as
  RUNNING or COMPLETING): safe scale-in released a busy node.

**BMO's read of the data Secrets.** BMO's Ironic provisioner reads the user-data, metaData and
network-data Secrets through its secret manager (``hostConfigData`` → ``ObtainSecret``), which
labels each ``environment.metal3.io=baremetal`` with an UPDATE. In ``--test-mode`` its fixture
provisioner never reads them, so :class:`HostBooter` does that read when it builds the drive, with
the same UPDATE, **as BMO's ServiceAccount** (a token of it): the chart's injection webhook sees
BMO's UPDATE of the metaData Secret as it would on a real site, and must admit it unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import json
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

from testbed.errors import ComponentFailed
from testbed.real.build import KUBE_VERSION  # the tier's control plane: what the stand-in and the Machines report
from testbed.real.capi import CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND, CONTROL_PLANE_PLURAL
from testbed.real.cloudinit import USER_DATA
from testbed.real.controlplane import ControlPlane
from testbed.real.host import Host, boot
from testbed.real.metal3 import BMO_MODULE
from testbed.real.netns import Network
from testbed.real.slurm import Slurm, SlurmRoot

log = logging.getLogger("slime.testbed.machines")

Obj = dict[str, Any]

INFRA = "infrastructure.cluster.x-k8s.io"
INFRA_V = f"{INFRA}/v1beta2"  # CAPM3 v1.13's storage version; its CRDs carry the v1beta2 contract label
CAPI_V = "cluster.x-k8s.io/v1beta2"
BMO_V = "metal3.io/v1alpha1"
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
HARDWARE_DETAILS_ANNOTATION = "inspect.metal3.io/hardwaredetails"
# BMO's secret manager (pkg/secretutils): the label it puts on every Secret it reads.
SECRET_ENVIRONMENT_LABEL = ("environment.metal3.io", "baremetal")
DRIVE_VERSIONS = ("2012-08-10", "latest")  # openstacksdk's configdrive.populate_directory
BUSY_STATES = {"RUNNING", "COMPLETING"}
BMO_USER_AGENT = f"baremetal-operator/{BMO_MODULE[1]} (SliMe whole-loop tier: BMO's read of the host's data Secrets)"


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class Api:
    """A few calls to the tier's API server over one kept-alive HTTPS connection: as the admin, as ``as_user``
    (impersonated), or with a bearer ``token`` (a ServiceAccount's own identity)."""

    def __init__(
        self, cp: ControlPlane, as_user: str | None = None, token: str | None = None, user_agent: str = ""
    ) -> None:
        context = ssl.create_default_context(cafile=str(cp.ca_file))
        headers = {"User-Agent": user_agent} if user_agent else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        else:
            pki = cp.workdir / "pki"
            context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
            if as_user:
                headers["Impersonate-User"] = as_user
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

    def replace(self, api_version: str, plural: str, namespace: str, obj: Obj) -> Obj:
        """An UPDATE (PUT) of the whole object, as controller-runtime's ``client.Update`` sends it."""
        name = obj["metadata"]["name"]
        replaced: Obj = self.call("PUT", self.path(api_version, plural, namespace, name), obj)
        return replaced

    def patch(self, api_version: str, plural: str, namespace: str, name: str, patch: Obj, sub: str = "") -> Obj:
        patched: Obj = self.call("PATCH", self.path(api_version, plural, namespace, name, sub), patch, merge=True)
        return patched

    def delete(self, api_version: str, plural: str, namespace: str, name: str) -> None:
        self.call("DELETE", self.path(api_version, plural, namespace, name))


class ApiError(ComponentFailed):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def provisioning_state(host: Obj) -> str:
    return str(((host.get("status") or {}).get("provisioning") or {}).get("state") or "")


# --- what an operator writes ------------------------------------------------------------------------


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


def hardware_details(name: str, mac: str, address: str) -> Obj:
    """What BMO's inspection would report for a host (``status.hardware``): one NIC on the test bridge, its name."""
    return {
        "hostname": name,
        "nics": [{"name": "eth0", "mac": mac, "ip": address, "pxe": True, "speedGbps": 10}],
        "cpu": {"arch": "x86_64", "model": "test bridge host", "count": 2, "clockMegahertz": 2000.0},
        "ramMebibytes": 2048,
        "storage": [{"name": "/dev/vda", "sizeBytes": 64 * 2**30, "rotational": False, "type": "SSD"}],
    }


def register_host(api: Api, namespace: str, name: str, address: str, labels: dict[str, str] | None = None) -> Obj:
    """Enroll a host as an operator does: its BMC credentials Secret and its BareMetalHost (BMO takes it from there)."""
    mac = "52:54:00:" + ":".join(f"{b:02x}" for b in os.urandom(3))
    credentials = f"{name}-bmc-secret"
    api.create(
        "v1",
        "secrets",
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": credentials, "namespace": namespace},
            "data": {"username": b64("admin"), "password": b64(os.urandom(12).hex())},
        },
    )
    return api.create(
        BMO_V,
        "baremetalhosts",
        namespace,
        {
            "apiVersion": BMO_V,
            "kind": "BareMetalHost",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels or {},
                "annotations": {HARDWARE_DETAILS_ANNOTATION: json.dumps(hardware_details(name, mac, address))},
            },
            "spec": {
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
            },
        },
    )


def host_address(host: Obj) -> str:
    """The address of a BareMetalHost's first NIC, from its status (BMO copies it from the annotation)."""
    nics = ((host.get("status") or {}).get("hardware") or {}).get("nics") or []
    return str(nics[0].get("ip") or "") if nics else ""


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
                            "diskFormat": "qcow2",
                        },
                        # No cleaning between uses (BMO's test mode would only wait for it).
                        "automatedCleaningMode": "disabled",
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


# --- the config drive ---------------------------------------------------------------------------


def config_drive(
    target: Path, host: Obj, user_data: bytes | None, meta_data: bytes | None, network_data: bytes | None
) -> Obj:
    """Write the config drive of ``host`` into ``target``, as BMO and Ironic make it; the meta_data written.

    BMO v0.13.2 (``pkg/provisioner/ironic/ironic.go``, ``getConfigDrive``): meta_data starts as
    ``uuid`` (the BareMetalHost's uid), ``metal3-namespace``, ``metal3-name``, ``local-hostname``,
    ``local_hostname`` and ``name`` (its name), and the metaData Secret's YAML is unmarshalled over
    it (its keys win); network_data is the network-data Secret's YAML; user_data is passed as it
    is. Ironic (``conductor/utils.py``, ``build_configdrive``) defaults ``uuid`` and ``name``
    (already set) and has openstacksdk write ``openstack/<version>/meta_data.json``,
    ``user_data`` and ``network_data.json`` for the versions ``2012-08-10`` and ``latest``.
    """
    name, namespace = _meta(host)["name"], _meta(host)["namespace"]
    meta: Obj = {
        "uuid": _meta(host)["uid"],
        "metal3-namespace": namespace,
        "metal3-name": name,
        "local-hostname": name,
        "local_hostname": name,
        "name": name,
    }
    if meta_data:
        loaded = yaml.safe_load(meta_data)
        if not isinstance(loaded, dict):
            raise ValueError(f"the metaData of BareMetalHost {namespace}/{name} is not a YAML map")
        meta.update(loaded)
    network = yaml.safe_load(network_data) if network_data else None
    for version in DRIVE_VERSIONS:
        directory = target / "openstack" / version
        directory.mkdir(parents=True)
        (directory / "meta_data.json").write_text(json.dumps(meta))
        if user_data:
            (directory / "user_data").write_bytes(user_data)
        if network:
            (directory / "network_data.json").write_text(json.dumps(network))
    return meta


# --- Ironic and the machine -----------------------------------------------------------------------


@dataclass
class Booted:
    """A provisioned host that booted: its BareMetalHost, what it was provisioned for, the host."""

    host: str
    consumer: str  # the Metal3Machine in the host's consumerRef
    meta_data_secret: str
    node: Host


@dataclass
class HostBooter:
    """Boots each BareMetalHost of ``namespace`` that BMO reports provisioned, and powers it off when deprovisioned."""

    cp: ControlPlane
    root: SlurmRoot
    network: Network
    workdir: Path
    namespace: str
    bmo_token: str = field(repr=False)  # a token of BMO's ServiceAccount: its reads of the data Secrets
    slurm: Slurm | None = None  # for the busy-host check at power-off
    interval: float = 0.5
    booted: dict[str, Booted] = field(default_factory=dict)  # BareMetalHost name -> booted host
    violations: list[str] = field(default_factory=list)
    # BMO's claims of a data Secret: (Secret name, a digest of its data before the UPDATE, of the data it stored).
    # Digests, never the data: the metaData holds slurm.key.
    claims: list[tuple[str, str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the last failures of passes (retried next pass)
    events: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, what happened)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pass_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.api = Api(self.cp)
        # The field manager of its UPDATEs is "baremetal-operator", as BMO's own client would be named.
        self.bmo = Api(self.cp, token=self.bmo_token, user_agent=BMO_USER_AGENT)
        self.hosts_dir = self.workdir / "hosts"
        self.hosts_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> HostBooter:
        self._thread = threading.Thread(target=self._loop, name="host-booter", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.step()

    def stop(self) -> None:
        """Stop watching and power off every host still on (its processes by PID, its namespace)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for booted in list(self.booted.values()):
            self._power_off(booted, check=False)
        self.api.close()
        self.bmo.close()

    def step(self) -> None:
        """One pass over the BareMetalHosts; a failure is recorded and retried next pass."""
        with self._pass_lock:
            try:
                self._pass()
            except Exception as exc:  # noqa: BLE001 - retried on the next pass, as a requeue would
                message = f"{type(exc).__name__}: {exc}"
                self.errors = (self.errors + [message])[-20:]
                log.info("host booter: %s", message)

    def note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))
        log.info("host booter: %s", what)

    def _pass(self) -> None:
        hosts = {_meta(h)["name"]: h for h in self.api.list(BMO_V, "baremetalhosts", self.namespace)}
        for name, booted in list(self.booted.items()):
            if self._provisioned_for(hosts.get(name)) != (booted.consumer, booted.meta_data_secret):
                self._power_off(booted)
        for name, host in hosts.items():
            wanted = self._provisioned_for(host)
            if wanted is not None and name not in self.booted:
                self._boot(host, *wanted)

    @staticmethod
    def _provisioned_for(host: Obj | None) -> tuple[str, str] | None:
        """(consumer, metaData Secret) when BMO reports the host provisioned with an image and online; else None."""
        if host is None or _meta(host).get("deletionTimestamp") or provisioning_state(host) != "provisioned":
            return None
        spec = host.get("spec") or {}
        if not spec.get("image") or not spec.get("online"):
            return None
        return str((spec.get("consumerRef") or {}).get("name") or ""), str(
            (spec.get("metaData") or {}).get("name") or ""
        )

    def _secret_data(self, ref: Obj | None, key: str) -> bytes | None:
        """BMO's ``hostConfigData.getSecretData``: ``key``, else ``value``; the Secret claimed first as its manager
        does."""
        if not ref:
            return None
        secret = self.bmo.get("v1", "secrets", ref.get("namespace") or self.namespace, ref["name"])
        if secret is None:
            raise ApiError(f"Secret {ref['name']} not found", 404)
        labels = _meta(secret).setdefault("labels", {})
        if SECRET_ENVIRONMENT_LABEL[0] not in labels:  # secretutils.claimSecret: a label, with an Update
            labels[SECRET_ENVIRONMENT_LABEL[0]] = SECRET_ENVIRONMENT_LABEL[1]
            before = data_digest(secret)
            secret = self.bmo.replace("v1", "secrets", _meta(secret)["namespace"], secret)
            self.claims.append((_meta(secret)["name"], before, data_digest(secret)))
        data = secret.get("data") or {}
        encoded = data.get(key, data.get("value"))
        return base64.b64decode(encoded) if encoded is not None else None

    def _boot(self, host: Obj, consumer: str, meta_data_secret: str) -> None:
        """Ironic writes the image and the config drive; the host boots; cloud-init runs."""
        name, spec = _meta(host)["name"], host["spec"]
        user_data = self._secret_data(spec.get("userData"), "userData")
        meta_data = self._secret_data(spec.get("metaData"), "metaData")
        network_data = self._secret_data(spec.get("networkData"), "networkData")
        directory = self.hosts_dir / f"{name}.{len(list(self.hosts_dir.glob(f'{name}.*'))) + 1}"  # one per boot
        drive = directory / "config-drive"
        meta = config_drive(drive, host, user_data, meta_data, network_data)
        node = boot(
            self.root,
            self.network,
            drive,
            str(meta["local-hostname"]),
            directory,
            host_address(host),
            self.slurm.shared if self.slurm else directory / "shared",
        )
        self.booted[name] = Booted(name, consumer, meta_data_secret, node)
        self.note(f"BareMetalHost {name} booted as {node.hostname} at {node.net.address} (netns {node.net.netns})")

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
                if states & BUSY_STATES and hostname in self.slurm.hostnames(job.get("nodes") or ""):
                    found.append(f"job {job_id} {'+'.join(sorted(states))}")
        return found

    def node(self, hostname: str) -> Host | None:
        """The booted host whose host name (Slurm node name) is ``hostname``."""
        return next((b.node for b in self.booted.values() if b.node.hostname == hostname), None)

    def node_logs(self) -> dict[str, str]:
        """Every boot's cloud-init, boot and slurmd logs, powered off or not (for diagnostics and the secret scan)."""
        found = {}
        for directory in sorted(p for p in self.hosts_dir.iterdir() if p.is_dir()):
            for name, path in (
                ("boot.log", directory / "boot.log"),
                ("cloud-init.log", directory / "disk/var/log/cloud-init.log"),
                ("cloud-init-output.log", directory / "disk/var/log/cloud-init-output.log"),
                ("slurmd.log", directory / "log/slurmd.log"),
            ):
                if path.is_file():
                    found[f"{directory.name}/{name}"] = path.read_text(errors="replace")
        return found


def data_digest(secret: Obj) -> str:
    """A SHA-256 of a Secret's ``data`` (to compare two versions without holding or showing their content)."""
    return hashlib.sha256(json.dumps(secret.get("data") or {}, sort_keys=True).encode()).hexdigest()


def command_line(pid: int) -> str:
    """A process's command line (its first 80 characters), or its PID once it is gone: for reports of busy hosts."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return str(pid)
