"""Real Slurm from Debian: slurmctld and slurmrestd in a cached root (:mod:`testbed.components.debian_root`).

:class:`Slurm` writes a ``slurm.conf`` shaped like the one Slinky's operator writes (configless,
``auth/slurm`` with ``auth/jwt`` as the alternative, ``use_client_ids``, ``cred/slurm``,
``MaxNodeCount`` for dynamic nodes, one partition over all nodes), plus ``slurm.key`` and
``jwt_hs256.key`` (made by :func:`testbed.framework.world.make_slurm_key`, so the session's secret
scan knows them). It starts slurmctld on the host side of a bridge (nodes dial
``SlurmctldHost=<hostname>(<address>)``) in a UTS namespace of its own, and slurmrestd on
127.0.0.1 as ``nobody`` with ``SLURM_JWT=daemon``, ``-a rest_auth/jwt -s openapi/slurmctld``, as
Slinky's restapi runs it. Every process runs ``chroot``-ed into the shared root in a private mount
namespace with its own ``/etc/slurm``, ``/run``, spool and log directories. Processes are stopped
by PID, never by name.

``slime-slurm`` (:mod:`testbed.scenarios.slurm_cli`) starts the same Slurm for a person.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt

from testbed.components.debian_root import Bind, SlurmRoot, chroot_argv
from testbed.framework.errors import ComponentFailed
from testbed.framework.ports import free_port
from testbed.framework.processes import spawn, stop_process, stop_tree, wait_started
from testbed.framework.world import make_slurm_key


class SlurmFailed(ComponentFailed):
    """A Slurm step ran and failed; the message ends with the last lines of its log."""


EPILOG = """#!/bin/sh
# The tests hold a job in COMPLETING on purpose: while /srv/slime/hold-epilog-<job id> exists
# (at most 120 s), this epilog waits.
i=0
while [ -e "/srv/slime/hold-epilog-$SLURM_JOB_ID" ] && [ "$i" -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
exit 0
"""


@dataclass(frozen=True)
class SlurmConfig:
    """What the cluster's ``slurm.conf`` says; the rest is Slinky's shape.

    ``dns_names``: Slinky >= 1.3's shape. slurmctld is named by cluster DNS
    (``SlurmctldHost=<pod>.<statefulset>-internal.<namespace>``, ``SlurmctldAddr=<statefulset>.<namespace>``),
    names a bare-metal node resolves only through the ``/etc/hosts`` lines the injection webhook gives
    it; and each of ``nodesets`` is a ``NodeSet=<name> Feature=<name>`` with a partition of the same
    name over it. Without: Slinky < 1.3's ``SlurmctldHost=<pod>(<address>)``.
    """

    address: str  # what nodes and clients dial
    port: int  # SlurmctldPort
    hostname: str = "slurm-controller-0"  # slurmctld's pod name in Slinky
    cluster: str = "slime"
    partition: str = "metal"
    slurmd_timeout: int = 10  # Slinky keeps the default 300; short here so a dead node shows in seconds
    epilog: bool = True
    dns_names: bool = False
    namespace: str = "slurm"  # the Controller's namespace (for the DNS names)
    statefulset: str = "slurm-controller"  # the slurmctld StatefulSet: <controller>-controller
    nodesets: tuple[str, ...] = ()

    @classmethod
    def slinky(cls, root: SlurmRoot, address: str, port: int, **extra: Any) -> SlurmConfig:
        """The shape Slinky gives ``root``'s Slurm: v1.3's (DNS names) for Slurm >= 25.11, which v1.3
        needs; the shape of 1.0-1.2 for older Slurm."""
        return cls(address=address, port=port, dns_names=root.series >= "25.11", **extra)

    @property
    def host_name(self) -> str:
        """slurmctld's host name, which must equal its ``SlurmctldHost`` name for it to start."""
        return f"{self.hostname}.{self.statefulset}-internal.{self.namespace}" if self.dns_names else self.hostname

    @property
    def service_name(self) -> str:
        return f"{self.statefulset}.{self.namespace}"


def slurm_conf(config: SlurmConfig) -> str:
    """A ``slurm.conf`` shaped like the one Slinky's operator writes, for bare-metal dynamic nodes."""
    lines = [
        "# Written by testbed/components/slurm.py, after the slurm.conf of SchedMD's Slinky slurm-operator.",
        f"ClusterName={config.cluster}",
        "SlurmUser=slurm",
        *(
            [f"SlurmctldHost={config.host_name}", f"SlurmctldAddr={config.service_name}"]
            if config.dns_names
            else [f"SlurmctldHost={config.hostname}({config.address})"]
        ),
        f"SlurmctldPort={config.port}",
        "SlurmdPort=6818",
        "SlurmdUser=root",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "# Dynamic nodes (slurmd -Z) need room for them.",
        "MaxNodeCount=1024",
        "AuthType=auth/slurm",
        "CredType=cred/slurm",
        "AuthAltTypes=auth/jwt",
        "AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key",
        "AuthInfo=use_client_ids",
        "SlurmctldParameters=enable_configless,reconfig_on_restart",
        "# No systemd, no cgroup delegation in a chroot: Linux process tracking, no task containment.",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        f"SlurmdTimeout={config.slurmd_timeout}",
        "# Finished jobs stay listed for an hour: the tests read their final state.",
        "MinJobAge=3600",
        "ReturnToService=0",
        "LogTimeFormat=iso8601_ms,format_stderr",
        "MailProg=/bin/true",
    ]
    if config.epilog:
        lines.append("# A relative name: shipped to the nodes with the configuration (configless).")
        lines.append("Epilog=epilog.sh")
    for nodeset in config.nodesets:
        lines.append(f"NodeSet={nodeset} Feature={nodeset}")
    lines.append(f"PartitionName={config.partition} Nodes=ALL Default=YES MaxTime=UNLIMITED State=UP")
    for nodeset in config.nodesets:
        lines.append(f"PartitionName={nodeset} Nodes={nodeset} MaxTime=UNLIMITED State=UP")
    return "\n".join(lines) + "\n"


def _write_secret(path: Path, data: bytes, uid: int = 0, gid: int = 0) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chown(path, uid, gid)


@dataclass
class Slurm:
    """slurmctld and slurmrestd in ``root``, with their files under ``workdir``. A context manager."""

    root: SlurmRoot
    workdir: Path
    config: SlurmConfig
    slurm_key: bytes = field(default_factory=make_slurm_key, repr=False)
    jwt_key: bytes = field(default_factory=make_slurm_key, repr=False)
    restd_port: int = field(default_factory=free_port)
    ctld: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    restd: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.etc, self.state, self.run = self.workdir / "etc", self.workdir / "state", self.workdir / "run"
        self.log, self.shared, self.tmp = self.workdir / "log", self.workdir / "shared", self.workdir / "tmp"

    def __repr__(self) -> str:  # never the keys
        return (
            f"Slurm({self.config.hostname}({self.config.address}):{self.config.port}, restd "
            f"127.0.0.1:{self.restd_port})"
        )

    def __enter__(self) -> Slurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def conf_server(self) -> str:
        """What a node's ``slurmd -Z --conf-server`` names (the injected ``slurm_conf_server``)."""
        return f"{self.config.address}:{self.config.port}"

    @property
    def hosts_line(self) -> str:
        """What a node needs in /etc/hosts to reach slurmctld by every name its slurm.conf gives it."""
        names = dict.fromkeys([self.config.host_name, self.config.hostname, self.config.service_name])
        return f"{self.config.address} {' '.join(names)}\n"

    @property
    def restd_url(self) -> str:
        return f"http://127.0.0.1:{self.restd_port}"

    def binds(self) -> list[Bind]:
        """The controller side's own directories, mounted over the root's."""
        return [
            Bind(self.etc, "/etc/slurm"),
            Bind(self.state, "/var/spool/slurmctld"),
            Bind(self.run, "/run"),
            Bind(self.log, "/var/log/slurm"),
            Bind(self.shared, "/srv/slime"),
            Bind(self.tmp, "/tmp"),
            Bind(self.workdir / "hosts", "/etc/hosts"),
        ]

    # --- lifecycle ---------------------------------------------------------------------------

    def write_files(self) -> None:
        for directory in (self.etc, self.state, self.run, self.log, self.shared, self.tmp):
            directory.mkdir(parents=True, exist_ok=True)
        uid, gid = self.root.slurm_uid, self.root.slurm_gid
        os.chown(self.state, uid, gid)
        self.tmp.chmod(0o1777)
        self.shared.chmod(0o755)
        # As in a pod: the controller's own name resolves to its address. slurmctld looks up the host
        # name of every srun it answers (the clients here run under the controller's name); with no
        # DNS, an unknown name costs 10 s of retries.
        (self.workdir / "hosts").write_text(f"127.0.0.1 localhost\n{self.hosts_line}")
        (self.etc / "slurm.conf").write_text(slurm_conf(self.config))
        (self.etc / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        (self.etc / "plugstack.conf").write_text("")  # Debian's ships a glob Include Slurm cannot parse
        if self.config.epilog:
            (self.etc / "epilog.sh").write_text(EPILOG)
            (self.etc / "epilog.sh").chmod(0o755)
        _write_secret(self.etc / "slurm.key", self.slurm_key, uid, gid)
        _write_secret(self.etc / "jwt_hs256.key", self.jwt_key, uid, gid)

    def start(self) -> Slurm:
        self.write_files()
        try:
            self.start_controller()
            self.start_restd()
        except BaseException:
            self.close()
            raise
        return self

    def start_controller(self, timeout: float | str = "process-start") -> None:
        argv = chroot_argv(self.root.path, ["slurmctld", "-D", "-i"], self.binds(), hostname=self.config.host_name)
        log = self.log / "slurmctld.log"
        self.ctld = spawn(argv, log)
        wait_started(
            self.ctld,
            lambda: "UP" in self.client(["scontrol", "ping"], check=False, timeout=10).stdout,
            timeout,
            "slurmctld (scontrol ping)",
            log,
        )

    def start_restd(self, timeout: float | str = "process-start") -> None:
        env = {"SLURM_JWT": "daemon", "SLURMRESTD_SECURITY": "disable_unshare_files,disable_unshare_sysv"}
        # Unprivileged, as slurmrestd must be; by number, since Slurm 26.05 no longer resolves the
        # name "nobody" (fatal "Unable to resolve user: nobody") while 24.11 does.
        restd = ["slurmrestd", "-u", "65534", "-g", "65534", "-a", "rest_auth/jwt", "-s", "openapi/slurmctld"]
        argv = chroot_argv(self.root.path, [*restd, f"127.0.0.1:{self.restd_port}"], self.binds(), env=env)
        log = self.log / "slurmrestd.log"
        self.restd = spawn(argv, log)
        wait_started(self.restd, self._restd_listens, timeout, "slurmrestd (listening)", log)

    def _restd_listens(self) -> bool:
        with socket.socket() as probe:
            probe.settimeout(0.2)
            return probe.connect_ex(("127.0.0.1", self.restd_port)) == 0

    def stop_restd(self) -> None:
        if self.restd is not None:
            stop_tree(self.restd.pid)
            stop_process(self.restd, 10)
            self.restd = None

    def stop_controller(self) -> None:
        if self.ctld is not None:
            stop_tree(self.ctld.pid)
            stop_process(self.ctld, 15)
            self.ctld = None

    def close(self) -> None:
        self.stop_restd()
        self.stop_controller()

    # --- clients -----------------------------------------------------------------------------

    def client(
        self, argv: Sequence[str], check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm command (scontrol, sbatch, srun, squeue, ...) as root on the controller's host (its name, its
        files)."""
        command = chroot_argv(self.root.path, argv, self.binds(), hostname=self.config.host_name)
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise SlurmFailed(f"{' '.join(argv)} failed (exit {result.returncode}): {result.stderr.strip()[-800:]}")
        return result

    def scontrol(self, *args: str) -> str:
        return self.client(["scontrol", *args]).stdout

    def sbatch(self, *args: str) -> int:
        """Submit a batch job (output to /dev/null); its id."""
        out = self.client(["sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp", *args]).stdout.strip()
        return int(out.split(";")[0])

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Every node slurmctld knows, as ``scontrol --json show nodes`` gives it (v0.0.42 shapes), by name."""
        data = json.loads(self.client(["scontrol", "--json", "show", "nodes"]).stdout)
        return {n["name"]: n for n in data.get("nodes") or []}

    def node_states(self) -> dict[str, set[str]]:
        return {name: set(node.get("state") or []) for name, node in self.nodes().items()}

    def jobs(self) -> dict[int, dict[str, Any]]:
        data = json.loads(self.client(["scontrol", "--json", "show", "jobs"]).stdout)
        return {int(j["job_id"]): j for j in data.get("jobs") or []}

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a Slurm hostlist (``md-[1-3]``)."""
        if not hostlist:
            return []
        return self.client(["scontrol", "show", "hostnames", hostlist]).stdout.split()

    # --- REST --------------------------------------------------------------------------------

    def token(self, user: str = "slurm", lifetime: int = 60, key: bytes | None = None) -> str:
        """An HS256 JWT as Slinky (and SliMe) sign it: ``sun``, ``iat``, ``exp``."""
        now = int(time.time())
        return jwt.encode(
            {"sun": user, "iat": now, "exp": now + lifetime},
            key if key is not None else self.jwt_key,
            algorithm="HS256",
        )

    def rest(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = "good",
        timeout: float = 15.0,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One request to slurmrestd; ``token="good"`` signs a fresh one, None sends none."""
        sent = dict(headers or {})
        if token is not None:
            sent["X-SLURM-USER-TOKEN"] = self.token() if token == "good" else token
        return httpx.request(method, f"{self.restd_url}{path}", json=body, headers=sent, timeout=timeout)

    def logs(self) -> dict[str, str]:
        """The daemons' log files (they never hold a key; the tests hand them to the session's secret scan)."""
        return {path.name: path.read_text(errors="replace") for path in sorted(self.log.glob("*.log"))}
