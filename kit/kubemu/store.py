"""Object store: objects, the global resourceVersion, the event history and the watchers.

Every write goes through here (HTTP handlers and the direct Python API alike), so both emit
the same watch events. Stored dicts are never mutated after they are stored (writes replace
them), which lets events share them; everything handed out to callers is a deep copy.
"""

from __future__ import annotations

import bisect
import builtins
import copy
import random
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .errors import ApiError
from .resources import Resource
from .selectors import FieldSelector, LabelSelector

Obj = dict[str, Any]
WatchEvent = tuple[str, Obj]  # (ADDED|MODIFIED|DELETED, object as stored)
Deliver = Callable[[WatchEvent | None], None]  # None tells the watcher the store is closing it

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's, free of vowels and look-alikes
_UNVERSIONED = ("apiVersion", "kind", "metadata", "status")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj) -> Obj:
    """What metadata.generation tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in _UNVERSIONED}


def _with_rv(obj: Obj, rv: int) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    key: tuple[str, str]
    obj: Obj
    old: Obj | None


class Watcher:
    """A watch's filter; turns store events into the events this watcher must see.

    A MODIFIED event that makes an object start (stop) matching is seen as ADDED (DELETED),
    as the API server's watch cache does.
    """

    def __init__(
        self, resource: Resource, namespace: str, labels: LabelSelector, fields: FieldSelector, deliver: Deliver
    ):
        self.resource = resource
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.deliver = deliver

    def matches(self, obj: Obj) -> bool:
        meta = obj["metadata"]
        return (
            (not self.namespace or meta.get("namespace") == self.namespace)
            and self.labels.matches(meta.get("labels"))
            and self.fields.matches(obj)
        )

    def translate(self, ev: Event) -> WatchEvent | None:
        if ev.key != self.resource.key:
            return None
        if ev.type != "MODIFIED":
            return (ev.type, ev.obj) if self.matches(ev.obj) else None
        now_matches, matched = self.matches(ev.obj), ev.old is not None and self.matches(ev.old)
        if now_matches:
            return ("MODIFIED" if matched else "ADDED", ev.obj)
        if matched and ev.old is not None:
            return ("DELETED", _with_rv(ev.old, ev.rv))
        return None


class Store:
    """Thread-safe object store shared by the HTTP server thread and test code."""

    def __init__(self, history_size: int = 1000):
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._rv = 0
        self._history: deque[Event] = deque(maxlen=history_size)
        self._floor = 0  # rv of the newest event dropped from the history
        self._watchers: list[Watcher] = []

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    # --- reads ---------------------------------------------------------------------------

    def _bucket(self, res: Resource) -> dict[tuple[str, str], Obj]:
        return self._objects.setdefault(res.key, {})

    def _current(self, res: Resource, namespace: str, name: str) -> Obj:
        obj = self._bucket(res).get((namespace if res.namespaced else "", name))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{res.group_resource} "{name}" not found',
                {"name": name, "group": res.group, "kind": res.plural},
            )
        return obj

    def get(self, res: Resource, namespace: str, name: str) -> Obj:
        with self._lock:
            return copy.deepcopy(self._current(res, namespace, name))

    def list(
        self,
        res: Resource,
        namespace: str = "",
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 0,
    ) -> tuple[list[Obj], str, int]:
        """Matching objects sorted by namespace/name (only those past ``after``, at most ``limit``),
        the list resourceVersion, and how many more match beyond the limit."""
        w = Watcher(res, namespace, labels or LabelSelector(), fields or FieldSelector(), lambda _: None)
        with self._lock:
            bucket = self._bucket(res)
            keys = sorted(bucket)
            # A page starts past ``after`` and stops at ``limit``: paging through n objects stays O(n log n)
            # per page, not a match of every object on every page (50,000 objects took 22 s in pages of 500).
            index = bisect.bisect_right(keys, after) if after is not None else 0
            page: list[Obj] = []
            while index < len(keys) and not (limit and len(page) == limit):
                if w.matches(bucket[keys[index]]):
                    page.append(bucket[keys[index]])
                index += 1
            rest = keys[index:] if limit else []
            if not w.labels.requirements and not w.fields.terms:  # only the namespace can exclude an object
                remaining = sum(1 for key in rest if not namespace or key[0] == namespace)
            else:
                remaining = sum(1 for key in rest if w.matches(bucket[key]))
            return [copy.deepcopy(o) for o in page], str(self._rv), remaining

    # --- writes --------------------------------------------------------------------------

    def _commit(self, res: Resource, type_: str, obj: Obj, old: Obj | None) -> Obj:
        """Assign the next resourceVersion, store (or remove) the object and fan the event out."""
        self._rv += 1
        obj = _with_rv(obj, self._rv)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if type_ == "DELETED":
            self._bucket(res).pop(key, None)
        else:
            self._bucket(res)[key] = obj
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        ev = Event(self._rv, type_, res.key, obj, old)
        self._history.append(ev)
        for watcher in self._watchers:
            if (translated := watcher.translate(ev)) is not None:
                watcher.deliver(translated)
        return copy.deepcopy(obj)

    def _generate_name(self, res: Resource, namespace: str, prefix: str) -> str:
        for _ in range(100):
            name = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
            if (namespace, name) not in self._bucket(res):
                return name
        raise ApiError(500, "InternalError", "could not generate a unique name")

    def create(
        self, res: Resource, obj: Obj, namespace: str = "", dry_run: bool = False, keep_status: bool = False
    ) -> Obj:
        """Create; like the API server, status is reset unless `keep_status` (direct seeding)."""
        obj = copy.deepcopy(obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if obj.get("kind") not in (None, res.kind):
            raise ApiError(400, "BadRequest", f"the kind {obj.get('kind')!r} does not match the resource {res.kind!r}")
        obj["kind"] = res.kind
        obj["apiVersion"] = obj.get("apiVersion") or res.api_version(res.versions[-1])
        if res.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            namespace = namespace or body_ns or "default"
            meta["namespace"] = namespace
        else:
            namespace = ""
            meta.pop("namespace", None)
        with self._lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(res, namespace, meta["generateName"])
            name = meta.get("name") or ""
            if not name:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{res.kind} "" is invalid: metadata.name: Required value: name or generateName is required',
                )
            if not _NAME_RE.match(name):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{res.kind} "{name}" is invalid: metadata.name: Invalid value: '
                    f'"{name}": must be a lowercase RFC 1123 subdomain',
                )
            if (namespace, name) in self._bucket(res):
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{res.group_resource} "{name}" already exists',
                    {"name": name, "group": res.group, "kind": res.plural},
                )
            for managed in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
                meta.pop(managed, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            if res.status and not keep_status:
                obj.pop("status", None)
            if res.scale_spec and res.scale_spec.spec_replicas == "spec.replicas":
                obj.setdefault("spec", {}).setdefault("replicas", 1)  # what defaulting does
            if dry_run:
                return obj
            return self._commit(res, "ADDED", obj, None)

    def update(
        self, res: Resource, obj: Obj, namespace: str, name: str, mode: str = "main", dry_run: bool = False
    ) -> Obj:
        """Replace an object with optimistic concurrency on a set metadata.resourceVersion.

        mode "main" keeps the stored status (status subresource semantics), "status" changes only
        .status, "all" replaces both (direct seeding). A no-op update keeps the resourceVersion;
        an update that leaves a deleting object without finalizers removes it.
        """
        meta = obj.get("metadata") or {}
        with self._lock:
            old = self._current(res, namespace, name)
            if meta.get("name") not in (None, "", name):
                raise ApiError(
                    400,
                    "BadRequest",
                    f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})",
                )
            if res.namespaced and meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            if meta.get("resourceVersion") not in (None, "", old["metadata"]["resourceVersion"]):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.group_resource} "{name}": '
                    "the object has been modified; please apply your changes "
                    "to the latest version and try again",
                    {"name": name, "group": res.group, "kind": res.plural},
                )
            if mode == "status":
                new = {k: copy.deepcopy(v) for k, v in old.items() if k != "status"}
                if "status" in obj:
                    new["status"] = copy.deepcopy(obj["status"])
            else:
                new = copy.deepcopy(obj)
                if mode == "main":
                    new.pop("status", None)
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                new_meta = new.setdefault("metadata", {})
                for managed in (
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "resourceVersion",
                ):
                    new_meta.pop(managed, None)
                    if managed in old["metadata"]:
                        new_meta[managed] = old["metadata"][managed]
            new["kind"], new["apiVersion"] = res.kind, old["apiVersion"]
            if _spec_part(new) != _spec_part(old):
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            if new == old:
                return copy.deepcopy(old)
            if dry_run:
                return new
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                return self._commit(res, "DELETED", new, old)
            return self._commit(res, "MODIFIED", new, old)

    def delete(
        self,
        res: Resource,
        namespace: str,
        name: str,
        dry_run: bool = False,
        preconditions: dict[str, str] | None = None,
    ) -> tuple[Obj, bool]:
        """Delete; returns (object, removed_now). With finalizers only deletionTimestamp is set."""
        with self._lock:
            old = self._current(res, namespace, name)
            for field in ("uid", "resourceVersion"):
                wanted = (preconditions or {}).get(field)
                if wanted and wanted != old["metadata"].get(field):
                    raise ApiError(
                        409,
                        "Conflict",
                        f"Precondition failed: {field} in precondition: {wanted}, "
                        f"{field} in object meta: {old['metadata'].get(field)}",
                    )
            if old["metadata"].get("finalizers"):
                if old["metadata"].get("deletionTimestamp"):
                    return copy.deepcopy(old), False
                new = {
                    **old,
                    "metadata": {**old["metadata"], "deletionTimestamp": now(), "deletionGracePeriodSeconds": 0},
                }
                return (copy.deepcopy(new) if dry_run else self._commit(res, "MODIFIED", new, old)), False
            if dry_run:
                return copy.deepcopy(old), True
            return self._commit(res, "DELETED", old, old), True

    # --- watches -------------------------------------------------------------------------

    def watch(
        self,
        res: Resource,
        namespace: str,
        labels: LabelSelector,
        fields: FieldSelector,
        since: str | None,
        deliver: Deliver,
    ) -> tuple[builtins.list[WatchEvent], Watcher]:
        """Register a watcher; returns the events to send first and the watcher (for unwatch).

        `since` unset or "0": synthetic ADDED for every matching object. Otherwise the history
        after `since` is replayed, or 410 Expired when it has already been dropped.
        """
        watcher = Watcher(res, namespace, labels, fields, deliver)
        with self._lock:
            if since in (None, "", "0"):
                objs = sorted(self._bucket(res).values(), key=lambda o: int(o["metadata"]["resourceVersion"]))
                initial = [("ADDED", o) for o in objs if watcher.matches(o)]
            else:
                try:
                    start = int(since)
                except ValueError as exc:
                    raise ApiError(400, "BadRequest", f"invalid resource version: {since!r}") from exc
                if start < self._floor:
                    raise ApiError(410, "Expired", f"too old resource version: {start} ({self._floor + 1})")
                initial = [t for ev in self._history if ev.rv > start for t in [watcher.translate(ev)] if t is not None]
            self._watchers.append(watcher)
            return initial, watcher

    def bookmark(self, watcher: Watcher) -> None:
        """Queue a BOOKMARK at the current resourceVersion behind the events already queued."""
        with self._lock:
            watcher.deliver(("BOOKMARK", {"metadata": {"resourceVersion": str(self._rv)}}))

    def unwatch(self, watcher: Watcher) -> None:
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def close_watchers(self) -> None:
        """End every open watch (the server is stopping)."""
        with self._lock:
            watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            watcher.deliver(None)
