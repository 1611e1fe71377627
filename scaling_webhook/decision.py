"""The scaling decision, as pure functions: no I/O, no clock, no globals.

The webhook never writes on admission: a review may be forged, or never stored (another webhook
may deny it), so the MachineDeployment follows only the mirror *as stored*, moved by the leader's
reconciler (docs/scaling.md). Admission checks that a scale is one kube-apiserver would send now
and that its MachineDeployment can follow it, and says what will happen:

- :func:`scale_target` picks out the requests we act on: an UPDATE of a mapped mirror's
  ``deployments/scale``, or of the mirror Deployment itself that changes ``spec.replicas`` (the
  side door: ``kubectl patch deployment`` moves the pool as surely as ``/scale`` does, so it meets
  the same rules);
- :func:`decide` checks the request against what the caches observed (:class:`Observed`);
- :func:`respond` turns the decision into the AdmissionResponse (an allow or a deny: a
  validating webhook never returns a patch).

:func:`target_replicas`, :func:`pause_reason` and :func:`autoscaler_annotations` are shared with
the reconciler, so both read the cluster the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from common.admission import AdmissionResponse, allow, bounded, deny, requester
from common.names import AUTOSCALER_ANNOTATIONS, CAPI_PAUSED_ANNOTATION
from scaling_webhook.mappings import MAX_INT32, Mapping, MappingTable

DRY_RUN_WARNING_PREFIX = "SliMe: "  # the warning a dry-run scale of a mapped mirror returns (slime-check reads it)

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    503: "ServiceUnavailable",
}


@dataclass(frozen=True, slots=True)
class Observed:
    """What the watches hold for one mapping: the stored mirror, MachineDeployment and Cluster (None: absent)."""

    mirror: dict[str, Any] | None
    machine_deployment: dict[str, Any] | None
    cluster: dict[str, Any] | None = None
    fresh: bool = False  # the mirror was just read from the API server, not from the cache


@dataclass(frozen=True, slots=True)
class Accepted:
    """A consistent scale of a mapped mirror: the MachineDeployment will follow it once it is stored."""

    mapping: Mapping
    replicas: int
    target: int  # what the MachineDeployment will be set to (capped at maxReplicas)
    paused: str = ""  # why it waits, when its MachineDeployment or Cluster is paused

    @property
    def capped(self) -> bool:
        return self.target != self.replicas


@dataclass(frozen=True, slots=True)
class DryRun:
    """A mapped scale sent with ``dryRun``: allowed, nothing follows."""

    mapping: Mapping
    replicas: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """A mapped scale whose Scale object we cannot accept: denied 400 with ``reason``."""

    mapping: Mapping
    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A scale that is not consistent with the cluster, or whose MachineDeployment cannot follow."""

    mapping: Mapping
    replicas: int
    reason: str
    code: int


@dataclass(frozen=True, slots=True)
class NotAllowed:
    """A scale by a requester not in ``--scale-requesters``: denied 403."""

    mapping: Mapping
    requester: str
    allowed: frozenset[str]


@dataclass(frozen=True, slots=True)
class Recheck:
    """The review's ``oldObject`` does not match the cached mirror: read the mirror again, then decide."""

    mapping: Mapping


Decision = Accepted | DryRun | Invalid | Refused | NotAllowed | Recheck


def is_deployment_scale_update(request: dict[str, Any]) -> bool:
    """An UPDATE of ``apps`` ``deployments/scale`` carrying a Scale object."""
    if request.get("operation") != "UPDATE" or request.get("subResource") != "scale":
        return False
    kind, resource = request.get("kind"), request.get("resource")
    return (
        isinstance(kind, dict)
        and kind.get("kind") == "Scale"
        and isinstance(resource, dict)
        and resource.get("resource") == "deployments"
        and resource.get("group") == "apps"
    )


def is_deployment_update(request: dict[str, Any]) -> bool:
    """An UPDATE of an ``apps`` Deployment itself (not a subresource)."""
    if request.get("operation") != "UPDATE" or request.get("subResource"):
        return False
    kind, resource = request.get("kind"), request.get("resource")
    return (
        isinstance(kind, dict)
        and kind.get("kind") == "Deployment"
        and isinstance(resource, dict)
        and resource.get("resource") == "deployments"
        and resource.get("group") == "apps"
    )


