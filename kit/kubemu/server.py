"""The HTTP layer: a plain ASGI app that speaks the Kubernetes REST API over the store.

Plain ASGI (no framework) because Kubernetes paths need their own parsing (RequestInfo), watch
streams need the raw `send`/`receive`, and dropping a connection needs uvicorn's transport.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from .admission import AdmissionAttributes, AdmissionDenied, AdmissionHook
from .errors import ApiError, status_body
from .faults import FaultSet
from .patch import apply_patch
from .resources import Registry, Resource
from .selectors import FieldSelector, LabelSelector, match_labels_to_string
from .store import Obj, Store
from .tables import table, wants_table
from .watch import WatchStream
from .wire import (
    ADMIN,
    PATCH_RETRIES,
    VERSION_INFO,
    Receive,
    RecordedRequest,
    RequestInfo,
    Send,
    decode,
    fold_string_data,
    get_path,
    method_not_allowed,
    not_found,
    page_metadata,
    paging,
    parse_request_info,
    set_path,
    user_info,
    warning_header,
    wire_scale,
)

log = logging.getLogger("kubemu")


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
            raise not_found()
        if info.subresource and not (
            (info.subresource == "status" and res.status) or (info.subresource == "scale" and res.scale_spec)
        ):
            raise not_found()
        ns = info.namespace if res.namespaced else ""
        if res.namespaced and info.name and not ns:
            raise not_found()
        dry_run = self._dry_run(info.query)
        if info.verb in ("list", "watch"):
            labels, fields = self._selectors(res, info.query)
            if info.verb == "watch":
                await WatchStream(self.store, info, res, send, self.bookmark_interval).serve(
                    ns, labels, fields, receive
                )
                return
            after, limit, first_rv = paging(info.query)
            items, rv, remaining = self.store.list(res, ns, labels, fields, after, limit)
            metadata = page_metadata(items, first_rv or rv, remaining)
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
            raise method_not_allowed()
        code, obj = await handler(info, res, ns, headers, body, dry_run)
        if info.verb == "get" and not info.subresource and wants_table(headers.get("accept", "")):
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            obj = table(res.columns, [obj], rv, info.query.get("includeObject", ""))
        await self._respond(send, code, obj, warnings=info.warnings)

    def _non_resource(self, info: RequestInfo, host: str) -> Any:
        if info.method != "GET":
            raise method_not_allowed()
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
        raise not_found()

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
            "spec": {"replicas": get_path(parent, spec.spec_replicas) or 0},
            "status": {"replicas": get_path(parent, spec.status_replicas) or 0},
        }
        wire_scale(scale)
        selector = get_path(parent, spec.selector)
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
        set_path(new, res.scale_spec.spec_replicas, replicas)  # type: ignore[union-attr]
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
        obj = decode(body)
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
        fold_string_data(res, obj)
        admitted = await self._admit("CREATE", info, res, ns, meta.get("name", ""), obj, None, dry_run)
        created = self.store.create(res, admitted or {}, ns, dry_run=dry_run)
        return 201, self._out(created, res, info.version)

    async def _update(
        self, info: RequestInfo, res: Resource, ns: str, headers: dict[str, str], body: bytes, dry_run: bool
    ) -> tuple[int, Obj]:
        obj = decode(body)
        old = self.store.get(res, ns, info.name)
        if info.subresource == "scale":
            old_scale = self._scale_of(res, old)
            self._check_scale(obj, info.name)
            scale = await self._admit("UPDATE", info, res, ns, info.name, wire_scale(obj), old_scale, dry_run) or obj
            obj = self._scaled_parent(res, old, scale, info.name)
        else:
            fold_string_data(res, obj)
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
                    await self._admit("UPDATE", info, res, ns, info.name, wire_scale(scale), old_scale, dry_run)
                    or scale
                )
                new = self._scaled_parent(res, old, scale, info.name)
            else:
                new = apply_patch(old, content_type, body, res.custom)
                fold_string_data(res, new)
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
            raise method_not_allowed()
        options = decode(body) if body.strip() else {}
        dry_run = dry_run or "All" in (options.get("dryRun") or [])
        old = self.store.get(res, ns, info.name)
        await self._admit("DELETE", info, res, ns, info.name, None, old, dry_run)
        obj, removed = self.store.delete(
            res, ns, info.name, dry_run=dry_run, preconditions=options.get("preconditions")
        )
        return (200 if removed else 202), self._out(obj, res, info.version)
