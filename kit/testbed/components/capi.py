"""Cluster API for real: the core controller manager v1.14.2, built from ``stack/capi``, run out of cluster.

**Build.** :func:`build_manager` builds ``sigs.k8s.io/cluster-api/core`` (the ``main`` of CAPI's
core controller manager, the binary of its ``cluster-api-controller`` image) from our own module
``stack/capi`` through :func:`testbed.framework.gobuild.go_build`: once, cached by version and module
hash, one heavy build at a time on the machine. The version is stamped as the release's
Makefile does, so the manager logs ``v1.14.2``.

**CRDs.** :func:`crd_files` gives CAPI's own CRDs (``core/config/crd/bases`` of the module zip:
the manager watches MachineHealthChecks, MachineDrainRules, ClusterResourceSets and IPAM claims
besides the four the other tiers install) and :func:`control_plane_crd`, the one CRD of our own
(below). The Metal3 and BareMetalHost CRDs come with CAPM3 and the baremetal-operator
(:mod:`testbed.components.metal3`).

**Running it.** :func:`manager` runs it with :class:`testbed.components.isolated.IsolatedManager`: in a
network namespace of its own that reaches only the API server, so **CAPI's admission webhooks are
off**. What is lost (and why the tier does not need it): the defaulting webhooks
(``cluster.x-k8s.io/cluster-name`` labels, MachineDeployment selector and rollout-strategy
defaults, a ``v`` prefix on versions, replicas from autoscaler annotations) and the validating ones
(immutable ``clusterName``/selectors, the MachineSet/MachineDeployment/Machine field checks,
Cluster topology and ClusterClass checks, MachineHealthCheck checks). The tier writes complete
objects (:func:`testbed.scenarios.metal3.seed_cluster`), so no default is missing. The CRDs of
``core/config/crd/bases`` carry no conversion webhook, so v1beta1 and v1beta2 are served with
``None`` conversion (same fields, other apiVersion): the scaling webhook reads v1beta2, which is
the storage version. The manager talks to the API server as the tier's admin (``system:masters``),
not through CAPI's ClusterRole.

Flags: ``--leader-elect=false`` (one replica), ``--feature-gates=MachinePool=false`` (no
MachinePools here; everything else at its default, MachineSet preflight checks included: the
control plane stand-in reports a version, so they pass), ``--diagnostics-address=0`` (no metrics
server), health on ``127.0.0.1:9440`` inside the namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.components.controlplane import ControlPlane
from testbed.components.isolated import IsolatedManager, klog_workers_started
from testbed.framework.gobuild import files_in, go_build, module_dir, version_ldflags
from testbed.framework.paths import cache_root
from testbed.framework.pins import CAPI
from testbed.framework.progress import Progress, to_stderr

# Every CRD of CAPI's core/config/crd/bases: the manager's controllers and its CRD migrator look these up.
CAPI_MANAGER_CRDS = (
    "cluster.x-k8s.io_clusters.yaml",
    "cluster.x-k8s.io_machinedeployments.yaml",
    "cluster.x-k8s.io_machinesets.yaml",
    "cluster.x-k8s.io_machines.yaml",
    "cluster.x-k8s.io_machinehealthchecks.yaml",
    "cluster.x-k8s.io_machinedrainrules.yaml",
    "cluster.x-k8s.io_machinepools.yaml",
    "cluster.x-k8s.io_clusterclasses.yaml",
    "addons.cluster.x-k8s.io_clusterresourcesets.yaml",
    "addons.cluster.x-k8s.io_clusterresourcesetbindings.yaml",
    "ipam.cluster.x-k8s.io_ipaddresses.yaml",
    "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
    "runtime.cluster.x-k8s.io_extensionconfigs.yaml",
)
# The control plane stand-in (see control_plane_crd).
CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND, CONTROL_PLANE_PLURAL = (
    "controlplane.slime.local",
    "HostedControlPlane",
    "hostedcontrolplanes",
)
MANAGER_BINARY = "core"  # go build names it after the package: sigs.k8s.io/cluster-api/core
READY_CONTROLLERS = ("cluster", "machine", "machineset", "machinedeployment")


# --- build and CRDs ------------------------------------------------------------------------------


def build_manager(progress: Progress = to_stderr) -> Path:
    """The CAPI core controller manager binary (built once from ``stack/capi``, then cached)."""
    stamp = version_ldflags(f"{CAPI.path}/version", CAPI.version, gitCommit="module-proxy")
    built = go_build("capi", "capi", CAPI.version, {MANAGER_BINARY: f"{CAPI.path}/core"}, stamp, progress)
    return built[MANAGER_BINARY]


def control_plane_crd() -> dict[str, Any]:
    """The one CRD of our own: ``HostedControlPlane``, a stand-in for an externally managed control plane provider.

    The workload cluster's control plane here is the tier's own kube-apiserver, run outside CAPI
    (as Kamaji or k0smotron host one). CAPI needs a ``controlPlaneRef`` to know that: without
    one, a Cluster has no control-plane Machine, and CAPI then skips the pre-drain hooks and the
    drain of every deleting Machine (``isDeleteNodeAllowed``: "no control plane nodes"). The
    object reports what the v1beta2 control plane contract asks: ``status.initialization.
    controlPlaneInitialized``, ``status.externalManagedControlPlane: true``, ``spec.version`` and
    ``status.version`` (read by the MachineSet preflight checks). Schemaless (preserve unknown fields).
    """
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{CONTROL_PLANE_PLURAL}.{CONTROL_PLANE_GROUP}",
            "labels": {"cluster.x-k8s.io/v1beta2": "v1alpha1"},
        },
        "spec": {
            "group": CONTROL_PLANE_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": CONTROL_PLANE_KIND,
                "listKind": f"{CONTROL_PLANE_KIND}List",
                "plural": CONTROL_PLANE_PLURAL,
                "singular": CONTROL_PLANE_KIND.lower(),
            },
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def crd_files() -> list[Path]:
    """CAPI's CRDs and the control plane stand-in's (written once into the cache), as files."""
    files = files_in(module_dir(CAPI) / "core" / "config" / "crd" / "bases", CAPI_MANAGER_CRDS, CAPI.at)
    own = cache_root() / f"capi-{CAPI.version}-crds" / f"{CONTROL_PLANE_PLURAL}.{CONTROL_PLANE_GROUP}.yaml"
    own.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(control_plane_crd())
    if not own.is_file() or own.read_text() != text:
        own.write_text(text)
    return [*files, own]


@dataclass(frozen=True)
class CapiBuild:
    """The CAPI core controller manager and the CRDs it needs."""

    manager: Path
    crds: tuple[Path, ...]


def build(progress: Progress = to_stderr) -> CapiBuild:
    """Build the manager and gather the CRDs (a missing Go raises ``BuildUnavailable``)."""
    return CapiBuild(build_manager(progress), tuple(crd_files()))


def manager(binary: Path, cp: ControlPlane, workdir: Path) -> IsolatedManager:
    """The CAPI core controller manager, not yet started; ready once its Cluster, Machine, MachineSet and
    MachineDeployment controllers started their workers."""
    argv = [
        str(binary),
        f"--kubeconfig={cp.kubeconfig}",
        "--leader-elect=false",
        "--health-addr=127.0.0.1:9440",
        "--diagnostics-address=0",
        "--webhook-port=9443",
        f"--webhook-cert-dir={workdir / 'webhook-certs'}",
        "--feature-gates=MachinePool=false",
    ]
    return IsolatedManager("capi-manager", argv, cp, workdir, klog_workers_started(*READY_CONTROLLERS))
