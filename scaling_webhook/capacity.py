"""How many Machines of a Metal3 MachineDeployment can really be provisioned, as pure functions.

Scaling a Metal3 MachineDeployment past the BareMetalHosts that can take its Machines leaves the
extra Machines in Provisioning for ever (metal3-docs#83, CAPBM#188). A mapping with
``capacityAware: true`` caps every *increase* at :func:`count` ``.ceiling``:

* **free**: BareMetalHosts in the MachineDeployment's namespace that CAPM3's ``chooseHost``
  (baremetal/metal3machine_manager.go) would hand to a new Metal3Machine of this pool: matching
  the Metal3MachineTemplate's ``hostSelector``, not being deleted, no ``status.errorMessage``,
  not paused (``baremetalhost.metal3.io/paused``), not marked unhealthy
  (``capm3.metal3.io/unhealthy`` or the older ``capi.metal3.io/unhealthy``), in BMO's
  provisioning state ``available`` (``ready`` before BMO 0.5), and not booked by anyone else:
  either no ``consumerRef`` and no node-reuse label, or **booked for this pool's node reuse**
  (label ``infrastructure.cluster.x-k8s.io/node-reuse: md-<pool>``) with no ``consumerRef``
  (how CAPM3 up to v1.13 books it) or a ``consumerRef`` to **this pool's Cluster** (``kind:
  Cluster``, group ``cluster.x-k8s.io``: how CAPM3 v1.14 books it, #3474 fixing #3190);
* **bound**: hosts already consumed by the pool's own Machines that are not being deleted
  (``consumerRef`` names the Metal3Machine a Machine's ``spec.infrastructureRef`` names).

Every other host is taken: another consumer's, another pool's reuse booking (the label names
another pool), and a **stale** booking (the label names this pool but the ``consumerRef`` is
another Cluster's, or not a Cluster at all). CAPM3 v1.14 itself would hand a host whose label
matches to this pool whatever its ``consumerRef`` says; SliMe counts such a host as taken, so a
stale booking can only cap a pool lower than CAPM3 could serve it, never leave a Machine waiting
for a host it cannot get (docs/scaling.md, "Capacity-aware scale-up"). Which CAPM3 wrote a host
is read from the host itself (a ``consumerRef`` of kind Cluster is v1.14's booking), never from a
setting, so a site in the middle of its CAPM3 upgrade is counted right.

``ceiling = bound + free``: every Machine the pool has or will have needs one host, and a Machine
still waiting for its host will take one of the free ones. A scale-down is never capped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from common.names import BMH_PAUSED_ANNOTATION, CAPI_GROUP, METAL3_GROUP, NODE_REUSE_LABEL, UNHEALTHY_ANNOTATIONS

Obj = dict[str, Any]

METAL3_MACHINE_TEMPLATE = "Metal3MachineTemplate"
AVAILABLE_STATES = frozenset({"available", "ready"})  # "ready" is BMO's name for it before 0.5
# CAPM3 node reuse: a host with this label is kept for the pool its value names; CAPM3 compares
# it with "md-" + the MachineDeployment's name (getMachineDeploymentName in
# baremetal/metal3machine_manager.go), so it is free only for that pool.
REUSE_PREFIX = "md-"


class CapacityUnknown(ValueError):
    """The free hosts cannot be counted now; the message says why (an increase then waits)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    bound: int  # hosts consumed by this pool's live Machines
    free: int  # hosts CAPM3 could give to a new Machine of this pool
    reuse: int = 0  # of ``free``: hosts booked for this pool's node reuse (label, and no or this Cluster's consumerRef)
    # Usable hosts matching the selector whose reuse label names this pool but whose consumerRef is not this pool's
    # Cluster: taken (CAPM3 v1.14 would hand them to the pool; SliMe does not count on them).
    stale: int = 0

    @property
    def ceiling(self) -> int:
        return self.bound + self.free


