"""Install Debian packages a tier needs on first use (root and apt-get only), or say why not.

``apt-get`` runs with ``DPkg::Lock::Timeout=600``: another tier (or person) may run apt at the
same time, and then this one waits for the lock instead of failing. The package lists are
fetched (``apt-get update``) only when an install fails without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from testbed.errors import ComponentUnavailable
from testbed.real.build import Progress, to_stderr

APT = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "-o", "Acquire::Retries=3"]


class PackagesUnavailable(ComponentUnavailable):
    """Not root, no apt-get, or apt-get could not install them: the message says which."""


def missing_commands(commands: dict[str, str]) -> dict[str, str]:
    """The ``command -> package`` entries whose command is not on PATH (nor in /usr/sbin, /sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return {cmd: pkg for cmd, pkg in commands.items() if shutil.which(cmd, path=path) is None}


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
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    started = time.monotonic()
    progress(f"installing Debian packages {' '.join(packages)} (first use)")
    install = [*APT, "install", "-y", "--no-install-recommends", *packages]
    proc = subprocess.run(install, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        progress("apt-get install failed; fetching the package lists (apt-get update) and trying again")
        subprocess.run([*APT, "update"], capture_output=True, text=True, env=env, timeout=1800)
        proc = subprocess.run(install, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise PackagesUnavailable(f"apt-get install {' '.join(packages)} failed: {proc.stderr.strip()[-500:]}")
    still = missing_commands(commands)
    if still:
        raise PackagesUnavailable(f"installed {' '.join(packages)} but {', '.join(sorted(still))} still missing")
    progress(f"installed {' '.join(packages)} in {time.monotonic() - started:.0f} s")
