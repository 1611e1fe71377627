"""What Ironic and the machine do under the baremetal-operator's test mode: config drives, boots and power-offs.

CAPI v1.14.2 (:mod:`testbed.components.capi`), CAPM3 v1.13.2 and BMO v0.13.2 in ``--test-mode``
(:mod:`testbed.components.metal3`) run for real: CAPM3 claims a BareMetalHost for each Metal3Machine,
renders the Metal3Data and creates the ``<Metal3Machine>-metadata`` Secret (admitted by the
chart's injection webhook), gives the host its image, user-data and metaData; BMO takes the host
through registering, available, provisioning, provisioned and, on deletion, deprovisioning back to
available. What no controller does on this machine is :class:`HostBooter`'s: when BMO reports a
host ``provisioned`` with an image, it builds the **config drive** (:func:`config_drive`) from what
the BareMetalHost references, as BMO's Ironic provisioner (``getConfigDrive``) and Ironic
(``build_configdrive``) do, and **boots the host** (:func:`testbed.components.host.boot`: real
cloud-init in a network namespace). When the host is deprovisioned (its image or ``online`` taken
away, its state no longer ``provisioned``, or it is gone) the host is **powered off**: every
process in its namespace stopped by PID, the namespace removed. Before a power-off it records a
**violation** if the host still runs a job (a job process in it, or a job Slurm lists there as
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
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.components.controlplane import ControlPlane
from testbed.components.debian_root import SlurmRoot
from testbed.components.host import Host, boot
from testbed.components.netns import Network
from testbed.components.slurm import Slurm
from testbed.framework.errors import ComponentFailed
from testbed.framework.pins import BMO
from testbed.framework.processes import command_line

log = logging.getLogger("slime.testbed.ironic")

Obj = dict[str, Any]

BMO_V = "metal3.io/v1alpha1"
# BMO's secret manager (pkg/secretutils): the label it puts on every Secret it reads.
SECRET_ENVIRONMENT_LABEL = ("environment.metal3.io", "baremetal")
DRIVE_VERSIONS = ("2012-08-10", "latest")  # openstacksdk's configdrive.populate_directory
BUSY_STATES = {"RUNNING", "COMPLETING"}
BMO_USER_AGENT = f"baremetal-operator/{BMO.version} (SliMe whole-loop tier: BMO's read of the host's data Secrets)"


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def provisioning_state(host: Obj) -> str:
    return str(((host.get("status") or {}).get("provisioning") or {}).get("state") or "")


def host_address(host: Obj) -> str:
    """The address of a BareMetalHost's first NIC, from its status (BMO copies it from the annotation)."""
    nics = ((host.get("status") or {}).get("hardware") or {}).get("nics") or []
    return str(nics[0].get("ip") or "") if nics else ""


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
        self.api = self.cp.client()
        # The field manager of its UPDATEs is "baremetal-operator", as BMO's own client would be named.
        self.bmo = self.api.with_token(self.bmo_token, user_agent=BMO_USER_AGENT)
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
            raise ComponentFailed(f"Secret {ref['name']} not found")
        labels = _meta(secret).setdefault("labels", {})
        if SECRET_ENVIRONMENT_LABEL[0] not in labels:  # secretutils.claimSecret: a label, with an Update
            labels[SECRET_ENVIRONMENT_LABEL[0]] = SECRET_ENVIRONMENT_LABEL[1]
            before = data_digest(secret)
            secret = self.bmo.update(secret)
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
