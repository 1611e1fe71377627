"""Pod volumes as the kubelet makes them: secret and configMap volumes from the API server, the ServiceAccount's
projected token, and kubelet's atomic refresh of them.

:func:`materialize` writes each mounted volume of a pod under a host directory (``items`` and
``defaultMode`` honoured, group-owned by ``fsGroup``), the service-account token from the
TokenRequest API with the cluster CA and namespace (what the ServiceAccount admission plugin's
projected volume gives a pod). With a ``synced`` list, secret and configMap volumes are laid out as
kubelet's AtomicWriter does (the files are symlinks through ``..data`` to a timestamped
directory) and :class:`testbed.components.pods.VolumeSync` refreshes them, as kubelet's pod sync does: a
renewed Secret reaches the running pod by an atomic ``..data`` swap, never as a half-written pair.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any

from testbed.components.controlplane import ControlPlane
from testbed.framework.errors import ComponentFailed

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
Synced = list[tuple[dict[str, Any], Path, int | None]]  # (volume, host directory, fsGroup) of each refreshed volume


class VolumeFailed(ComponentFailed):
    """A pod's volume cannot be made here (only secret, configMap, emptyDir and the projected token can)."""


def volume_files(cp: ControlPlane, namespace: str, volume: dict[str, Any]) -> tuple[dict[str, bytes], int] | None:
    """The files a secret or configMap volume holds (path -> bytes) and their mode; None for other kinds."""
    if "secret" in volume:
        source = volume["secret"]
        obj = cp.api.get("v1", "secrets", namespace, source["secretName"]) or {}
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    elif "configMap" in volume:
        source = volume["configMap"]
        obj = cp.api.get("v1", "configmaps", namespace, source["name"]) or {}
        data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    else:
        return None
    items = source.get("items")
    files = {item["path"]: data[item["key"]] for item in items} if items else data
    return files, int(source.get("defaultMode", 0o644))


DATA_DIR = "..data"


def _published(target: Path) -> dict[str, bytes]:
    """What an AtomicWriter directory publishes now (path -> bytes, read through ``..data``)."""
    data = target / DATA_DIR
    if not data.is_dir():
        return {}
    return {str(p.relative_to(data)): p.read_bytes() for p in data.rglob("*") if p.is_file()}


def atomic_write(target: Path, files: dict[str, bytes], mode: int, fs_group: int | None) -> bool:
    """Publish ``files`` in ``target`` as kubelet's AtomicWriter does; False when they are already published.

    The payload goes to a new ``..<timestamp>`` directory, a ``..data_tmp`` symlink to it is renamed
    over ``..data`` (the one atomic step), each top-level name is a symlink ``name -> ..data/name``,
    and the previous timestamped directory is removed. A reader never sees a mix of old and new files.
    """
    if _published(target) == files:
        return False
    target.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f") + os.urandom(2).hex()
    fresh = target / stamp
    fresh.mkdir(mode=0o755)
    _write_files(fresh, files, mode, fs_group)
    old = os.readlink(target / DATA_DIR) if (target / DATA_DIR).is_symlink() else None
    tmp_link = target / "..data_tmp"
    if tmp_link.is_symlink():
        tmp_link.unlink()
    os.symlink(stamp, tmp_link)
    os.replace(tmp_link, target / DATA_DIR)
    top = {rel.split("/", 1)[0] for rel in files}
    for name in top:
        link = target / name
        if not link.is_symlink():
            os.symlink(f"{DATA_DIR}/{name}", link)
    for entry in target.iterdir():  # names the payload no longer has
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in top:
            entry.unlink()
    if old:
        shutil.rmtree(target / old, ignore_errors=True)
    return True


def materialize(
    cp: ControlPlane,
    namespace: str,
    pod_spec: dict[str, Any],
    container: dict[str, Any],
    token: str,
    root: Path,
    synced: Synced | None = None,
) -> tuple[dict[str, Path], list[str]]:
    """Write each mounted volume under ``root``; return mountPath -> host dir, and the tmpfs mount paths.

    With ``synced`` (a list to fill), secret and configMap volumes are published as kubelet's
    AtomicWriter does and recorded there, for :func:`sync_volumes`.
    """
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    security = pod_spec.get("securityContext") or {}
    fs_group = security.get("fsGroup")
    mounts: dict[str, Path] = {}
    tmpfs: list[str] = []
    service_account = False
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            tmpfs.append(mount["mountPath"])
            continue
        if mount["mountPath"] == SA_DIR and "projected" in volume:
            # The ServiceAccount admission plugin's kube-api-access-* volume on a Pod created through the
            # API (a hook): the token, CA and namespace written below.
            service_account = True
            continue
        found = volume_files(cp, namespace, volume)
        if found is None:
            raise VolumeFailed(
                f"volume {mount['name']}: only secret, configMap and emptyDir volumes are supported here"
            )
        files, mode = found
        target = root / mount["name"]
        if synced is not None:
            atomic_write(target, files, mode, None if fs_group is None else int(fs_group))
            synced.append((volume, target, None if fs_group is None else int(fs_group)))
            mounts[mount["mountPath"]] = target
            continue
        target.mkdir(parents=True, exist_ok=True)
        _write_files(target, files, mode, None if fs_group is None else int(fs_group))
        mounts[mount["mountPath"]] = target
    if service_account or pod_spec.get("automountServiceAccountToken", True):
        sa = root / "kube-api-access"
        sa.mkdir(parents=True, exist_ok=True)
        for name, content in (("token", token.encode()), ("ca.crt", cp.ca_pem), ("namespace", namespace.encode())):
            (sa / name).write_bytes(content)
            os.chmod(sa / name, 0o644)  # as the projected volume's default mode
        mounts[SA_DIR] = sa
    return mounts, tmpfs


def _write_files(directory: Path, files: dict[str, bytes], mode: int, fs_group: int | None) -> None:
    """Write a volume's files under ``directory`` with the volume's mode, group-owned by ``fs_group`` (as kubelet
    does)."""
    for rel, content in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.chmod(path, mode)
        if fs_group is not None and os.geteuid() == 0:
            os.chown(path, 0, fs_group)