def template_name(machine_deployment: Obj) -> str:
    """The Metal3MachineTemplate the pool's Machines are made from; raise :class:`CapacityUnknown`."""
    ref = (
        (((machine_deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("infrastructureRef")
    ) or {}
    kind, name = ref.get("kind"), ref.get("name")
    if kind != METAL3_MACHINE_TEMPLATE or not isinstance(name, str) or not name:
        found = f"{kind} {name}" if kind else "none"
        raise CapacityUnknown(
            f"capacityAware needs a MachineDeployment whose infrastructureRef is a {METAL3_MACHINE_TEMPLATE} (found: "
            f"{found})"
        )
    return name


def host_selector(template: Obj) -> Obj:
    """The ``hostSelector`` of a Metal3MachineTemplate (``{}`` selects every host, as in CAPM3)."""
    spec = (((template.get("spec") or {}).get("template") or {}).get("spec")) or {}
    selector = spec.get("hostSelector")
    return selector if isinstance(selector, dict) else {}


def _requirement(expression: Any) -> tuple[str, str, list[str]]:
    if not isinstance(expression, dict) or not isinstance(expression.get("key"), str):
        raise CapacityUnknown(f"hostSelector.matchExpressions: {expression!r} has no key")
    values = expression.get("values") or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise CapacityUnknown(
            f"hostSelector.matchExpressions: values of {expression['key']!r} must be a list of strings"
        )
    # CAPM3 lowercases the operator and hands it to labels.NewRequirement, so the accepted
    # spellings are Kubernetes' selection operators: In, NotIn, Exists, Gt, Lt, =, ==, !=, !.
    # (Notably "DoesNotExist" becomes "doesnotexist", which CAPM3 rejects: no host is chosen.)
    operator = str(expression.get("operator") or "").lower()
    if operator not in {"in", "notin", "exists", "gt", "lt", "=", "==", "!=", "!"}:
        raise CapacityUnknown(
            f"hostSelector.matchExpressions: operator {expression.get('operator')!r} of {expression['key']!r} "
            "is not one CAPM3 accepts (In, NotIn, Exists, Gt, Lt); CAPM3 would choose no host"
        )
    if operator in {"in", "notin"} and not values:
        raise CapacityUnknown(
            f"hostSelector.matchExpressions: {expression['key']!r} {expression.get('operator')} needs values"
        )
    if operator in {"=", "==", "!=", "gt", "lt"} and len(values) != 1:
        raise CapacityUnknown(
            f"hostSelector.matchExpressions: {expression['key']!r} {expression.get('operator')} needs exactly one value"
        )
    if operator in {"exists", "!"} and values:
        raise CapacityUnknown(
            f"hostSelector.matchExpressions: {expression['key']!r} {expression.get('operator')} takes no values"
        )
    if operator in {"gt", "lt"}:
        try:
            int(values[0])
        except ValueError:
            raise CapacityUnknown(
                f"hostSelector.matchExpressions: {expression['key']!r} {expression.get('operator')} needs an integer"
            ) from None
    return expression["key"], operator, values


@dataclass(frozen=True, slots=True)
class HostSelector:
    """A validated ``hostSelector``: ``matchLabels`` and the requirements of ``matchExpressions``."""

    match_labels: tuple[tuple[str, str], ...]
    requirements: tuple[tuple[str, str, tuple[str, ...]], ...]

    @classmethod
    def of(cls, selector: Obj) -> HostSelector:
        """Raise :class:`CapacityUnknown` when CAPM3 could not use ``selector``."""
        match_labels = selector.get("matchLabels") or {}
        if not isinstance(match_labels, dict):
            raise CapacityUnknown("hostSelector.matchLabels must be a map")
        expressions = selector.get("matchExpressions") or []
        if not isinstance(expressions, list):
            raise CapacityUnknown("hostSelector.matchExpressions must be a list")
        requirements = tuple((key, operator, tuple(values)) for key, operator, values in map(_requirement, expressions))
        return cls(tuple((str(k), str(v)) for k, v in match_labels.items()), requirements)

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        return all(_satisfied(operator, values, labels.get(key)) for key, operator, values in self.requirements)


def _satisfied(operator: str, values: tuple[str, ...], value: str | None) -> bool:
    if operator == "in":
        return value in values
    if operator == "notin":
        return value not in values
    if operator == "exists":
        return value is not None
    if operator == "!":
        return value is None
    if operator in {"=", "=="}:
        return value == values[0]
    if operator == "!=":
        return value != values[0]
    try:  # gt / lt: Kubernetes compares the label's value as an integer; a non-integer never matches
        number = int(value) if value is not None else None
    except ValueError:
        return False
    return number is not None and (number > int(values[0]) if operator == "gt" else number < int(values[0]))


def _group(ref: Obj) -> str:
    """The API group of an object reference (``apiVersion`` ``group/version``; "" for the core group)."""
    api_version = ref.get("apiVersion")
    return api_version.rpartition("/")[0] if isinstance(api_version, str) else ""


def _is_cluster(ref: Obj) -> bool:
    """A ``consumerRef`` naming a Cluster API Cluster (by kind and group, any version), as CAPM3 v1.14 books a host."""
    return ref.get("kind") == "Cluster" and _group(ref) == CAPI_GROUP


# What a host is to a pool (:func:`classify`).
BOUND, FREE, REUSE, STALE, TAKEN = "bound", "free", "reuse", "stale", "taken"


def _booking(host: Obj, pool: str, cluster: str | None) -> str:
    """FREE (nobody's), REUSE (booked for this pool), STALE (labelled for this pool, booked by another) or TAKEN.

    CAPM3's ``chooseHost`` of v1.13 skips a host with a ``consumerRef`` or with a reuse label that
    names another pool; v1.14 skips a host whose reuse label names another pool, and a host without
    the label that has a ``consumerRef``. A host whose label names this pool is this pool's in
    both; SliMe asks in addition that its ``consumerRef``, if any, is this pool's Cluster.
    """
    metadata, spec = host.get("metadata") or {}, host.get("spec") or {}
    reuse = (metadata.get("labels") or {}).get(NODE_REUSE_LABEL)
    consumer = spec.get("consumerRef") or None
    if reuse is None:
        return TAKEN if consumer else FREE
    if reuse != f"{REUSE_PREFIX}{pool}":
        return TAKEN  # another pool's booking (or a control plane's: "cp-<name>")
    if consumer is None:
        return REUSE  # CAPM3 up to v1.13: the label alone books it
    if not isinstance(consumer, dict) or not _is_cluster(consumer) or cluster is None:
        return STALE
    namespace = consumer.get("namespace") or metadata.get("namespace")
    if consumer.get("name") != cluster or namespace != metadata.get("namespace"):
        return STALE
    return REUSE  # CAPM3 v1.14: the label and a consumerRef to this pool's Cluster


def _usable(host: Obj) -> bool:
    """Not being deleted, no error, not paused, not unhealthy, and available (``ready`` before BMO 0.5)."""
    metadata, status = host.get("metadata") or {}, host.get("status") or {}
    annotations = metadata.get("annotations") or {}
    return (
        not metadata.get("deletionTimestamp")
        and not status.get("errorMessage")
        and BMH_PAUSED_ANNOTATION not in annotations
        and not any(a in annotations for a in UNHEALTHY_ANNOTATIONS)
        and ((status.get("provisioning") or {}).get("state") in AVAILABLE_STATES)
    )


def host_is_free(host: Obj, pool: str, cluster: str | None = None) -> bool:
    """CAPM3 would give ``host`` to a new Metal3Machine of MachineDeployment ``pool`` of Cluster ``cluster``
    (selector aside). Without ``cluster``, a host booked by a Cluster counts as taken."""
    return _booking(host, pool, cluster) in (FREE, REUSE) and _usable(host)


def _consumer(host: Obj) -> tuple[str, str] | None:
    ref = (host.get("spec") or {}).get("consumerRef") or {}
    if ref.get("kind") != "Metal3Machine" or not isinstance(ref.get("name"), str):
        return None
    if ref.get("apiVersion") is not None and _group(ref) != METAL3_GROUP:
        return None
    return str(ref.get("namespace") or (host.get("metadata") or {}).get("namespace") or ""), ref["name"]


def classify(
    pool: str, cluster: str | None, selector: HostSelector, host: Obj, infrastructure: set[tuple[str, Any]]
) -> str:
    """What ``host`` (in the pool's namespace) is to MachineDeployment ``pool`` of Cluster ``cluster``, whose live
    Machines' Metal3Machines are ``infrastructure``: BOUND, FREE, REUSE (free, booked for this
    pool's node reuse), STALE (taken: labelled for this pool, booked by something else) or TAKEN."""
    if _consumer(host) in infrastructure:
        return BOUND
    if not selector.matches((host.get("metadata") or {}).get("labels") or {}):
        return TAKEN
    booking = _booking(host, pool, cluster)
    if booking != TAKEN and not _usable(host):
        return TAKEN  # a stale booking is worth telling only on a host that could otherwise serve the pool
    return booking


def count(
    namespace: str,
    pool: str,
    template: Obj,
    hosts: Iterable[Obj],
    machines: Iterable[Obj],
    cluster: str | None = None,
) -> Capacity:
    """The capacity of pool ``namespace/pool`` (its Machines are ``machines``, its template ``template``, its
    Cluster ``cluster``: the MachineDeployment's ``spec.clusterName``)."""
    selector = HostSelector.of(host_selector(template))
    infrastructure = {
        (namespace, ((m.get("spec") or {}).get("infrastructureRef") or {}).get("name"))
        for m in machines
        if not (m.get("metadata") or {}).get("deletionTimestamp")
    }
    found = {BOUND: 0, FREE: 0, REUSE: 0, STALE: 0, TAKEN: 0}
    for host in hosts:
        found[classify(pool, cluster, selector, host, infrastructure)] += 1
    return Capacity(bound=found[BOUND], free=found[FREE] + found[REUSE], reuse=found[REUSE], stale=found[STALE])
