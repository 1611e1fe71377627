"""Real Slurm from Debian: 26.05 (forky, Slinky v1.3's default) or 24.11 (trixie); a cached root, and a
controller with slurmrestd per test.

**The root.** :func:`prepare_root` makes a Debian root for a :class:`Release` (:data:`SLURM_26_05`
from forky, the default; :data:`SLURM_24_11` from trixie) once with ``debootstrap
--variant=minbase`` from Debian's registry and installs :data:`PACKAGES` into it with apt-get. It
is cached outside the repository (``$SLIME_REAL_CACHE``, else ``~/.cache/slime/real``), in a
directory named after a hash of the suite, the mirror, the package list and :data:`RECIPE`, so a
change of any of them builds a new one. The host's debootstrap has no forky script: sid's is
used, and forky's Release file, past its Valid-Until date on the mirror, is accepted. Nothing of the host's own
packages changes, except that
``debootstrap`` is installed on the host when it is missing. Name resolution is switched off in
the root once the packages are in (``hosts: files``, ``nameserver 127.0.0.1``): the daemons must
never look a name up on a real DNS server, and they need none (nodes register by address).

**Running in it.** Every Slurm process runs ``chroot``-ed into that shared root, in a private
mount namespace (:func:`chroot_argv`) where its own directories are bind-mounted over
``/etc/slurm``, ``/run``, the spool and log directories. The root itself is never written
after it is made, so tests (and two test sessions) can share it; the mounts vanish with the
processes. Processes are stopped by PID, never by name.

**A cluster.** :class:`Slurm` writes a ``slurm.conf`` shaped like the one Slinky's operator
writes (configless, ``auth/slurm`` with ``auth/jwt`` as the alternative, ``use_client_ids``,
``cred/slurm``, ``MaxNodeCount`` for dynamic nodes, one partition over all nodes), plus
``slurm.key`` and ``jwt_hs256.key`` (1024 random printable characters each, as Slinky's Helm
chart makes them; made by :func:`testbed.world.make_slurm_key`, so the session's secret scan
knows them). It starts slurmctld on the host side of a bridge (nodes dial
``SlurmctldHost=<hostname>(<address>)``) in a UTS namespace of its own, and slurmrestd on
127.0.0.1 as ``nobody`` with ``SLURM_JWT=daemon``, ``-a rest_auth/jwt -s openapi/slurmctld``, as
Slinky's restapi runs it.

``slime-slurm`` (:mod:`testbed.real.slurm_cli`) starts the same Slurm for a person.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt

from testbed.errors import ComponentFailed, ComponentUnavailable
from testbed.ports import free_port
from testbed.real.build import cache_root
from testbed.world import make_slurm_key

MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("slurmctld", "slurmd", "slurmrestd", "slurm-client", "slurm-wlm-jwt-plugin")
# Bump when the preparation of the root changes: the cached root is then made anew.
RECIPE = 1
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_TOOLS = ("ip", "unshare", "chroot", "mount", "nsenter")
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROGRESS_SECONDS = 20.0


@dataclass(frozen=True)
class Release:
    """A Slurm release as Debian packages it: the suite, the series, the newest data parser it serves."""

    suite: str
    series: str
    api_version: str  # the newest slurmrestd data parser of the series
    debootstrap_script: str = ""  # "" : the suite's own
    apt_options: tuple[str, ...] = ()


SLURM_26_05 = Release(
    "forky",
    "26.05",
    "v0.0.45",  # 26.05 serves v0.0.42 to v0.0.45
    "/usr/share/debootstrap/scripts/sid",
    ("-o", "Acquire::Check-Valid-Until=false"),
)
SLURM_24_11 = Release("trixie", "24.11", "v0.0.42")  # 24.11 serves v0.0.40 to v0.0.42
RELEASES = {r.series: r for r in (SLURM_26_05, SLURM_24_11)}
DEFAULT_RELEASE = SLURM_26_05  # Slinky v1.3's chart default (it needs Slurm >= 25.11)

Progress = Callable[[str], None]


def to_stderr(line: str) -> None:
    """Progress lines go to the real stderr, even under pytest's capture."""
    print(f"[slime real slurm] {line}", file=sys.__stderr__, flush=True)


class Unavailable(ComponentUnavailable):
    """A prerequisite is missing (not root, no ``ip``/``unshare``, no way to get debootstrap): skip, or fail under
    CI."""


