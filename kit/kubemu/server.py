"""The HTTP layer: a plain ASGI app that speaks the Kubernetes REST API over the store.

Plain ASGI (no framework) because Kubernetes paths need their own parsing (RequestInfo), watch
streams need the raw `send`/`receive`, and dropping a connection needs uvicorn's transport.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from .admission import AdmissionAttributes, AdmissionDenied, AdmissionHook
from .errors import ApiError, status_body
from .faults import FaultSet
from .patch import apply_patch
from .resources import Registry, Resource
from .selectors import FieldSelector, LabelSelector, match_labels_to_string
from .store import Obj, Store, WatchEvent
from .tables import table, wants_table

log = logging.getLogger("kubemu")

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


def _paging(query: dict[str, str]) -> tuple[tuple[str, str] | None, int, str]:
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


def _page_metadata(items: list[Obj], rv: str, remaining: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": rv}
    if remaining:
        metadata["remainingItemCount"] = remaining
        state = {"after": list(_key(items[-1])), "rv": rv}
        metadata["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    return metadata


def warning_header(text: str) -> str:
    """A ``Warning`` header value as kube-apiserver writes it: ``299 - "<text>"``, quotes and backslashes escaped."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def _method_not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


def _wire_scale(scale: Obj) -> Obj:
    """A Scale as kube-apiserver serializes it: ``ScaleSpec.Replicas`` is an int32
    with ``omitempty``, so 0 is left out."""
    spec = scale.get("spec")
    if isinstance(spec, dict) and type(spec.get("replicas")) is int and spec["replicas"] == 0:
        del spec["replicas"]
    return scale


