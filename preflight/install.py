"""The installed release as the cluster holds it: its two Deployments and the settings their pods run with.

The settings are read the way the pod will: the container's ``env`` (``value`` entries, and
``POD_NAMESPACE`` from the downward API) under its ``args`` (``extraArgs``), through the service's
own settings model, so ``extraEnv`` and ``extraArgs`` are honoured and an invalid value is
reported exactly as the service would report it at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from common.apis import DEPLOYMENTS, SUBJECT_ACCESS_REVIEWS
from common.cli import ConfigError, build_parser
from common.kube import KubeClient, KubeError
from common.settings import ServiceSettings
from injection_webhook.settings import InjectionSettings
from scaling_webhook.settings import ScalingSettings

S = TypeVar("S", bound=ServiceSettings)


@dataclass(frozen=True)
class Component:
    """One webhook of the release: its Deployment and the settings its container starts with."""

    name: str  # injection, scaling
    deployment: dict[str, Any]
    settings: ServiceSettings | None
    problem: str = ""  # why the settings do not parse (the pod would exit 2)

    @property
    def deployment_name(self) -> str:
        return str(self.deployment["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.deployment["metadata"]["namespace"])

    @property
    def service_account(self) -> str:
        spec = self.deployment["spec"]["template"]["spec"]
        return str(spec.get("serviceAccountName") or "default")

    @property
    def username(self) -> str:
        """The webhook's identity as the API server names it."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.deployment["spec"]["template"]["spec"]["containers"]
        return containers[0]


@dataclass(frozen=True)
class Installation:
    namespace: str
    release: str
    injection: Component | None
    scaling: Component | None

    @property
    def components(self) -> list[Component]:
        return [c for c in (self.injection, self.scaling) if c is not None]


def settings_of(settings_type: type[S], deployment: dict[str, Any]) -> S:
    """The settings the Deployment's container starts with; :class:`ConfigError` when they are invalid."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = str(deployment["metadata"]["namespace"])
    values = {
        field: env[settings_type.env_name(field)]
        for field in settings_type.fields()
        if settings_type.env_name(field) in env
    }
    flags = build_parser(settings_type, "webhook").parse_args([str(a) for a in container.get("args") or []])
    values.update({field: value for field, value in vars(flags).items() if value is not None})
    try:
        return settings_type.model_validate(values)
    except ValidationError as exc:
        raise ConfigError("; ".join(str(e["msg"]) for e in exc.errors())) from None


def find_installation(kube: KubeClient, namespace: str, release: str) -> Installation:
    """The release's webhook Deployments in ``namespace`` (by the chart's labels); KubeError when they cannot be
    listed."""
    found: dict[str, Component] = {}
    for name, settings_type in (("injection", InjectionSettings), ("scaling", ScalingSettings)):
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component={name}-webhook"
        listed = kube.request("GET", DEPLOYMENTS.collection(namespace), query=[("labelSelector", selector)])
        items = sorted(listed.get("items") or [], key=lambda d: d["metadata"]["name"])
        if not items:
            continue
        deployment = items[0]
        try:
            found[name] = Component(name, deployment, settings_of(settings_type, deployment))
        except ConfigError as exc:
            found[name] = Component(name, deployment, None, str(exc))
    return Installation(namespace, release, found.get("injection"), found.get("scaling"))


def can_i(
    kube: KubeClient, user: str, verb: str, resource: str, namespace: str, name: str = "", group: str = ""
) -> bool:
    """Whether ``user`` may ``verb`` the resource (a SubjectAccessReview: the API server's own RBAC answer)."""
    attributes = {"verb": verb, "resource": resource, "group": group, "namespace": namespace}
    if name:
        attributes["name"] = name
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attributes},
    }
    answer = kube.request("POST", SUBJECT_ACCESS_REVIEWS.collection(), body=review)
    return bool((answer.get("status") or {}).get("allowed"))


def forbidden(exc: KubeError) -> bool:
    return exc.status == 403
