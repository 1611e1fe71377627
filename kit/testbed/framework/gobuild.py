"""Building Go programs from the Go module proxy, once per version, into the kit's cache.

The Go modules under ``kit/stack`` pin every upstream release (``kit/stack/README.md``;
:mod:`testbed.framework.pins` holds the versions). :func:`go_build` compiles some packages of one
of them into ``<cache>/<name>-<version>-<hash of the module's go.mod, go.sum and Go files>``, under
the machine-wide heavy-build lock, with a progress line at least every 20 s (``go build -v``
names each package as it is compiled). :func:`module_dir` fetches a release's module zip (its
CRDs and manifests) into Go's module cache. Nothing upstream is copied into the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from testbed.framework.errors import ComponentFailed, ComponentUnavailable
from testbed.framework.paths import HEAVY_BUILD_LOCK, STACK, cache_root, locked
from testbed.framework.pins import GONOSUMDB, GoModule
from testbed.framework.processes import run_logged
from testbed.framework.progress import Progress, to_stderr


class BuildUnavailable(ComponentUnavailable):
    """A prerequisite of a build is missing (no Go toolchain): skip, or fail under CI."""


class BuildFailed(ComponentFailed):
    """A build or download ran and failed; the message ends with the tool's last lines."""


def go_binary() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)
    if not found:
        raise BuildUnavailable("no Go toolchain (go on PATH or /usr/local/go) to build the real components from")
    return found


def go_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CGO_ENABLED": "0",
            "GOTOOLCHAIN": "local",  # never fetch another toolchain: the one here builds these pins
            "GOFLAGS": " ".join(f for f in (env.get("GOFLAGS", ""), "-modcacherw") if f),  # a deletable module cache
            "GONOSUMDB": ",".join(p for p in (env.get("GONOSUMDB", ""), GONOSUMDB) if p),
        }
    )
    env.update(extra)
    return env


def module_hash(module: Path) -> str:
    """A hash of what decides a module's build: go.mod, go.sum and its Go files."""
    digest = hashlib.sha256()
    for path in sorted([module / "go.mod", module / "go.sum", *module.rglob("*.go")]):
        digest.update(str(path.relative_to(module)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def version_ldflags(package: str, version: str, **more: str) -> str:
    """``-X`` flags stamping a release's version the way its Makefile does (``gitVersion``, ``gitMajor``...)."""
    major, minor = version.removeprefix("v").split(".")[:2]
    values = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean", **more}
    return " ".join(f"-X {package}.{key}={value}" for key, value in values.items())


def go_build(
    stack: str, name: str, version: str, packages: dict[str, str], ldflags: str = "", progress: Progress = to_stderr
) -> dict[str, Path]:
    """Build ``packages`` (binary name -> package) of ``kit/stack/<stack>`` once into the cache; the binaries."""
    module = STACK / stack
    key = f"{name}-{version}-{module_hash(module)}"
    dest = cache_root() / key
    wanted = {binary: dest / binary for binary in packages}
    if all(path.is_file() for path in wanted.values()):
        return wanted
    go = go_binary()
    with locked(key), locked(HEAVY_BUILD_LOCK):
        if all(path.is_file() for path in wanted.values()):
            return wanted
        progress(
            f"building {', '.join(packages)} ({version}) from kit/stack/{stack} into {dest}; "
            "the first build takes minutes, later runs reuse it"
        )
        tmp = dest.with_name(f"{key}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log = cache_root() / f"{key}.log"
        log.write_text("")
        run_logged([go, "mod", "download"], log, f"{name}: go mod download", progress, env=go_env(), cwd=module)
        argv = [go, "build", "-v", "-trimpath", "-ldflags", f"-s -w {ldflags}".strip(), "-o", f"{tmp}/"]
        run_logged(
            [*argv, *packages.values()],
            log,
            f"{name}: go build",
            progress,
            env=go_env(),
            cwd=module,
            counting="packages compiled",
            failure=BuildFailed,
        )
        for binary in packages:  # go build names each binary after its package's last element
            if not (tmp / binary).is_file():
                raise BuildFailed(f"{name}: go build made no {binary} in {tmp}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return wanted


# The modules under kit/stack in the order the real tiers' builds need them.
BUILD_ORDER = ("kube", "crdgen", "capi", "capm3", "bmo", "certmanager", "keda")


def download_modules(progress: Progress = to_stderr) -> None:
    """``go mod download`` of each module under ``kit/stack`` that has no build in the cache yet, outside the
    heavy-build lock. Downloads are network-bound: run beside the first build, they take each later build's
    download out of its turn at the lock (about 3 minutes of a cold run). Best effort: a build downloads what is
    still missing and reports its own failures."""
    try:
        go = go_binary()
    except BuildUnavailable:
        return
    with locked("module-download"):  # the other xdist worker's downloads would only wait on Go's own locks
        for name in BUILD_ORDER:
            module = STACK / name
            if any(path.is_dir() for path in cache_root().glob(f"{name}-*-{module_hash(module)}")):
                continue
            started = time.monotonic()
            proc = subprocess.run(
                [go, "mod", "download"],
                cwd=module,
                env=go_env(),
                capture_output=True,
                text=True,
                timeout=1800,
                stdin=subprocess.DEVNULL,
            )
            outcome = "downloaded" if proc.returncode == 0 else "not all downloaded (its build will retry)"
            progress(f"{name}: modules {outcome} ahead of its build in {time.monotonic() - started:.0f} s")


def module_dir(module: GoModule) -> Path:
    """The unpacked module zip of ``module`` in Go's module cache (fetched through the proxy once)."""
    go = go_binary()
    cache_root().mkdir(parents=True, exist_ok=True)
    # Outside any module (cwd = the cache root, GO111MODULE on), go mod download fetches just that zip.
    proc = subprocess.run(
        [go, "mod", "download", "-json", module.at],
        cwd=cache_root(),
        env=go_env(GO111MODULE="on"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or not info.get("Dir"):
        raise BuildFailed(f"go mod download {module.at} failed: {info.get('Error') or proc.stderr.strip()[-500:]}")
    return Path(info["Dir"])


def files_in(directory: Path, names: tuple[str, ...], what: str) -> list[Path]:
    """``names`` in ``directory`` (a module zip's CRDs), every one of them there."""
    files = [directory / name for name in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise BuildFailed(f"{what}: files missing: {', '.join(missing)}")
    return files
