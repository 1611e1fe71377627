"""The scaling decision, as pure functions: no I/O, no clock, no globals.

``scale_intent`` picks out the requests we act on (an UPDATE of ``deployments/scale`` of a
mapped mirror) and says what to do. ``respond`` turns the outcome of the MachineDeployment
patch into the AdmissionResponse. A validating webhook never returns a patch, so every answer
here is an allow or a deny.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.admission import AdmissionResponse, allow, deny
from scaling_webhook.mappings import Mapping, MappingTable


@dataclass(frozen=True, slots=True)
class ScaleIntent:
    """Set the MachineDeployment of ``mapping`` to ``replicas``."""

    mapping: Mapping
    replicas: int

    @property
    def namespace(self) -> str:
        return self.mapping.machine_deployment[0]

    @property
    def name(self) -> str:
        return self.mapping.machine_deployment[1]


@dataclass(frozen=True, slots=True)
class DryRun:
    """A mapped scale sent with ``dryRun``: allowed with no side effect."""

    mapping: Mapping
    replicas: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """A mapped scale whose Scale object we cannot read: denied with ``reason``."""

    mapping: Mapping
    reason: str


Decision = ScaleIntent | DryRun | Invalid

_REASONS = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid", 503: "ServiceUnavailable"}


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


def scale_intent(request: dict[str, Any], table: MappingTable) -> Decision | None:
    """What this request asks of a MachineDeployment, or None when it is not ours."""
    if not is_deployment_scale_update(request):
        return None
    namespace, name = request.get("namespace"), request.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    mapping = table.get(namespace, name)
    if mapping is None:
        return None
    obj = request.get("object")
    spec = obj.get("spec") if isinstance(obj, dict) else None
    replicas = spec.get("replicas") if isinstance(spec, dict) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        return Invalid(mapping, "Scale object has no integer spec.replicas")
    if replicas < 0:
        return Invalid(mapping, f"Scale object has a negative spec.replicas ({replicas})")
    if request.get("dryRun") is True:
        return DryRun(mapping, replicas)
    return ScaleIntent(mapping, replicas)


def respond(decision: Decision, error: str | None = None, code: int = 503) -> AdmissionResponse:
    """The answer for a mapped request; ``error`` is why the MachineDeployment patch failed.

    ``code`` is the HTTP status the API server returns to the scaler: 503 for a failure that
    may pass (timeout, unreachable, server error), 403/404 for one that needs a person.
    """
    mapping = decision.mapping
    md, mirror = mapping.machine_deployment_ref, mapping.mirror_ref
    if isinstance(decision, Invalid):
        return deny(f"cannot scale MachineDeployment {md} from mirror {mirror}: {decision.reason}", code=400, reason="BadRequest")
    if isinstance(decision, DryRun):
        return allow(f"dry run: MachineDeployment {md} would be scaled to {decision.replicas} (not applied)")
    if error is not None:
        return deny(
            f"cannot scale MachineDeployment {md} to {decision.replicas} replicas from mirror {mirror}: {error}; "
            "the mirror keeps its current replicas, retry later",
            code=code,
            reason=_REASONS.get(code, "Forbidden"),
        )
    return allow(f"MachineDeployment {md} scaled to {decision.replicas}")
