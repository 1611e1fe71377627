"""The wire side of the emulated API server: what a request is (RequestInfo, from its path and query), who sent it,
how the calls are recorded, and the small shapes of answers (pages, warnings, a Scale on the wire)."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .resources import Resource
from .store import Obj

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

DEFAULT_WATCH_TIMEOUT = 1800.0  # the API server's default upper bound (30 min)
PATCH_RETRIES = 5
VERSION_INFO = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-kubemu",
    "gitCommit": "kubemu",
    "gitTreeState": "clean",
    "buildDate": "2024-01-01T00:00:00Z",
    "goVersion": "go1.22",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass
class RecordedRequest:
    """One served request, in the terms an RBAC rule uses (verb, apiGroup, resource, ...)."""

    verb: str
    api_group: str
    version: str
    resource: str
    subresource: str
    namespace: str
    name: str
    path: str
    method: str
    status_code: int  # 0 when the connection was dropped by a fault
    user_agent: str
    non_resource: bool = False
    query: str = ""


@dataclass
class RequestInfo:
    """Kubernetes' RequestInfo: what a URL addresses."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    non_resource: bool = True
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    namespace_in_path: bool = False
    extra_parts: bool = False
    user_info: dict[str, Any] = field(default_factory=dict)  # who asked, as admission reviews name them
    warnings: list[str] = field(default_factory=list)  # the admission webhooks' warnings, sent as Warning headers


ADMIN = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}


def user_info(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The requester as kube-apiserver would name it: kubemu's one client identity (the admin of its
    kubeconfig), or whom an ``Impersonate-User`` header names, with ``Impersonate-Group`` groups and
    the groups kube-apiserver adds (``system:authenticated``; a ServiceAccount's
    ``system:serviceaccounts`` and ``system:serviceaccounts:<namespace>``)."""
    user = ""
    groups: list[str] = []
    for key, value in headers:
        name = key.decode("latin-1").lower()
        if name == "impersonate-user":
            user = value.decode("latin-1")
        elif name == "impersonate-group":
            groups.append(value.decode("latin-1"))
    if not user:
        return dict(ADMIN)
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}"]
    return {"username": user, "groups": [*groups, "system:authenticated"]}


def parse_request_info(method: str, path: str, query: dict[str, str]) -> RequestInfo:
    """Split a URL the way the API server's RequestInfoResolver does."""
    parts = [p for p in path.strip("/").split("/") if p]
    info = RequestInfo(method=method, path=path, query=query, verb=method.lower())
    if parts[:1] == ["api"] and len(parts) >= 3:
        info.version, rest = parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        info.group, info.version, rest = parts[1], parts[2], parts[3:]
    else:
        return info  # discovery, /version, health: non-resource URLs
    info.non_resource = False
    if rest[0] == "namespaces" and len(rest) > 1:
        info.namespace = rest[1]
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            info.namespace_in_path = True
            rest = rest[2:]
    info.resource = rest[0]
    info.name = rest[1] if len(rest) > 1 else ""
    info.subresource = rest[2] if len(rest) > 2 else ""
    info.extra_parts = len(rest) > 3
    watch = query.get("watch", "").lower() in ("true", "1")
    info.verb = {
        "GET": "get" if info.name else ("watch" if watch else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if info.name else "deletecollection",
    }.get(method, method.lower())
    return info


def paging(query: dict[str, str]) -> tuple[tuple[str, str] | None, int, str]:
    """``limit``/``continue``. The token carries the last key served and the first page's
    resourceVersion. That is not a consistent snapshot as etcd gives, but a watch from that
    resourceVersion replays whatever changed between pages."""
    limit_text = query.get("limit", "")
    if limit_text and not limit_text.isdigit():
        raise ApiError(400, "BadRequest", f"invalid limit {limit_text!r}")
    token = query.get("continue", "")
    if not token:
        return None, int(limit_text or 0), ""
    try:
        state = json.loads(base64.urlsafe_b64decode(token.encode()))
        return (str(state["after"][0]), str(state["after"][1])), int(limit_text or 0), str(state["rv"])
    except (ValueError, KeyError, TypeError, IndexError):
        raise ApiError(400, "BadRequest", "invalid continue token") from None


def page_metadata(items: list[Obj], rv: str, remaining: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": rv}
    if remaining:
        metadata["remainingItemCount"] = remaining
        state = {"after": list(key(items[-1])), "rv": rv}
        metadata["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    return metadata


def warning_header(text: str) -> str:
    """A ``Warning`` header value as kube-apiserver writes it: ``299 - "<text>"``, quotes and backslashes escaped."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'


def key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def method_not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


def wire_scale(scale: Obj) -> Obj:
    """A Scale as kube-apiserver serializes it: ``ScaleSpec.Replicas`` is an int32
    with ``omitempty``, so 0 is left out."""
    spec = scale.get("spec")
    if isinstance(spec, dict) and type(spec.get("replicas")) is int and spec["replicas"] == 0:
        del spec["replicas"]
    return scale


def get_path(obj: Obj, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def set_path(obj: Obj, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    cur = obj
    for part in parents:
        cur = cur.setdefault(part, {})
    cur[last] = value


def fold_string_data(res: Resource, obj: Obj) -> None:
    """As kube-apiserver does for a Secret, before admission:
    stringData's entries go into data (base64), winning over data's."""
    if res.kind != "Secret" or res.group or "stringData" not in obj:
        return
    string_data = obj.pop("stringData") or {}
    if not isinstance(string_data, dict):
        raise ApiError(422, "Invalid", "Secret.stringData must be a map of strings")
    current = obj.get("data")
    data: Obj = current if isinstance(current, dict) else {}
    data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()})
    obj["data"] = data


def decode(body: bytes) -> Obj:
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding request body: {exc}") from exc
    if not isinstance(obj, dict):
        raise ApiError(400, "BadRequest", "request body must be a JSON object")
    return obj