def requested_replicas(request: dict[str, Any], side: str = "object") -> int | None:
    """``spec.replicas`` of the request's ``object`` (or ``oldObject``): a Scale's, or a Deployment's."""
    if is_deployment_update(request):
        return replicas_of(request.get(side))
    return scale_replicas(request.get(side))


def scale_target(request: dict[str, Any], table: MappingTable) -> Mapping | None:
    """The mapping whose mirror this request scales, or None when it is not ours: a ``/scale`` UPDATE, or a
    Deployment UPDATE that changes ``spec.replicas`` (one that leaves them is not a scale)."""
    if is_deployment_update(request):
        old, new = request.get("oldObject"), request.get("object")
        if isinstance(old, dict) and isinstance(new, dict) and replicas_of(old) == replicas_of(new):
            return None
    elif not is_deployment_scale_update(request):
        return None
    namespace, name = request.get("namespace"), request.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return table.get(namespace, name)


def refused_requester(request: dict[str, Any], mapping: Mapping, allowed: frozenset[str]) -> NotAllowed | None:
    """A scale by someone not in ``allowed`` (``--scale-requesters``); None when allowed is empty (anyone
    the API server authorized) or the requester is in it."""
    who = requester(request)
    if not allowed or who in allowed:
        return None
    return NotAllowed(mapping, who, allowed)


def replicas_of(obj: Any) -> int | None:
    """``spec.replicas`` of an object, when it is an integer."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    replicas = spec.get("replicas") if isinstance(spec, dict) else None
    return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None


def scale_replicas(obj: Any) -> int | None:
    """``spec.replicas`` of an ``autoscaling/v1`` Scale as kube-apiserver sends it in a review.

    ``ScaleSpec.Replicas`` is an ``int32`` with ``omitempty``: a Scale to 0, and the stored Scale of
    a Deployment at 0, arrive as ``"spec": {}``. So a missing ``replicas`` in a ``spec`` map is 0
    (found against kube-apiserver v1.36.4 by the whole-loop tier: every scale from or to 0 was refused).
    """
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if isinstance(spec, dict) and "replicas" not in spec:
        return 0
    return replicas_of(obj)


def _annotations(obj: dict[str, Any] | None) -> dict[str, Any]:
    annotations = ((obj or {}).get("metadata") or {}).get("annotations")
    return annotations if isinstance(annotations, dict) else {}


def target_replicas(mapping: Mapping, mirror_replicas: int) -> int:
    """What the MachineDeployment is set to for a mirror at ``mirror_replicas``: capped at maxReplicas."""
    if mapping.max_replicas is not None:
        return min(mirror_replicas, mapping.max_replicas)
    return mirror_replicas


def pause_reason(mapping: Mapping, machine_deployment: dict[str, Any] | None, cluster: dict[str, Any] | None) -> str:
    """Why Cluster API says not to touch this MachineDeployment now ("" when nothing is paused)."""
    md = mapping.machine_deployment_ref
    if ((machine_deployment or {}).get("spec") or {}).get("paused") is True:
        return f"MachineDeployment {md} has spec.paused"
    if CAPI_PAUSED_ANNOTATION in _annotations(machine_deployment):
        return f"MachineDeployment {md} has the {CAPI_PAUSED_ANNOTATION} annotation"
    if cluster is not None:
        name = (cluster.get("metadata") or {}).get("name")
        if (cluster.get("spec") or {}).get("paused") is True:
            return f"Cluster {mapping.machine_deployment[0]}/{name} has spec.paused"
        if CAPI_PAUSED_ANNOTATION in _annotations(cluster):
            return f"Cluster {mapping.machine_deployment[0]}/{name} has the {CAPI_PAUSED_ANNOTATION} annotation"
    return ""


def autoscaler_annotations(machine_deployment: dict[str, Any] | None) -> list[str]:
    """cluster-autoscaler's node-group annotations on a MachineDeployment (it has another writer then)."""
    annotations = _annotations(machine_deployment)
    return [a for a in AUTOSCALER_ANNOTATIONS if a in annotations]


