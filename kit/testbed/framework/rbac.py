"""A small, faithful model of Kubernetes RBAC authorization, for checking rendered charts.

``rbac_allows(objects, service_account, namespace, request)`` answers "would the API server let
ServiceAccount ``namespace/service_account`` make ``request``, given only the RBAC objects in
``objects`` (plus the built-in discovery roles)?" The matching follows
``k8s.io/kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go``:

* RoleBindings grant their Role's (or ClusterRole's) rules in the binding's namespace only;
  ClusterRoleBindings grant ClusterRole rules in every namespace and cluster wide;
* subjects: the ServiceAccount itself, the User ``system:serviceaccount:<ns>:<name>``, and the
  Groups ``system:serviceaccounts``, ``system:serviceaccounts:<ns>``, ``system:authenticated``;
* ``apiGroups``/``verbs`` match exactly or ``*``; ``resources`` match ``*``,
  ``resource/subresource`` exactly, or ``*/subresource``;
* ``resourceNames`` only match a request that names one object: get/patch/update/delete of a
  name, or list/watch whose ``fieldSelector`` is ``metadata.name=<name>`` (the API server then
  sets the request's name). ``create`` and plain list/watch never match a name-restricted rule;
* non-resource requests are matched against ``nonResourceURLs`` (``/path`` or ``/prefix*``);
  the discovery paths are always allowed (``system:discovery`` / ``system:public-info-viewer``
  are bound to every authenticated user).

The chart tests feed it the API-call list of docs/interfaces.md; the integration suite can feed
it the requests recorded by the API emulator through :func:`assert_rbac_covers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ApiRequest", "rbac_allows", "assert_rbac_covers", "DISCOVERY_PATHS"]

RBAC_GROUP = "rbac.authorization.k8s.io"

# What the default ClusterRoles system:discovery, system:basic-user and
# system:public-info-viewer allow to every authenticated user.
DISCOVERY_PATHS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
    "/healthz",
    "/livez",
    "/readyz",
)


@dataclass(frozen=True)
class ApiRequest:
    """One request as RBAC sees it (the authorizer's attributes)."""

    verb: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""  # "" = cluster scoped, or a list/watch across all namespaces
    name: str = ""  # set for get/patch/..., and for list/watch with fieldSelector metadata.name=<name>
    non_resource: str = ""  # the path, for a non-resource request (then resource fields are ignored)

    def __str__(self) -> str:
        if self.non_resource:
            return f"{self.verb} {self.non_resource}"
        res = self.resource + (f"/{self.subresource}" if self.subresource else "")
        group = self.api_group or "core"
        where = f"ns={self.namespace}" if self.namespace else "cluster-wide"
        named = f" name={self.name}" if self.name else ""
        return f"{self.verb} {group}/{res} {where}{named}"


def _subject_matches(subject: Mapping[str, Any], sa: str, sa_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return name == sa and subject.get("namespace") == sa_ns
    if kind == "User":
        return name == f"system:serviceaccount:{sa_ns}:{sa}"
    if kind == "Group":
        return name in ("system:serviceaccounts", f"system:serviceaccounts:{sa_ns}", "system:authenticated")
    return False


def _has(values: Iterable[str] | None, wanted: str) -> bool:
    values = list(values or ())
    return "*" in values or wanted in values


def _resource_matches(rule_resources: Iterable[str] | None, resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule_resources or ():
        if r == "*" or r == combined:
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def _non_resource_matches(rule_urls: Iterable[str] | None, path: str) -> bool:
    for url in rule_urls or ():
        if url == "*" or url == path:
            return True
        if url.endswith("*") and path.startswith(url[:-1]):
            return True
    return False


def _rule_allows(rule: Mapping[str, Any], req: ApiRequest) -> bool:
    if not _has(rule.get("verbs"), req.verb):
        return False
    if req.non_resource:
        return _non_resource_matches(rule.get("nonResourceURLs"), req.non_resource)
    if not _has(rule.get("apiGroups"), req.api_group):
        return False
    if not _resource_matches(rule.get("resources"), req.resource, req.subresource):
        return False
    names = rule.get("resourceNames") or []
    if names:
        return bool(req.name) and req.name in names
    return True


def _is_discovery(path: str) -> bool:
    return _non_resource_matches(DISCOVERY_PATHS, path)


def _rbac_objects(objects: Iterable[Mapping[str, Any] | None]) -> list[Mapping[str, Any]]:
    out = []
    for obj in objects:
        if not obj:
            continue
        if str(obj.get("apiVersion", "")).startswith(RBAC_GROUP + "/") and obj.get("kind") in (
            "Role",
            "ClusterRole",
            "RoleBinding",
            "ClusterRoleBinding",
        ):
            out.append(obj)
    return out


def rbac_allows(
    rules_objects: Iterable[Mapping[str, Any] | None], service_account: str, namespace: str, request: ApiRequest | Any
) -> bool:
    """Whether ``namespace/service_account`` may make ``request`` under these RBAC objects.

    ``request`` may be an :class:`ApiRequest` or any object with the same attributes.
    """
    req = (
        request
        if isinstance(request, ApiRequest)
        else ApiRequest(
            verb=request.verb,
            api_group=getattr(request, "api_group", "") or "",
            resource=getattr(request, "resource", "") or "",
            subresource=getattr(request, "subresource", "") or "",
            namespace=getattr(request, "namespace", "") or "",
            name=getattr(request, "name", "") or "",
            non_resource=getattr(request, "non_resource", "") or "",
        )
    )
    if req.non_resource and req.verb == "get" and _is_discovery(req.non_resource):
        return True

    objs = _rbac_objects(rules_objects)
    roles = {
        (o.get("metadata", {}).get("namespace", ""), o["metadata"]["name"]): o for o in objs if o["kind"] == "Role"
    }
    cluster_roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterRole"}

    for binding in objs:
        kind = binding["kind"]
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(_subject_matches(s, service_account, namespace) for s in binding.get("subjects") or ()):
            continue
        ref = binding.get("roleRef", {})
        if kind == "RoleBinding":
            b_ns = binding.get("metadata", {}).get("namespace", "")
            # A RoleBinding only covers namespaced requests in its own namespace.
            if req.non_resource or req.namespace != b_ns:
                continue
            role = (
                roles.get((b_ns, ref.get("name"))) if ref.get("kind") == "Role" else cluster_roles.get(ref.get("name"))
            )
        else:
            if ref.get("kind") != "ClusterRole":
                continue
            role = cluster_roles.get(ref.get("name"))
        if role is None:
            continue
        if any(_rule_allows(rule, req) for rule in role.get("rules") or ()):
            return True
    return False


def assert_rbac_covers(
    rendered_objects: Iterable[Mapping[str, Any] | None],
    service_account: str,
    namespace: str,
    requests: Iterable[ApiRequest | Any],
) -> None:
    """Fail (AssertionError) listing every request the rendered RBAC does not allow."""
    objects = list(rendered_objects)
    denied = [
        str(r if isinstance(r, ApiRequest) else r)
        for r in requests
        if not rbac_allows(objects, service_account, namespace, r)
    ]
    assert not denied, f"RBAC of {namespace}/{service_account} does not allow:\n  " + "\n  ".join(denied)
