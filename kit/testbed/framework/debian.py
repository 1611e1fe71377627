"""Debian packages on the host, on first use (root and apt-get only), or the reason why not.

``apt-get`` runs with ``DPkg::Lock::Timeout=600``: another tier (or person) may run apt at the
same time, and then this one waits for the lock instead of failing. The package lists are
fetched (``apt-get update``) only when an install or a download fails without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from testbed.framework.errors import ComponentUnavailable
from testbed.framework.progress import Progress, to_stderr
from testbed.framework.wait import wait_for

APT = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "-o", "Acquire::Retries=3"]
ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


class PackagesUnavailable(ComponentUnavailable):
    """Not root, no apt-get, or apt-get could not install them: the message says which."""


def missing_commands(commands: dict[str, str]) -> dict[str, str]:
    """The ``command -> package`` entries whose command is not on PATH (nor in /usr/sbin, /sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return {cmd: pkg for cmd, pkg in commands.items() if shutil.which(cmd, path=path) is None}


def apt_update(progress: Progress = to_stderr) -> None:
    """``apt-get update`` (root only), once the lists lack a package."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PackagesUnavailable("the package lists need an apt-get update, which needs root and apt-get")
    progress("fetching the Debian package lists (apt-get update)")

    def updated() -> bool:
        proc = subprocess.run([*APT, "update"], capture_output=True, text=True, env=ENV, timeout=1800)
        if proc.returncode == 0:
            return True
        if "lock" in proc.stderr.lower():  # another apt holds the lists' lock (update has no lock timeout)
            return False
        raise PackagesUnavailable(f"apt-get update failed: {proc.stderr.strip()[-500:]}")

    wait_for(updated, 300, "apt-get update (another apt holds the package lists' lock)", interval=5)


def ensure_commands(commands: dict[str, str], progress: Progress = to_stderr) -> None:
    """Make every command of ``commands`` (command -> Debian package) available, installing what is missing."""
    missing = missing_commands(commands)
    if not missing:
        return
    packages = sorted(set(missing.values()))
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PackagesUnavailable(
            f"{', '.join(sorted(missing))} missing and cannot install {' '.join(packages)} (needs root and apt-get)"
        )
    started = time.monotonic()
    progress(f"installing Debian packages {' '.join(packages)} (first use)")
    install = [*APT, "install", "-y", "--no-install-recommends", *packages]
    proc = subprocess.run(install, capture_output=True, text=True, env=ENV, timeout=1800)
    if proc.returncode != 0:
        apt_update(progress)
        proc = subprocess.run(install, capture_output=True, text=True, env=ENV, timeout=1800)
    if proc.returncode != 0:
        raise PackagesUnavailable(f"apt-get install {' '.join(packages)} failed: {proc.stderr.strip()[-500:]}")
    still = missing_commands(commands)
    if still:
        raise PackagesUnavailable(f"installed {' '.join(packages)} but {', '.join(sorted(still))} still missing")
    progress(f"installed {' '.join(packages)} in {time.monotonic() - started:.0f} s")


def download(package: str, version: str, directory: Path, progress: Progress = to_stderr) -> Path:
    """``apt-get download package=version`` into ``directory`` (nothing installed); the ``.deb``."""
    argv = [*APT, "download", f"{package}={version}"]
    proc = subprocess.run(argv, cwd=directory, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        apt_update(progress)  # the lists name a version the mirror no longer has
        proc = subprocess.run(argv, cwd=directory, capture_output=True, text=True, timeout=900)
    debs = sorted(directory.glob("*.deb"))
    if proc.returncode != 0 or not debs:
        raise PackagesUnavailable(f"apt-get download {package}={version} failed: {proc.stderr.strip()[-500:]}")
    return debs[0]


def candidate(package: str) -> str:
    """The version of ``package`` apt would install here ("" when the package lists do not know it)."""
    proc = subprocess.run(
        ["apt-cache", "policy", package],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LANG": "C", "LC_ALL": "C"},
    )
    for line in proc.stdout.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate":
            return "" if value.strip() == "(none)" else value.strip()
    return ""
