"""A Debian root with Slurm (and whatever else a host needs), made once with debootstrap and cached; and running
commands chroot-ed into it.

:func:`prepare_root` makes a root for a :class:`~testbed.framework.pins.SlurmRelease` (26.05 from
forky, the default; 24.11 from trixie) once with ``debootstrap --variant=minbase`` from Debian's
registry and installs :data:`PACKAGES` (plus a caller's extra packages) into it with apt-get. It
is cached outside the repository (:func:`testbed.framework.paths.cache_root`), in a directory named
after a hash of the suite, the mirror, the package list and :data:`RECIPE`, so a change of any of
them builds a new one; a second session waits for the first one's build (a file lock). Nothing of
the host's own packages changes, except that ``debootstrap`` is installed on the host when it is
missing. Name resolution is switched off in the root once the packages are in (``hosts: files``,
``nameserver 127.0.0.1``): the daemons must never look a name up on a real DNS server, and they
need none (nodes register by address).

:func:`chroot_argv` runs a command ``chroot``-ed into that shared root, in a private mount
namespace where the caller's directories are bind-mounted over the root's (``/etc/slurm``,
``/run``, the spool and log directories). The root itself is never written after it is made, so
tests (and two test sessions) can share it; the mounts vanish with the processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.framework.debian import PackagesUnavailable, ensure_commands
from testbed.framework.errors import ComponentFailed, ComponentUnavailable
from testbed.framework.paths import cache_root, locked
from testbed.framework.pins import DEBIAN_MIRROR, DEFAULT_SLURM, SLURM_RELEASES, SlurmRelease
from testbed.framework.processes import run_logged
from testbed.framework.progress import Progress, to_stderr

MIRROR = DEBIAN_MIRROR
PACKAGES = ("slurmctld", "slurmd", "slurmrestd", "slurm-client", "slurm-wlm-jwt-plugin")
# Bump when the preparation of the root changes: the cached root is then made anew.
RECIPE = 1
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_TOOLS = ("ip", "unshare", "chroot", "mount", "nsenter")
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY = ".slime-ready.json"
ROOT_DIRECTORIES = (
    "var/lib/cloud",
    "var/spool/slurmctld",
    "var/spool/slurmd",
    "var/log/slurm",
    "srv/slime",
    "etc/slurm",
)


class Unavailable(ComponentUnavailable):
    """A prerequisite is missing (not root, no ``ip``/``unshare``, no way to get debootstrap): skip, or fail under
    CI."""


class RootFailed(ComponentFailed):
    """Making the root ran and failed; the message ends with the last lines of its log."""


def root_name(release: SlurmRelease, packages: tuple[str, ...] = PACKAGES) -> str:
    digest = hashlib.sha256(json.dumps([release.suite, MIRROR, sorted(packages), RECIPE]).encode()).hexdigest()[:12]
    return f"slurm-{release.suite}-{release.series}-{digest}"


@dataclass(frozen=True)
class SlurmRoot:
    """A prepared root: where it is, the Slurm release in it, and its ``slurm`` user's ids."""

    path: Path
    release: str  # the installed Slurm version, e.g. 26.05.5
    slurm_uid: int
    slurm_gid: int
    series: str = DEFAULT_SLURM.series

    @classmethod
    def load(cls, path: Path) -> SlurmRoot:
        ready = json.loads((path / READY).read_text())
        release = str(ready["release"])
        return cls(path, release, int(ready["slurm_uid"]), int(ready["slurm_gid"]), ".".join(release.split(".")[:2]))

    @property
    def api_version(self) -> str:
        """The newest slurmrestd data parser this root's Slurm serves."""
        return SLURM_RELEASES[self.series].api_version


def check_host(progress: Progress = to_stderr) -> None:
    """Raise :class:`Unavailable` unless this host can run the tier; install debootstrap if it is missing."""
    if os.geteuid() != 0:
        raise Unavailable("real Slurm needs root here (chroot, mount and network namespaces); run as root")
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if missing:
        raise Unavailable(f"missing host tools: {', '.join(missing)} (iproute2, util-linux, coreutils)")
    try:
        ensure_commands({"debootstrap": "debootstrap"}, progress)
    except PackagesUnavailable as exc:
        raise Unavailable(str(exc)) from None


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
        raise RootFailed(f"{path} has mounts ({', '.join(mounted[:3])}); unmount them before it can be made anew")
    shutil.rmtree(path)