class SlurmFailed(ComponentFailed):
    """A Slurm step ran and failed; the message ends with the last lines of its log."""


# --- the root ------------------------------------------------------------------------------------


def root_name(release: Release, packages: tuple[str, ...] = PACKAGES) -> str:
    digest = hashlib.sha256(json.dumps([release.suite, MIRROR, sorted(packages), RECIPE]).encode()).hexdigest()[:12]
    return f"slurm-{release.suite}-{release.series}-{digest}"


@dataclass(frozen=True)
class SlurmRoot:
    """A prepared root: where it is, the Slurm release in it, and its ``slurm`` user's ids."""

    path: Path
    release: str  # the installed Slurm version, e.g. 26.05.5
    slurm_uid: int
    slurm_gid: int
    series: str = DEFAULT_RELEASE.series

    @classmethod
    def load(cls, path: Path) -> SlurmRoot:
        ready = json.loads((path / ".slime-ready.json").read_text())
        release = str(ready["release"])
        return cls(path, release, int(ready["slurm_uid"]), int(ready["slurm_gid"]), ".".join(release.split(".")[:2]))

    @property
    def api_version(self) -> str:
        """The newest slurmrestd data parser this root's Slurm serves."""
        return RELEASES[self.series].api_version


def check_host(progress: Progress = to_stderr) -> None:
    """Raise :class:`Unavailable` unless this host can run the tier; install debootstrap if it is missing."""
    if os.geteuid() != 0:
        raise Unavailable("real Slurm needs root here (chroot, mount and network namespaces); run as root")
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if missing:
        raise Unavailable(f"missing host tools: {', '.join(missing)} (iproute2, util-linux, coreutils)")
    if shutil.which("debootstrap") is None:
        progress("installing debootstrap on the host (apt-get)")
        _apt_host_install("debootstrap")
        if shutil.which("debootstrap") is None:
            raise Unavailable("debootstrap is not installed and apt-get could not install it")


