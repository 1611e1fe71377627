"""Which tenants may take join data from which Slurm controller: the operator's bindings, as pure rules.

A management cluster is shared: each tenant writes its own namespace (its CAPI Cluster, its
Metal3DataTemplates, its Secrets). A template's labels are the tenant's words, so they cannot be
what decides whose ``slurm.key`` the tenant's nodes get. The operator decides, with bindings in
the manner of Gateway API's ReferenceGrant (a reference across namespaces needs the consent of
whoever owns the target):

- ``<metal3-namespace>=<slurm-namespace>``: Metal3Data in the first namespace may get join data
  from a Slinky Controller in the second, in the management cluster;
- ``*=<slurm-namespace>``: Metal3Data in every namespace may;
- ``<metal3-namespace>=workload:<slurm-namespace>`` (or ``*=workload:...``): the Controller may be
  looked up in the Metal3Data's own workload cluster (through the kubeconfig Secret Cluster API
  writes for that Cluster), in that namespace.

Without a binding, a Metal3Data gets join data only from a Controller in its own namespace of the
management cluster: a tenant who runs its own Slinky next to its Metal3 objects needs nothing
from the operator, and reaches no one else's key.

Which extra join data a template may ask for is the operator's choice too (``--template-opt-ins``):
a template annotation may name only items the operator allows, or those already in the
operator's own default (``--extra-join-data``).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.meta import is_dns1123_label

ANY_NAMESPACE = "*"
WORKLOAD_PREFIX = "workload:"


class BindingError(ValueError):
    """A binding is not of the form ``<metal3-namespace>=[workload:]<slurm-namespace>``; the message says why."""


@dataclass(frozen=True, slots=True)
class Binding:
    metal3_namespace: str  # a namespace, or "*" for every namespace
    slurm_namespace: str
    workload: bool = False  # the Controller is in the Metal3Data's own workload cluster

    def __str__(self) -> str:
        target = f"{WORKLOAD_PREFIX}{self.slurm_namespace}" if self.workload else self.slurm_namespace
        return f"{self.metal3_namespace}={target}"


def parse_binding(text: str) -> Binding:
    source, equals, target = text.strip().partition("=")
    if not equals:
        raise BindingError(f"{text!r} has no '='; write <metal3-namespace>=[workload:]<slurm-namespace>")
    source, target = source.strip(), target.strip()
    workload = target.startswith(WORKLOAD_PREFIX)
    slurm = target.removeprefix(WORKLOAD_PREFIX)
    if source != ANY_NAMESPACE and not is_dns1123_label(source):
        raise BindingError(f"{text!r}: {source!r} is neither a namespace name (a DNS-1123 label) nor '*'")
    if not is_dns1123_label(slurm):
        raise BindingError(f"{text!r}: the Slurm namespace {slurm!r} is not a namespace name (a DNS-1123 label)")
    return Binding(source, slurm, workload)


def parse_bindings(text: str) -> tuple[Binding, ...]:
    """A comma list of bindings (empty: none, so each namespace reaches only its own Controller)."""
    return tuple(dict.fromkeys(parse_binding(part) for part in text.split(",") if part.strip()))


@dataclass(frozen=True, slots=True)
class Bindings:
    bindings: tuple[Binding, ...] = ()

    def allows(self, metal3_namespace: str, slurm_namespace: str, workload: bool) -> bool:
        """May a Metal3Data in ``metal3_namespace`` take join data from a Controller in ``slurm_namespace``
        of the management cluster (``workload`` False) or of its own workload cluster (True)?"""
        if not workload and slurm_namespace == metal3_namespace:
            return True
        return any(
            b.slurm_namespace == slurm_namespace
            and b.workload == workload
            and b.metal3_namespace in (metal3_namespace, ANY_NAMESPACE)
            for b in self.bindings
        )

    def slurm_namespaces(self) -> set[str]:
        """The namespaces of the management cluster any binding reaches (besides each namespace's own)."""
        return {b.slurm_namespace for b in self.bindings if not b.workload}

    def __str__(self) -> str:
        return ",".join(str(b) for b in self.bindings) or "(none)"


LOCAL_CLUSTER = "local"
WORKLOAD_CLUSTER = "workload"


def controller_cluster(label: str, metal3data_cluster: str) -> str:
    """Where a template's Controller is looked up: "" for the management cluster, else the name of the
    Metal3Data's own workload cluster. The template's ``slurm-controller-cluster`` label asks:
    absent or ``local`` (the default), or ``workload`` (also accepted: that cluster's own name).

    A label naming any other cluster is refused (:class:`BindingError`): a template cannot point at a
    cluster its Metal3Data does not belong to, and a Secret's mere existence never decides it."""
    if label in ("", LOCAL_CLUSTER):
        return ""
    if label == WORKLOAD_CLUSTER or (metal3data_cluster and label == metal3data_cluster):
        if not metal3data_cluster:
            raise BindingError(
                "its Metal3Data has no cluster.x-k8s.io/cluster-name label, so it has no workload cluster"
            )
        return metal3data_cluster
    raise BindingError(
        f"it names cluster {label[:63]!r}, but a template chooses only {LOCAL_CLUSTER!r} (the default: the "
        f"management cluster) or {WORKLOAD_CLUSTER!r} (each Metal3Data's own Cluster, here "
        f"{metal3data_cluster or 'none'})"
    )