def decide(request: dict[str, Any], mapping: Mapping, observed: Observed | None) -> Decision:
    """What to answer to a scale of ``mapping``'s mirror, given what the watches observed (None: not synced)."""
    replicas = requested_replicas(request)
    what = "Deployment" if is_deployment_update(request) else "Scale object"
    if replicas is None:
        return Invalid(mapping, f"{what} has no integer spec.replicas")
    if replicas < 0:
        return Invalid(mapping, f"{what} has a negative spec.replicas ({replicas})")
    if replicas > MAX_INT32:
        return Invalid(
            mapping,
            f"{what} has spec.replicas {replicas}, more than a Kubernetes replica count may be ({MAX_INT32})",
        )
    if request.get("dryRun") is True:
        return DryRun(mapping, replicas)
    if observed is None:
        return Refused(mapping, replicas, "the webhook has not listed the mirror and MachineDeployment yet", 503)
    if observed.mirror is None:
        if not observed.fresh:
            return Recheck(mapping)
        return Refused(mapping, replicas, f"mirror Deployment {mapping.mirror_ref} does not exist", 404)
    stored, old = replicas_of(observed.mirror), requested_replicas(request, "oldObject")
    if old != stored:
        if not observed.fresh:
            return Recheck(mapping)
        return Refused(
            mapping,
            replicas,
            f"the review's oldObject.spec.replicas ({old}) is not the stored mirror's ({stored}); "
            "kube-apiserver sends the stored object, so this review is stale or forged",
            409,
        )
    if observed.machine_deployment is None:
        return Refused(mapping, replicas, f"MachineDeployment {mapping.machine_deployment_ref} not found", 404)
    managed = autoscaler_annotations(observed.machine_deployment)
    if managed:
        return Refused(
            mapping,
            replicas,
            f"MachineDeployment {mapping.machine_deployment_ref} is a cluster-autoscaler node group "
            f"({', '.join(managed)}); it must have one writer, so SliMe does not scale it",
            409,
        )
    paused = pause_reason(mapping, observed.machine_deployment, observed.cluster)
    return Accepted(mapping, replicas, target_replicas(mapping, replicas), paused)


def respond(decision: Decision) -> AdmissionResponse:
    """The answer for a mapped request (a Recheck must be decided again first)."""
    mapping = decision.mapping
    md, mirror = mapping.machine_deployment_ref, mapping.mirror_ref
    if isinstance(decision, Invalid):
        return deny(
            f"cannot scale MachineDeployment {md} from mirror {mirror}: {decision.reason}",
            code=400,
            reason="BadRequest",
        )
    if isinstance(decision, NotAllowed):
        return deny(
            f"requester {bounded(decision.requester) or '(none)'} may not scale mirror Deployment {mirror}: only "
            f"{', '.join(sorted(decision.allowed))} may (--scale-requesters)"
        )
    if isinstance(decision, DryRun):
        # The warning reaches whoever asked (kubectl scale --dry-run=server shows it): with failurePolicy
        # Ignore, it is also the only sign a dry run gives that the webhook was called at all (slime-check).
        message = f"dry run: MachineDeployment {md} would follow the mirror to {decision.replicas} (not applied)"
        return replace(allow(message), warnings=(f"{DRY_RUN_WARNING_PREFIX}{message}",))
    if isinstance(decision, Refused):
        return deny(
            f"cannot scale MachineDeployment {md} to {decision.replicas} replicas from mirror {mirror}: "
            f"{decision.reason}; the mirror keeps its current replicas",
            code=decision.code,
            reason=_REASONS.get(decision.code, "Forbidden"),
        )
    if isinstance(decision, Recheck):
        raise ValueError("a Recheck is decided again with a fresh mirror before it is answered")
    message = f"MachineDeployment {md} follows the stored mirror to {decision.target}"
    warnings: list[str] = []
    if decision.capped:
        note = f"capped at maxReplicas {mapping.max_replicas} (the mirror asks {decision.replicas})"
        message += f", {note}"
        warnings.append(f"MachineDeployment {md} is {note}")
    if decision.paused:
        message += f"; it waits: {decision.paused}"
        warnings.append(f"MachineDeployment {md} waits: {decision.paused}")
    return AdmissionResponse(allowed=True, outcome="allowed", message=message, warnings=tuple(warnings))
