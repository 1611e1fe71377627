"""Build the product image from the ``Dockerfile`` with podman, without a Docker engine or a registry.

- podman, runc and debootstrap come from Debian (:mod:`testbed.framework.debian`), installed on first use.
- podman runs with a containers.conf of our own (``CONTAINERS_CONF``, nothing under /etc is
  changed): ``runtime = "runc"`` (crun refuses this machine's hybrid cgroup layout) and
  ``default_ulimits`` within this process's hard limits (root here cannot raise them, and
  podman's default of 1048576 open files makes every container fail to start).
- The base image is Debian bookworm made with ``debootstrap --variant=minbase`` (Python 3.11, as
  the Dockerfile's ``python:3.11-slim``) and imported as ``localhost/slime-python-base:bookworm``;
  the Dockerfile gets it through its ``PYTHON_IMAGE`` build argument, with ``--pull=never``.
- The host's CA bundle is mounted read-only into the build steps (the package registries are
  reached through a TLS-intercepting proxy here); it is never copied into the image.
- The tag is a hash of everything the Dockerfile copies, so an unchanged tree reuses the image.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.framework.debian import ensure_commands
from testbed.framework.errors import ComponentFailed
from testbed.framework.paths import REPO_ROOT, cache_root, locked
from testbed.framework.pins import BASE_IMAGE_SUITE, DEBIAN_MIRROR
from testbed.framework.progress import Progress, to_stderr

BASE_IMAGE = f"localhost/slime-python-base:{BASE_IMAGE_SUITE}"
IMAGE_REPOSITORY = "localhost/slime"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What the Dockerfile copies (keep in step with its COPY lines): the image tag hashes these.
IMAGE_INPUTS = (
    "Dockerfile",
    "requirements.lock",
    "pyproject.toml",
    "README.md",
    "common",
    "injection_webhook",
    "scaling_webhook",
    "preflight",
    "lifecycle",
)
PODMAN_COMMANDS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}


class ImageFailed(ComponentFailed):
    """podman or debootstrap failed; the message ends with its output."""


def containers_conf() -> Path:
    """Our containers.conf: runc, and ulimits podman can actually set here."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else min(int(hard), 1048576)
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 32768 if nproc_hard == resource.RLIM_INFINITY else min(int(nproc_hard), 32768)
    path = cache_root() / "containers.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        '[engine]\nruntime = "runc"\n'
    )
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(containers_conf())}


def podman(
    *args: str, timeout: float = 120.0, check: bool = True, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(["podman", *args], input=stdin, capture_output=True, timeout=timeout, env=podman_env())
    if check and proc.returncode != 0:
        raise ImageFailed(
            f"podman {' '.join(args[:3])} ... exited {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()[-1500:]}"
        )
    return proc


def _image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def ensure_podman(progress: Progress = to_stderr) -> None:
    ensure_commands(PODMAN_COMMANDS, progress)


def _mirror() -> str:
    """The Debian mirror apt already uses here (deb822 or one-line sources), else deb.debian.org."""
    for path in [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]:
        try:
            for line in path.read_text().splitlines():
                words = line.split()
                if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1]:
                    return words[1]
                if words[:1] == ["deb"] and len(words) > 2 and "security" not in words[1]:
                    return words[1] if not words[1].startswith("[") else words[2]
        except OSError:
            continue
    return DEBIAN_MIRROR


def ensure_base_image(progress: Progress = to_stderr) -> str:
    """``localhost/slime-python-base:bookworm``: a debootstrap'd Debian 12 with python3 and venv."""
    if _image_exists(BASE_IMAGE):
        return BASE_IMAGE
    with locked("image-base"):  # another session may be making it: wait, then find it
        if _image_exists(BASE_IMAGE):
            return BASE_IMAGE
        return _make_base_image(progress)


def _make_base_image(progress: Progress) -> str:
    started = time.monotonic()
    progress(f"making the base image {BASE_IMAGE} with debootstrap (first use, about a minute)")
    with tempfile.TemporaryDirectory(prefix="slime-rootfs-", dir=cache_root()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,python-is-python3,ca-certificates",
                BASE_IMAGE_SUITE,
                str(rootfs),
                _mirror(),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0:
            raise ImageFailed(f"debootstrap failed: {(proc.stdout + proc.stderr).strip()[-1500:]}")
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["podman", "import", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True, timeout=600, env=podman_env()
        )
        tar.wait()
        if imported.returncode != 0:
            raise ImageFailed(f"podman import failed: {imported.stderr.decode(errors='replace')[-1000:]}")
    progress(f"base image ready in {time.monotonic() - started:.0f} s")
    return BASE_IMAGE


def image_tag() -> str:
    """A hash of the Dockerfile's inputs (the files it copies), so an unchanged tree reuses the image."""
    digest = hashlib.sha256()
    for name in IMAGE_INPUTS:
        root = REPO_ROOT / name
        files = (
            [root]
            if root.is_file()
            else sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        )
        for path in files:
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build_image(progress: Progress = to_stderr) -> str:
    """The product image built from the Dockerfile (``localhost/slime:<hash>``), built when missing."""
    ensure_podman(progress)
    ref = f"{IMAGE_REPOSITORY}:{image_tag()}"
    if _image_exists(ref):
        return ref
    base = ensure_base_image(progress)
    with locked(f"image-{ref.rsplit(':', 1)[1]}"):  # another session may be building it: wait, find it
        if not _image_exists(ref):
            _build(ref, base, progress)
    return ref


def _build(ref: str, base: str, progress: Progress) -> None:
    started = time.monotonic()
    progress(f"building {ref} from the Dockerfile with podman (about a minute)")
    args = [
        "build",
        "--network=host",
        "--pull=never",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "-t",
        ref,
        "-f",
        str(REPO_ROOT / "Dockerfile"),
    ]
    if HOST_CA_BUNDLE.is_file():
        args += ["-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    podman(*args, str(REPO_ROOT), timeout=1800)
    progress(f"image built in {time.monotonic() - started:.0f} s")