def _get_path(obj: Obj, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _set_path(obj: Obj, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    cur = obj
    for part in parents:
        cur = cur.setdefault(part, {})
    cur[last] = value


def _fold_string_data(res: Resource, obj: Obj) -> None:
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


def _decode(body: bytes) -> Obj:
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"error decoding request body: {exc}") from exc
    if not isinstance(obj, dict):
        raise ApiError(400, "BadRequest", "request body must be a JSON object")
    return obj


class KubeApp:
    """ASGI application for one emulated cluster."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        faults: FaultSet,
        record: Callable[[RecordedRequest], None],
        token: str | None = None,
        admission: AdmissionHook | None = None,
        bookmark_interval: float = 60.0,
    ):
        self.store = store
        self.registry = registry
        self.faults = faults
        self.record = record
        self.token = token
        self.admission = admission
        self.bookmark_interval = bookmark_interval
        self.stopping = asyncio.Event()  # replaced per serving loop by Emulator; set on stop()

    # --- plumbing ------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        raw_query = scope.get("query_string", b"").decode("latin-1")
        info = parse_request_info(scope["method"], scope["path"], dict(parse_qsl(raw_query, keep_blank_values=True)))
        info.user_info = user_info(scope["headers"])

        def record(status_code: int) -> None:
            self.record(
                RecordedRequest(
                    verb=info.verb,
                    api_group=info.group,
                    version=info.version,
                    resource=info.resource,
                    subresource=info.subresource,
                    namespace=info.namespace,
                    name=info.name,
                    path=info.path,
                    method=info.method,
                    status_code=status_code,
                    user_agent=headers.get("user-agent", ""),
                    non_resource=info.non_resource,
                    query=raw_query,
                )
            )

        async def recording_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                record(message["status"])
            await send(message)

        try:
            if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if fault := self.faults.take(info.method, info.verb, info.path):
                if fault.delay_seconds:
                    try:  # a stopping server drops delayed requests instead of finishing them
                        await asyncio.wait_for(self.stopping.wait(), fault.delay_seconds)
                    except TimeoutError:
                        pass
                if fault.close_connection or self.stopping.is_set():
                    record(0)
                    await self._drop_connection(send)
                    return
                if fault.status is not None:
                    raise ApiError(fault.status, None, fault.message or f"injected fault ({fault.status})")
            body = await self._read_body(receive)
            await self._dispatch(info, headers, body, recording_send, receive)
        except ApiError as err:
            await self._respond(recording_send, err.code, err.status(), warnings=info.warnings)
        except Exception as exc:  # an emulator bug must look like an API server 500, not hang
            log.exception("kubemu internal error on %s %s", info.method, info.path)
            await self._respond(recording_send, 500, status_body(500, f"kubemu internal error: {exc}"))

    @staticmethod
    async def _drop_connection(send: Send) -> None:
        """Abort the TCP connection without a response, as a crashing API server would."""
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if transport is None:
            raise RuntimeError("cannot drop the connection: not running under uvicorn")
        transport.abort()
        await asyncio.sleep(0.01)  # let uvicorn see the disconnect before the app returns

    @staticmethod
    async def _read_body(receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _respond(
        send: Send, code: int, body: Any, content_type: str = "application/json", warnings: list[str] | None = None
    ) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(data)).encode())]
        # As kube-apiserver: one header per warning, RFC 7234 form with the agent "-".
        headers += [(b"warning", warning_header(w).encode("utf-8")) for w in warnings or []]
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    # --- routing -------------------------------------------------------------------------

    async def _dispatch(
        self, info: RequestInfo, headers: dict[str, str], body: bytes, send: Send, receive: Receive
    ) -> None:
        if info.non_resource:
            doc = self._non_resource(info, headers.get("host", ""))
            await self._respond(send, 200, doc, "application/json" if isinstance(doc, dict) else "text/plain")
            return
        res = self.registry.lookup(info.group, info.version, info.resource)
        if res is None or info.extra_parts or (info.namespace_in_path and not res.namespaced):
            raise _not_found()
        if info.subresource and not (
            (info.subresource == "status" and res.status) or (info.subresource == "scale" and res.scale_spec)
        ):
            raise _not_found()
        ns = info.namespace if res.namespaced else ""
        if res.namespaced and info.name and not ns:
            raise _not_found()
        dry_run = self._dry_run(info.query)
        if info.verb in ("list", "watch"):
            labels, fields = self._selectors(res, info.query)
            if info.verb == "watch":
                await self._watch(info, res, ns, labels, fields, send, receive)
                return
            after, limit, first_rv = _paging(info.query)
            items, rv, remaining = self.store.list(res, ns, labels, fields, after, limit)
            metadata = _page_metadata(items, first_rv or rv, remaining)
            served = [self._out(o, res, info.version) for o in items]
            if wants_table(headers.get("accept", "")):
                printed = table(res.columns, served, metadata["resourceVersion"], info.query.get("includeObject", ""))
                printed["metadata"] = metadata
                await self._respond(send, 200, printed)
                return
            await self._respond(
                send,
                200,
                {
                    "kind": f"{res.kind}List",
                    "apiVersion": res.api_version(info.version),
                    "metadata": metadata,
                    "items": served,
                },
            )
            return
        handler = {
            "get": self._get,
            "create": self._create,
            "update": self._update,
            "patch": self._patch,
            "delete": self._delete,
        }.get(info.verb)
        if handler is None or (info.verb == "create" and (info.name or (res.namespaced and not ns))):
            raise _method_not_allowed()
        code, obj = await handler(info, res, ns, headers, body, dry_run)
        if info.verb == "get" and not info.subresource and wants_table(headers.get("accept", "")):
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            obj = table(res.columns, [obj], rv, info.query.get("includeObject", ""))
        await self._respond(send, code, obj, warnings=info.warnings)

    def _non_resource(self, info: RequestInfo, host: str) -> Any:
        if info.method != "GET":
            raise _method_not_allowed()
        parts = [p for p in info.path.strip("/").split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return "ok"
        if parts == ["version"]:
            return VERSION_INFO
        if parts == ["api"]:
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
            }
        if parts == ["apis"]:
            return self.registry.api_group_list()
        if len(parts) == 2 and parts[0] == "apis" and self.registry.served_versions(parts[1]):
            return self.registry.api_group(parts[1])
        if len(parts) == {"api": 2, "apis": 3}.get(parts[0] if parts else ""):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            doc = self.registry.api_resource_list(group, version)
            if doc is not None:
                return doc
        raise _not_found()

    @staticmethod
    def _dry_run(query: dict[str, str]) -> bool:
        value = query.get("dryRun", "")
        if value not in ("", "All"):
            # As kube-apiserver: the options object is invalid (422), e.g. for a create
            # `CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["x"]: supported values: "All"`.
            raise ApiError(422, "Invalid", f'dryRun: Unsupported value: ["{value}"]: supported values: "All"')
        return value == "All"

    @staticmethod
    def _selectors(res: Resource, query: dict[str, str]) -> tuple[LabelSelector, FieldSelector]:
        try:
            return (
                LabelSelector(query.get("labelSelector", "")),
                FieldSelector(query.get("fieldSelector", ""), res.field_labels),
            )
        except ValueError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc

    @staticmethod
    def _out(obj: Obj, res: Resource, version: str) -> Obj:
        """The object as served at `version` (objects are stored once for all versions)."""
        return {**obj, "apiVersion": res.api_version(version), "kind": res.kind}

    # --- admission -----------------------------------------------------------------------

    async def _admit(
        self,
        operation: str,
        info: RequestInfo,
        res: Resource,
        ns: str,
        name: str,
        new: Obj | None,
        old: Obj | None,
        dry_run: bool,
    ) -> Obj | None:
        """Run the admission hook in a worker thread (it may block); return the object to store."""
        if self.admission is None:
            return new
        if info.subresource == "scale":
            kind = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
        else:
            kind = {"group": res.group, "version": info.version, "kind": res.kind}
        attrs = AdmissionAttributes(
            operation=operation,
            group=res.group,
            version=info.version,
            resource=res.plural,
            subresource=info.subresource,
            kind=kind,
            namespace=ns,
            name=name,
            object=new,
            old_object=old,
            dry_run=dry_run,
            user_info=info.user_info or dict(ADMIN),
        )
        try:
            result = await asyncio.to_thread(self.admission, attrs)
        except AdmissionDenied as denied:
            raise ApiError(denied.code, None, denied.message) from denied
        finally:
            info.warnings.extend(attrs.warnings)
        return result if result is not None else attrs.object

    # --- verbs ---------------------------------------------------------------------------

    def _scale_of(self, res: Resource, parent: Obj) -> Obj:
        spec = res.scale_spec
        assert spec is not None
        meta = parent["metadata"]
        scale: Obj = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
            },
            "spec": {"replicas": _get_path(parent, spec.spec_replicas) or 0},
            "status": {"replicas": _get_path(parent, spec.status_replicas) or 0},
        }
        _wire_scale(scale)
        selector = _get_path(parent, spec.selector)
        if isinstance(selector, dict):
            selector = match_labels_to_string(selector)
        if selector:
            scale["status"]["selector"] = selector
        return scale

    @staticmethod
    def _check_scale(scale: Obj, name: str) -> int:
        if scale.get("metadata", {}).get("name") not in (None, "", name):
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({scale['metadata']['name']}) does not match the name on the URL ({name})",
            )
        spec = scale.get("spec") or {}
        replicas = spec.get("replicas", 0) if isinstance(spec, dict) else None  # omitted: 0 (int32, omitempty)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(
                422,
                "Invalid",
                f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: '
                f"{json.dumps(replicas)}: must be a non-negative integer",
            )
        return replicas

    def _scaled_parent(self, res: Resource, parent: Obj, scale: Obj, name: str) -> Obj:
        """The parent with the Scale's replicas, preconditioned on the Scale's resourceVersion."""
        replicas = self._check_scale(scale, name)
        new = copy.deepcopy(parent)
        _set_path(new, res.scale_spec.spec_replicas, replicas)  # type: ignore[union-attr]
        new["metadata"]["resourceVersion"] = (scale.get("metadata") or {}).get("resourceVersion") or ""
        return new

    def _result(self, res: Resource, info: RequestInfo, obj: Obj) -> Obj:
        return self._scale_of(res, obj) if info.subresource == "scale" else self._out(obj, res, info.version)

    async def _get(
        self, info: RequestInfo, res: Resource, ns: str, headers: dict[str, str], body: bytes, dry_run: bool
    ) -> tuple[int, Obj]:
        return 200, self._result(res, info, self.store.get(res, ns, info.name))

    async def _create(
        self, info: RequestInfo, res: Resource, ns: str, headers: dict[str, str], body: bytes, dry_run: bool
    ) -> tuple[int, Obj]:
        obj = _decode(body)
        raw_meta = obj.get("metadata")
        meta: Obj = raw_meta if isinstance(raw_meta, dict) else {}
        if res.namespaced and meta.get("namespace") not in (None, "", ns):
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        obj.update(apiVersion=res.api_version(info.version), kind=obj.get("kind") or res.kind)
        if res.namespaced:
            obj["metadata"] = {**meta, "namespace": ns}
        _fold_string_data(res, obj)
        admitted = await self._admit("CREATE", info, res, ns, meta.get("name", ""), obj, None, dry_run)
        created = self.store.create(res, admitted or {}, ns, dry_run=dry_run)
        return 201, self._out(created, res, info.version)

    async def _update(
        self, info: RequestInfo, res: Resource, ns: str, headers: dict[str, str], body: bytes, dry_run: bool
    ) -> tuple[int, Obj]:
        obj = _decode(body)
        old = self.store.get(res, ns, info.name)
        if info.subresource == "scale":
            old_scale = self._scale_of(res, old)
            self._check_scale(obj, info.name)
            scale = await self._admit("UPDATE", info, res, ns, info.name, _wire_scale(obj), old_scale, dry_run) or obj
            obj = self._scaled_parent(res, old, scale, info.name)
        else:
            _fold_string_data(res, obj)
            obj = await self._admit("UPDATE", info, res, ns, info.name, obj, old, dry_run) or obj
        mode = "status" if info.subresource == "status" else "main"
        updated = self.store.update(res, obj, ns, info.name, mode=mode, dry_run=dry_run)
        return 200, self._result(res, info, updated)

    async def _patch(
        self, info: RequestInfo, res: Resource, ns: str, headers: dict[str, str], body: bytes, dry_run: bool
    ) -> tuple[int, Obj]:
        """Apply the patch to the current object; retry on a write race unless the patch itself
        pinned a resourceVersion (then the Conflict is the caller's)."""
        content_type = headers.get("content-type", "")
        mode = "status" if info.subresource == "status" else "main"
        for attempt in range(PATCH_RETRIES):
            old = self.store.get(res, ns, info.name)
            if info.subresource == "scale":
                old_scale = self._scale_of(res, old)
                scale = apply_patch(old_scale, content_type, body, res.custom)
                self._check_scale(scale, info.name)
                scale = (
                    await self._admit("UPDATE", info, res, ns, info.name, _wire_scale(scale), old_scale, dry_run)
                    or scale
                )
                new = self._scaled_parent(res, old, scale, info.name)
            else:
                new = apply_patch(old, content_type, body, res.custom)
                _fold_string_data(res, new)
                new = await self._admit("UPDATE", info, res, ns, info.name, new, old, dry_run) or new
            pinned = new["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]
            try:
                updated = self.store.update(res, new, ns, info.name, mode=mode, dry_run=dry_run)
            except ApiError as err:
                if err.code == 409 and not pinned and attempt < PATCH_RETRIES - 1:
                    continue
                raise
            return 200, self._result(res, info, updated)
        raise AssertionError("unreachable")

    async def _delete(
        self, info: RequestInfo, res: Resource, ns: str, headers: dict[str, str], body: bytes, dry_run: bool
    ) -> tuple[int, Obj]:
        if info.subresource:
            raise _method_not_allowed()
        options = _decode(body) if body.strip() else {}
        dry_run = dry_run or "All" in (options.get("dryRun") or [])
        old = self.store.get(res, ns, info.name)
        await self._admit("DELETE", info, res, ns, info.name, None, old, dry_run)
        obj, removed = self.store.delete(
            res, ns, info.name, dry_run=dry_run, preconditions=options.get("preconditions")
        )
        return (200 if removed else 202), self._out(obj, res, info.version)

    # --- watch ---------------------------------------------------------------------------

    async def _watch(
        self,
        info: RequestInfo,
        res: Resource,
        ns: str,
        labels: LabelSelector,
        fields: FieldSelector,
        send: Send,
        receive: Receive,
    ) -> None:
        """Stream newline-delimited watch events until timeoutSeconds, disconnect or stop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

        def deliver(event: WatchEvent | None) -> None:  # called under the store lock, any thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:
                pass  # loop already closed: the server has stopped

        try:
            timeout = float(info.query.get("timeoutSeconds") or 0) or DEFAULT_WATCH_TIMEOUT  # 0: no explicit timeout
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid timeoutSeconds: {exc}") from exc
        bookmarks = info.query.get("allowWatchBookmarks", "").lower() in ("true", "1")

        async def write(type_: str, obj: Obj) -> None:
            line = json.dumps({"type": type_, "object": obj}).encode() + b"\n"
            await send({"type": "http.response.body", "body": line, "more_body": True})

        async def write_event(event: WatchEvent) -> None:
            type_, obj = event
            if type_ == "BOOKMARK":
                obj = {"kind": res.kind, "apiVersion": res.api_version(info.version), "metadata": obj["metadata"]}
            else:
                obj = self._out(obj, res, info.version)
            await write(type_, obj)

        start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
        try:
            initial, watcher = self.store.watch(res, ns, labels, fields, info.query.get("resourceVersion"), deliver)
        except ApiError as err:
            if err.code != 410:
                raise
            await send(start)  # like the API server: 200, then an ERROR event with the 410 Status
            await write("ERROR", err.status())
            await send({"type": "http.response.body", "body": b""})
            return
        disconnected = asyncio.ensure_future(self._wait_disconnect(receive))
        try:
            await send(start)
            for first in initial:
                await write_event(first)
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + self.bookmark_interval
            while (remaining := deadline - loop.time()) > 0:
                getter = asyncio.ensure_future(queue.get())
                wait = min(remaining, next_bookmark - loop.time()) if bookmarks else remaining
                done, _ = await asyncio.wait(
                    {getter, disconnected}, timeout=max(wait, 0), return_when=asyncio.FIRST_COMPLETED
                )
                if getter not in done:
                    getter.cancel()
                if disconnected in done:
                    return
                if getter in done:
                    event = getter.result()
                    if event is None:
                        break
                    await write_event(event)
                elif bookmarks and loop.time() >= next_bookmark:
                    self.store.bookmark(watcher)
                    next_bookmark = loop.time() + self.bookmark_interval
            else:
                if bookmarks:  # a last bookmark lets the client resume exactly where this watch ends
                    self.store.bookmark(watcher)
                    while (event := await queue.get()) is not None:
                        await write_event(event)
                        if event[0] == "BOOKMARK":
                            break
            await send({"type": "http.response.body", "body": b""})
        finally:
            self.store.unwatch(watcher)
            disconnected.cancel()

    @staticmethod
    async def _wait_disconnect(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
