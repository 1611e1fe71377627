"""Obtain the real Kubernetes components: from ``$KUBEBUILDER_ASSETS``, else built once from ``stack/``.

The Go modules under ``stack/`` pin every upstream version (``stack/README.md``):

- ``stack/kube``: kube-apiserver, kube-controller-manager and kubectl from ``k8s.io/kubernetes``
  v1.36.4 (each staging module replaced by its published v0.36.4), and etcd from
  ``go.etcd.io/etcd/server/v3`` at the version that release requires;
- ``stack/crdgen``: controller-gen, run on the CAPM3 API types to make the Metal3 CRDs.

The CAPI and Slinky CRDs are read from their release's module zip, which ``go mod download``
fetches from the Go module proxy into the module cache; nothing upstream is copied into the
repository. Results go to a cache outside the repository (:func:`cache_root`), one directory per
``<name>-<version>-<hash of the module's go.mod, go.sum and Go files>``, so a fresh clone on the
same machine reuses them and a change of pins builds anew. A build prints a progress line at
least every 20 s (``go build -v`` names each package as it is compiled).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import ComponentFailed, ComponentUnavailable
from testbed.helm import REPO_ROOT

KUBE_VERSION = "v1.36.4"
ETCD_VERSION = "v3.6.8"  # what k8s.io/kubernetes v1.36.4 requires (stack/kube/go.mod)
CAPI_MODULE = ("sigs.k8s.io/cluster-api", "v1.14.2")
SLINKY_MODULE = ("github.com/SlinkyProject/slurm-operator", "v1.0.1")
CAPM3_API = ("github.com/metal3-io/cluster-api-provider-metal3/api", "v1.12.3")
STACK = REPO_ROOT / "kit" / "stack"
# The CAPI kinds the tier needs, from core/config/crd/bases of the cluster-api module.
CAPI_CRDS = (
    "cluster.x-k8s.io_clusters.yaml",
    "cluster.x-k8s.io_machinedeployments.yaml",
    "cluster.x-k8s.io_machinesets.yaml",
    "cluster.x-k8s.io_machines.yaml",
)
SLINKY_CRDS = ("slinky.slurm.net_controllers.yaml",)
# Metal3DataClaim too: a Metal3Data's owners are its template and its claim, and the garbage
# collector must be able to look the claim's kind up.
CAPM3_CRDS = (
    "infrastructure.cluster.x-k8s.io_metal3datas.yaml",
    "infrastructure.cluster.x-k8s.io_metal3datatemplates.yaml",
    "infrastructure.cluster.x-k8s.io_metal3dataclaims.yaml",
)
CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kubectl")
PROGRESS_SECONDS = 20.0
HEAVY_BUILD_LOCK = "heavy-build"  # taken by every go build (and by other heavy builds of the tiers)

Progress = Callable[[str], None]


def to_stderr(line: str) -> None:
    """The default progress sink: the process's real stderr, even under pytest's capture of sys.stderr."""
    print(f"[slime real] {line}", file=sys.__stderr__, flush=True)


class BuildUnavailable(ComponentUnavailable):
    """A prerequisite is missing (no Go toolchain and no ``$KUBEBUILDER_ASSETS``): skip, or fail under CI."""


class BuildFailed(ComponentFailed):
    """A build or download ran and failed; the message ends with the tool's last lines."""


def cache_root() -> Path:
    """``$SLIME_REAL_CACHE``, else ``$XDG_CACHE_HOME/slime/real``, else ``~/.cache/slime/real``."""
    explicit = os.environ.get("SLIME_REAL_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slime" / "real"


def go_binary() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)
    if not found:
        raise BuildUnavailable(
            "no Go toolchain (go on PATH or /usr/local/go) and no $KUBEBUILDER_ASSETS to build the control plane from"
        )
    return found