def _apt_host_install(*packages: str) -> None:
    """``apt-get install`` on the host, waiting for a lock another apt holds; ``apt-get update`` once if the lists
    lack them."""
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "--no-install-recommends", *packages]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, capture_output=True, text=True, timeout=900, env=env).returncode == 0:
        return
    for _ in range(60):  # apt-get update has no lock timeout of its own: retry while another apt runs
        update = subprocess.run(
            ["apt-get", "-o", "DPkg::Lock::Timeout=600", "update"], capture_output=True, text=True, timeout=900, env=env
        )
        if update.returncode == 0 or "lock" not in update.stderr.lower():
            break
        time.sleep(5)
    result = subprocess.run(install, capture_output=True, text=True, timeout=900, env=env)
    if result.returncode != 0:
        raise Unavailable(f"apt-get install {' '.join(packages)} failed: {result.stderr.strip()[-500:]}")


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """One builder per cache entry across processes (two sessions may start at once)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(prefix) or target == prefix[:-1]:
            found.append(target)
    return found


def _remove_tree(path: Path) -> None:
    """Remove a root that was left half made; refuse if anything is still mounted in it."""
    mounted = _mounts_under(path)
    if mounted:
        raise SlurmFailed(f"{path} has mounts ({', '.join(mounted[:3])}); unmount them before it can be made anew")
    shutil.rmtree(path)


def _run_logged(
    cmd: list[str], log: Path, what: str, timeout: float, progress: Progress, env: Mapping[str, str] | None = None
) -> None:
    """Run ``cmd`` with its output in ``log``; a progress line every PROGRESS_SECONDS; SlurmFailed with the log's
    tail."""
    started = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(env) if env else None
        )
        while True:
            try:
                code = proc.wait(timeout=PROGRESS_SECONDS)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > timeout:
                    proc.kill()
                    proc.wait(10)
                    raise SlurmFailed(f"{what} took more than {timeout:g} s; log {log}:\n{_tail(log)}") from None
                progress(f"{what}: {elapsed:.0f} s")
    if code != 0:
        raise SlurmFailed(f"{what} failed (exit {code}); log {log}:\n{_tail(log)}")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def prepare_root(
    progress: Progress = to_stderr, release: Release = DEFAULT_RELEASE, extra_packages: tuple[str, ...] = ()
) -> SlurmRoot:
    """The cached root with Slurm ``release`` (and ``extra_packages``), made on first use (about a minute:
    debootstrap, then apt-get)."""
    check_host(progress)
    packages = (*PACKAGES, *extra_packages)
    final = cache_root() / root_name(release, packages)
    if (final / ".slime-ready.json").is_file():
        return SlurmRoot.load(final)
    with _locked(final.name):
        if (final / ".slime-ready.json").is_file():
            return SlurmRoot.load(final)
        partial = final.with_name(final.name + ".partial")
        for leftover in (partial, final):
            if leftover.exists():
                _remove_tree(leftover)
        partial.mkdir(parents=True)
        log = cache_root() / f"{final.name}.log"
        log.write_text("")
        started = time.monotonic()
        progress(
            f"making the Debian {release.suite} root once (debootstrap --variant=minbase from {MIRROR}); log {log}"
        )
        # In a mount namespace of its own: the /proc and /sys debootstrap mounts vanish with it, even if it is killed.
        _run_logged(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "debootstrap",
                "--variant=minbase",
                release.suite,
                str(partial),
                MIRROR,
                *([release.debootstrap_script] if release.debootstrap_script else []),
            ],
            log,
            "debootstrap",
            600,
            progress,
        )
        progress(f"debootstrap done in {time.monotonic() - started:.0f} s; installing {' '.join(packages)}")
        certs = partial / "etc/ssl/certs"
        certs.mkdir(parents=True, exist_ok=True)
        if HOST_CA_BUNDLE.is_file():
            shutil.copy2(HOST_CA_BUNDLE, certs / "ca-certificates.crt")
        policy = partial / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\n# no daemon starts while packages install\nexit 101\n")
        policy.chmod(0o755)
        options = " ".join(release.apt_options)
        install = (
            f"apt-get {options} update && apt-get install -y --no-install-recommends "
            + " ".join(packages)
            + " && apt-get clean"
        )
        _run_logged(
            chroot_argv(partial, ["sh", "-c", install], env={"DEBIAN_FRONTEND": "noninteractive"}),
            log,
            "apt-get install in the root",
            600,
            progress,
        )
        _no_dns(partial)
        for directory in (
            "var/lib/cloud",
            "var/spool/slurmctld",
            "var/spool/slurmd",
            "var/log/slurm",
            "srv/slime",
            "etc/slurm",
        ):
            (partial / directory).mkdir(parents=True, exist_ok=True)
        for lists in (partial / "var/lib/apt/lists").glob("*_*"):
            lists.unlink()
        version = subprocess.run(chroot_argv(partial, ["slurmctld", "-V"]), capture_output=True, text=True, timeout=60)
        installed = version.stdout.strip().split()[-1] if version.stdout.strip() else ""
        if not installed.startswith(release.series):
            raise SlurmFailed(
                f"the root has Slurm {installed or '?'} ({version.stderr.strip()[-300:]}), expected {release.series}"
            )
        uid, gid = _user_ids(partial, "slurm")
        (partial / ".slime-ready.json").write_text(
            json.dumps(
                {
                    "release": installed,
                    "slurm_uid": uid,
                    "slurm_gid": gid,
                    "suite": release.suite,
                    "mirror": MIRROR,
                    "packages": list(packages),
                    "recipe": RECIPE,
                    "seconds": round(time.monotonic() - started, 1),
                }
            )
        )
        partial.rename(final)
        progress(f"root ready in {time.monotonic() - started:.0f} s: Slurm {installed} at {final}")
        return SlurmRoot.load(final)


def _no_dns(root: Path) -> None:
    """No name service but files: a daemon in the root never sends a DNS query (there is none it needs)."""
    nsswitch = root / "etc/nsswitch.conf"
    lines = [
        ("hosts:          files" if line.startswith("hosts:") else line) for line in nsswitch.read_text().splitlines()
    ]
    nsswitch.write_text("\n".join(lines) + "\n")
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("# name resolution is off in this root (SliMe real-Slurm tier)\nnameserver 127.0.0.1\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")


def _user_ids(root: Path, user: str) -> tuple[int, int]:
    for line in (root / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise SlurmFailed(f"no user {user} in {root}/etc/passwd")


# --- running in the root ------------------------------------------------------------------------


@dataclass(frozen=True)
class Bind:
    """A host directory (or file) bind-mounted over ``target`` inside the root."""

    source: Path
    target: str


def chroot_argv(
    root: Path,
    argv: Sequence[str],
    binds: Sequence[Bind] = (),
    *,
    hostname: str | None = None,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> list[str]:
    """A command line that runs ``argv`` chroot-ed into ``root`` in a private mount namespace.

    The namespace gets /dev, /proc and /sys, then ``binds``; with ``hostname``, a UTS namespace of
    its own with that host name. The environment is only PATH, HOME, LANG and ``env``. ``prefix``
    goes in front (``ip netns exec <ns>``). The whole chain execs: the PID of the process started
    from this command line is the PID of ``argv``.
    """
    lines = [
        "set -e",
        'R="$1"; shift',
        'mount --rbind /dev "$R/dev"',
        'mount -t proc proc "$R/proc"',
        'mount --rbind /sys "$R/sys"',
    ]
    if hostname:
        lines.append(f"hostname {shlex.quote(hostname)}")
    for bind in binds:
        lines.append(f'mount --bind {shlex.quote(str(bind.source))} "$R"{shlex.quote(bind.target)}')
    variables = {"PATH": CHROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8", **(env or {})}
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in variables.items())
    lines.append(f'exec chroot "$R" /usr/bin/env -i {assignments} "$@"')
    unshare = ["unshare", "--mount", "--propagation", "private", *(["--uts"] if hostname else [])]
    return [*prefix, *unshare, "sh", "-c", "\n".join(lines), "slime-chroot", str(root), *argv]


def stop_pid(pid: int, grace: float = 10.0) -> None:
    """SIGTERM ``pid`` and its children (by PID), SIGKILL whatever is left after ``grace`` seconds."""
    family = [pid, *_descendants(pid)]
    for member in family:
        with suppress(ProcessLookupError):
            os.kill(member, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(p) for p in family):
        time.sleep(0.05)
    for member in family:
        if _running(member):
            with suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            with suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                todo += children
    return found


# --- a cluster -----------------------------------------------------------------------------------


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
        "# Written by testbed/real/slurm.py, after the slurm.conf of SchedMD's Slinky slurm-operator.",
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

    def start_controller(self, timeout: float = 30.0) -> None:
        argv = chroot_argv(self.root.path, ["slurmctld", "-D", "-i"], self.binds(), hostname=self.config.host_name)
        with open(self.log / "slurmctld.log", "ab") as out:
            self.ctld = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ctld.poll() is not None:
                raise SlurmFailed(f"slurmctld exited ({self.ctld.returncode}):\n{_tail(self.log / 'slurmctld.log')}")
            if "UP" in self.client(["scontrol", "ping"], check=False, timeout=10).stdout:
                return
            time.sleep(0.1)
        raise SlurmFailed(
            f"slurmctld did not answer scontrol ping within {timeout:g} s:\n{_tail(self.log / 'slurmctld.log')}"
        )

    def start_restd(self, timeout: float = 30.0) -> None:
        env = {"SLURM_JWT": "daemon", "SLURMRESTD_SECURITY": "disable_unshare_files,disable_unshare_sysv"}
        argv = chroot_argv(
            self.root.path,
            [
                "slurmrestd",
                # Unprivileged, as slurmrestd must be; by number, since Slurm 26.05 no longer resolves the
                # name "nobody" (fatal "Unable to resolve user: nobody") while 24.11 does.
                "-u",
                "65534",
                "-g",
                "65534",
                "-a",
                "rest_auth/jwt",
                "-s",
                "openapi/slurmctld",
                f"127.0.0.1:{self.restd_port}",
            ],
            self.binds(),
            env=env,
        )
        with open(self.log / "slurmrestd.log", "ab") as out:
            self.restd = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.restd.poll() is not None:
                raise SlurmFailed(f"slurmrestd exited ({self.restd.returncode}):\n{_tail(self.log / 'slurmrestd.log')}")
            with socket.socket() as probe:
                probe.settimeout(0.2)
                if probe.connect_ex(("127.0.0.1", self.restd_port)) == 0:
                    return
            time.sleep(0.05)
        raise SlurmFailed(f"slurmrestd did not listen within {timeout:g} s:\n{_tail(self.log / 'slurmrestd.log')}")

    def stop_restd(self) -> None:
        if self.restd is not None:
            stop_pid(self.restd.pid)
            self.restd.wait(10)
            self.restd = None

    def stop_controller(self) -> None:
        if self.ctld is not None:
            stop_pid(self.ctld.pid)
            self.ctld.wait(15)
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


# --- the CLI -------------------------------------------------------------------------------------
