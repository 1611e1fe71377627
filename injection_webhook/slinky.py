"""Slinky's objects as SliMe reads them, walked once for the webhook (over its caches) and slime-check
(over live reads): which Controller runs a namespace's slurmctld, its pods, and its key Secrets.

The chain (Slinky slurm-operator): each slurmctld pod is owned by a StatefulSet, which is owned by
a ``Controller`` (``slinky.slurm.net``). A namespace may run several Controllers; a template
chooses one with ``slurm-controller-name``. The key Secrets are named by the Controller's
``spec.slurmKeyRef`` and ``spec.jwtKeyRef`` (``jwtHs256KeyRef`` is its deprecated alias, and the
v1alpha1 field); without them, the Helm chart's defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from common.meta import owner_name
from common.names import CONTROLLER_NAME_LABEL, SLINKY_GROUP
from injection_webhook.confserver import shown

# Slinky's Helm chart names the key Secrets after the Controller when the spec names none.
SLURM_KEY_SECRET_SUFFIX = "-auth-slurm"
SLURM_KEY_DEFAULT_KEY = "slurm.key"
JWT_KEY_SECRET_SUFFIX = "-auth-jwths256"
JWT_KEY_DEFAULT_KEY = "jwt_hs256.key"

Lookup = Callable[[str], dict[str, Any] | None]  # an object of the namespace by name (None: absent)


# What kept a namespace's slurmctld from one Controller (:attr:`NotFound.cause`), for a caller that
# tells the operator what to change.
NO_POD = "no-pod"  # no live pod matches the selector
NOT_OWNED = "not-owned"  # pods match, but none is owned (through a StatefulSet) by an existing, wanted Controller
SEVERAL = "several"  # the pods belong to several Controllers and none was chosen
EXTERNAL = "external"  # the chosen Controller's slurmctld runs outside Kubernetes (Slinky v1.1's spec.external)


class NotFound(Exception):
    """The namespace's slurmctld cannot be tied to one Controller; ``reason`` says what is missing and where,
    ``cause`` which of :data:`NO_POD`, :data:`NOT_OWNED`, :data:`SEVERAL` it is."""

    def __init__(self, reason: str, cause: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Slurmctld:
    """The Controller a namespace's slurmctld pods belong to."""

    name: str  # the Controller's name
    controller: dict[str, Any]
    statefulset: str
    pods: tuple[dict[str, Any], ...]  # its live slurmctld pods, by name


@dataclass(frozen=True, slots=True)
class KeyRef:
    """Where a Controller keeps one of its keys."""

    what: str  # "slurm key" or "JWT key"
    field: str  # the Controller's spec field that names it
    secret: str
    key: str


def find_slurmctld(
    pods: Iterable[dict[str, Any]],
    statefulset: Lookup,
    controller: Lookup,
    namespace: str,
    wanted: str,
    selector: str,
    where: str,
) -> Slurmctld:
    """The one Controller whose StatefulSet owns the live pods matching ``selector`` (``wanted``: only that one).

    ``where`` names the namespace and cluster in messages. :class:`NotFound` when none or several match."""
    live = sorted(
        (p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")),
        key=lambda p: (p.get("metadata") or {}).get("name", ""),
    )
    if not live:
        _refuse_external(controller, namespace, wanted, where)
        raise NotFound(f"no slurmctld pod matches {selector} in {where}", NO_POD)
    found: dict[str, tuple[list[dict[str, Any]], dict[str, Any], str]] = {}
    problems = []
    for pod in live:
        pod_name = (pod.get("metadata") or {}).get("name", "")
        owner_sts = owner_name(pod.get("metadata"), "StatefulSet", "apps")
        sts = statefulset(owner_sts) if owner_sts else None
        controller_name = owner_name(sts.get("metadata"), "Controller", SLINKY_GROUP) if sts else None
        if owner_sts is None or controller_name is None:
            problems.append(f"pod {namespace}/{pod_name} is not owned by a StatefulSet of a Slinky Controller")
            continue
        if wanted and controller_name != wanted:
            continue
        obj = controller(controller_name)
        if obj is None:
            problems.append(f"Controller {namespace}/{controller_name} ({SLINKY_GROUP}) does not exist")
            continue
        found.setdefault(controller_name, ([], obj, owner_sts))[0].append(pod)
    if not found:
        _refuse_external(controller, namespace, wanted, where)
        detail = "; ".join(problems) or f"no slurmctld pod belongs to Controller {wanted}"
        raise NotFound(f"{detail} ({where})", NOT_OWNED)
    if len(found) > 1:
        raise NotFound(
            f"{where} runs several Slinky Controllers ({', '.join(sorted(found))}); "
            f"choose one with label {CONTROLLER_NAME_LABEL} on the Metal3DataTemplate",
            SEVERAL,
        )
    name, (owned, obj, sts_name) = next(iter(found.items()))
    return Slurmctld(name, obj, sts_name, tuple(owned))


def _refuse_external(controller: Lookup, namespace: str, wanted: str, where: str) -> None:
    """Raise :class:`NotFound` (:data:`EXTERNAL`) when the wanted Controller is an external one.

    Slinky v1.1 lets a Controller stand for a slurmctld outside Kubernetes (``spec.external: true``,
    ``spec.externalConfig.host``/``port``; "other fields are ignored", so no key Secret need be
    named). SliMe joins hosts to the slurmctld Slinky runs, whose pods, Service and key Secrets it can
    check; for an external one it has neither, so it says so instead of "no pod"."""
    obj = controller(wanted) if wanted else None
    spec = (obj or {}).get("spec") or {}
    if spec.get("external") is not True:
        return
    config = spec.get("externalConfig") or {}
    at = f"{config.get('host', '?')}:{config.get('port', '?')}"
    raise NotFound(
        f"Controller {namespace}/{wanted} is external (spec.external: true, slurmctld at {shown(at)} outside "
        f"Kubernetes; {where}): SliMe joins hosts only to a slurmctld that Slinky runs in the cluster",
        EXTERNAL,
    )


def slurm_key_ref(controller_name: str, controller: dict[str, Any]) -> KeyRef:
    ref = (controller.get("spec") or {}).get("slurmKeyRef") or {}
    return KeyRef(
        "slurm key",
        "slurmKeyRef",
        ref.get("name") or f"{controller_name}{SLURM_KEY_SECRET_SUFFIX}",
        ref.get("key") or SLURM_KEY_DEFAULT_KEY,
    )


def jwt_key_ref(controller_name: str, controller: dict[str, Any]) -> KeyRef:
    spec = controller.get("spec") or {}
    ref = spec.get("jwtKeyRef") or spec.get("jwtHs256KeyRef") or {}
    return KeyRef(
        "JWT key",
        "jwtKeyRef",
        ref.get("name") or f"{controller_name}{JWT_KEY_SECRET_SUFFIX}",
        ref.get("key") or JWT_KEY_DEFAULT_KEY,
    )