def go_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CGO_ENABLED": "0",
            "GOTOOLCHAIN": "local",  # never fetch another toolchain: the one here builds these pins
            "GOFLAGS": " ".join(
                f for f in (env.get("GOFLAGS", ""), "-modcacherw") if f
            ),  # a module cache one can delete
            # sum.golang.org has no entry for the CAPM3 modules; stack/crdgen/go.sum pins their hashes.
            "GONOSUMDB": ",".join(p for p in (env.get("GONOSUMDB", ""), "github.com/metal3-io") if p),
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


def _run_with_progress(cmd: list[str], cwd: Path, env: dict[str, str], what: str, progress: Progress) -> None:
    """Run ``cmd``; report every PROGRESS_SECONDS how long it has run and how many packages it compiled."""
    started = time.monotonic()
    tail: list[str] = []
    packages = 0
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def ticker() -> None:
        while not done.wait(PROGRESS_SECONDS):
            progress(f"{what}: {time.monotonic() - started:.0f} s, {packages} packages compiled so far")

    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            packages += 1
            tail = (tail + [line.rstrip()])[-25:]
        code = proc.wait()
    finally:
        done.set()
        thread.join()
    if code != 0:
        raise BuildFailed(f"{what} failed (exit {code}): {' '.join(cmd)}\n" + "\n".join(tail))
    progress(f"{what}: done in {time.monotonic() - started:.0f} s")


def go_build(
    module: Path, name: str, version: str, packages: dict[str, str], ldflags: str = "", progress: Progress = to_stderr
) -> dict[str, Path]:
    """Build ``packages`` (binary name -> package) of ``module`` once into the cache; return the binaries."""
    key = f"{name}-{version}-{module_hash(module)}"
    dest = cache_root() / key
    wanted = {binary: dest / binary for binary in packages}
    if all(path.is_file() for path in wanted.values()):
        return wanted
    go = go_binary()
    # One Go build at a time on the machine (HEAVY_BUILD_LOCK): two at once on 2 cores take longer
    # than one after the other, and starve the tests running beside them.
    with _locked(key), _locked(HEAVY_BUILD_LOCK):
        if all(path.is_file() for path in wanted.values()):
            return wanted
        progress(
            f"building {', '.join(packages)} ({version}) from {module.relative_to(REPO_ROOT)} into {dest}; "
            "the first build takes minutes (about 6 min on 2 cores), later runs reuse it"
        )
        tmp = dest.with_name(f"{key}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _run_with_progress([go, "mod", "download"], module, go_env(), f"{name}: go mod download", progress)
        cmd = [
            go,
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            f"-s -w {ldflags}".strip(),
            "-o",
            f"{tmp}/",
            *packages.values(),
        ]
        _run_with_progress(cmd, module, go_env(), f"{name}: go build", progress)
        for binary in packages:  # go build names each binary after its package's last element
            if not (tmp / binary).is_file():
                raise BuildFailed(f"{name}: go build made no {binary} in {tmp}")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return wanted


@dataclass(frozen=True)
class ControlPlaneBinaries:
    kube_apiserver: Path
    etcd: Path
    kube_controller_manager: Path | None
    kubectl: Path
    source: str  # where they came from, for the logs and docs/testing.md


def _kube_ldflags() -> str:
    major, minor = KUBE_VERSION.removeprefix("v").split(".")[:2]
    # Without these the binaries report v0.0.0-master and Helm's kubeVersion checks fail.
    return " ".join(
        f"-X k8s.io/component-base/version.{key}={value}"
        for key, value in (
            ("gitVersion", KUBE_VERSION),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        )
    )


def build_control_plane(progress: Progress = to_stderr) -> dict[str, Path]:
    return go_build(
        STACK / "kube",
        "kube",
        KUBE_VERSION,
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            "etcd": "./cmd/etcd",
        },
        _kube_ldflags(),
        progress,
    )