def prepare_root(
    progress: Progress = to_stderr, release: SlurmRelease = DEFAULT_SLURM, extra_packages: tuple[str, ...] = ()
) -> SlurmRoot:
    """The cached root with Slurm ``release`` (and ``extra_packages``), made on first use (about a minute:
    debootstrap, then apt-get)."""
    check_host(progress)
    packages = (*PACKAGES, *extra_packages)
    final = cache_root() / root_name(release, packages)
    if (final / READY).is_file():
        return SlurmRoot.load(final)
    with locked(final.name):
        if not (final / READY).is_file():
            _make_root(final, release, packages, progress)
    return SlurmRoot.load(final)


def _make_root(final: Path, release: SlurmRelease, packages: tuple[str, ...], progress: Progress) -> None:
    partial = final.with_name(final.name + ".partial")
    for leftover in (partial, final):
        if leftover.exists():
            _remove_tree(leftover)
    partial.mkdir(parents=True)
    log = cache_root() / f"{final.name}.log"
    log.write_text("")
    started = time.monotonic()
    progress(f"making the Debian {release.suite} root once (debootstrap --variant=minbase from {MIRROR}); log {log}")
    # In a mount namespace of its own: the /proc and /sys debootstrap mounts vanish with it, even if it is killed.
    script = [release.debootstrap_script] if release.debootstrap_script else []
    debootstrap = ["unshare", "--mount", "--propagation", "private", "debootstrap", "--variant=minbase"]
    run_logged(
        [*debootstrap, release.suite, str(partial), MIRROR, *script],
        log,
        "debootstrap",
        progress,
        timeout=600,
        failure=RootFailed,
    )
    progress(f"debootstrap done in {time.monotonic() - started:.0f} s; installing {' '.join(packages)}")
    _install(partial, release, packages, log, progress)
    installed = _installed_slurm(partial, release)
    uid, gid = _user_ids(partial, "slurm")
    ready: dict[str, object] = {
        "release": installed,
        "slurm_uid": uid,
        "slurm_gid": gid,
        "suite": release.suite,
        "mirror": MIRROR,
    }
    ready.update(packages=list(packages), recipe=RECIPE, seconds=round(time.monotonic() - started, 1))
    (partial / READY).write_text(json.dumps(ready))
    partial.rename(final)
    progress(f"root ready in {time.monotonic() - started:.0f} s: Slurm {installed} at {final}")


def _install(root: Path, release: SlurmRelease, packages: tuple[str, ...], log: Path, progress: Progress) -> None:
    """apt-get the packages into the root (with the host's CA bundle, no daemon started), then turn DNS off."""
    certs = root / "etc/ssl/certs"
    certs.mkdir(parents=True, exist_ok=True)
    if HOST_CA_BUNDLE.is_file():
        shutil.copy2(HOST_CA_BUNDLE, certs / "ca-certificates.crt")
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\n# no daemon starts while packages install\nexit 101\n")
    policy.chmod(0o755)
    options = " ".join(release.apt_options)
    install = f"apt-get {options} update && apt-get install -y --no-install-recommends {' '.join(packages)}"
    argv = chroot_argv(root, ["sh", "-c", f"{install} && apt-get clean"], env={"DEBIAN_FRONTEND": "noninteractive"})
    run_logged(argv, log, "apt-get install in the root", progress, timeout=600, failure=RootFailed)
    _no_dns(root)
    for directory in ROOT_DIRECTORIES:
        (root / directory).mkdir(parents=True, exist_ok=True)
    for lists in (root / "var/lib/apt/lists").glob("*_*"):
        lists.unlink()


def _installed_slurm(root: Path, release: SlurmRelease) -> str:
    version = subprocess.run(chroot_argv(root, ["slurmctld", "-V"]), capture_output=True, text=True, timeout=60)
    installed = version.stdout.strip().split()[-1] if version.stdout.strip() else ""
    if not installed.startswith(release.series):
        raise RootFailed(
            f"the root has Slurm {installed or '?'} ({version.stderr.strip()[-300:]}), expected {release.series}"
        )
    return installed


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
    raise RootFailed(f"no user {user} in {root}/etc/passwd")


# --- running in the root ------------------------------------------------------------------------------------


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