def control_plane_binaries(progress: Progress = to_stderr) -> ControlPlaneBinaries:
    """``$KUBEBUILDER_ASSETS`` (envtest's layout: kube-apiserver, etcd, kubectl) when set, else ``stack/kube``.

    setup-envtest ships no kube-controller-manager: with such assets it is built from ``stack/kube``
    when Go is there, else the control plane runs without it (no Deployment, garbage-collector or
    namespace controllers; the story does not need them).
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        base = Path(assets)
        missing = [b for b in ("kube-apiserver", "etcd", "kubectl") if not (base / b).is_file()]
        if missing:
            raise BuildUnavailable(f"KUBEBUILDER_ASSETS={assets} has no {', '.join(missing)}")
        kcm: Path | None = base / "kube-controller-manager"
        if not (base / "kube-controller-manager").is_file():
            try:
                kcm = build_control_plane(progress)["kube-controller-manager"]
            except BuildUnavailable:
                kcm = None
        return ControlPlaneBinaries(
            base / "kube-apiserver", base / "etcd", kcm, base / "kubectl", f"KUBEBUILDER_ASSETS={assets}"
        )
    built = build_control_plane(progress)
    return ControlPlaneBinaries(
        built["kube-apiserver"],
        built["etcd"],
        built["kube-controller-manager"],
        built["kubectl"],
        f"built from stack/kube into {built['etcd'].parent}",
    )


def module_dir(module: str, version: str, progress: Progress = to_stderr) -> Path:
    """The unpacked module zip of ``module@version`` in the Go module cache (fetched through the proxy once)."""
    go = go_binary()
    cache_root().mkdir(parents=True, exist_ok=True)
    # Outside any module (cwd = the cache root, GO111MODULE on), go mod download fetches just that zip.
    proc = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
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
        raise BuildFailed(
            f"go mod download {module}@{version} failed: {info.get('Error') or proc.stderr.strip()[-500:]}"
        )
    return Path(info["Dir"])


def capm3_crds(progress: Progress = to_stderr) -> Path:
    """The CAPM3 Metal3 CRDs, generated by controller-gen from the pinned API module (cached)."""
    tools = go_build(
        STACK / "crdgen",
        "crdgen",
        "controller-tools-v0.19.0",
        {"controller-gen": "sigs.k8s.io/controller-tools/cmd/controller-gen"},
        progress=progress,
    )
    out = tools["controller-gen"].parent / f"crds-capm3-{CAPM3_API[1]}"
    if all((out / name).is_file() for name in CAPM3_CRDS):
        return out
    with _locked(out.name):
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        progress(f"generating the CAPM3 {CAPM3_API[1]} CRDs with controller-gen")
        _run_with_progress(
            [str(tools["controller-gen"]), "crd", f"paths={CAPM3_API[0]}/v1beta1", f"output:crd:dir={tmp}"],
            STACK / "crdgen",
            go_env(),
            "controller-gen",
            progress,
        )
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def crd_files(progress: Progress = to_stderr) -> list[Path]:
    """Every CRD the tier installs: CAPI (Cluster, MachineDeployment, MachineSet, Machine), CAPM3, Slinky."""
    capi = module_dir(*CAPI_MODULE, progress=progress) / "core" / "config" / "crd" / "bases"
    slinky = module_dir(*SLINKY_MODULE, progress=progress) / "config" / "crd" / "bases"
    capm3 = capm3_crds(progress)
    files = [capi / n for n in CAPI_CRDS] + [slinky / n for n in SLINKY_CRDS] + [capm3 / n for n in CAPM3_CRDS]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise BuildFailed(f"CRD files missing from the pinned modules: {', '.join(missing)}")
    return files


if __name__ == "__main__":  # python -m testbed.real.build: build (or find) everything, print where
    started = time.monotonic()
    binaries = control_plane_binaries()
    to_stderr(f"control plane: {binaries.source}")
    for crd in crd_files():
        to_stderr(f"CRD {crd}")
    to_stderr(f"ready in {time.monotonic() - started:.0f} s")
