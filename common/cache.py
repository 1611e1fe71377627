"""List+watch caches ("informers") so that a warm admission makes no API call.

Each :class:`Informer` lists a collection once, then follows its watch stream, and keeps plain
dicts keyed by ``(namespace, name)``. A transform trims objects to the fields a service reads,
so memory stays flat as clusters grow. On a watch error it relists with capped backoff. Reads
may be stale for about one watch round trip, or for up to ``MAX_BACKOFF_SECONDS`` plus a relist
after a disconnect. That is the staleness bound documented in the README.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch import Watch

from common.kube import KubeClient, KubeError

log = logging.getLogger("slime.cache")

Transform = Callable[[dict[str, Any]], dict[str, Any]]
Key = tuple[str, str]
MAX_BACKOFF_SECONDS = 5.0
LIST_PAGE_SIZE = 500  # client-go's default page size
WATCH_TIMEOUT_SECONDS = 240  # servers end watches anyway; reconnect before idle proxies cut us


def strip_noise(obj: dict[str, Any]) -> dict[str, Any]:
    """The default transform: drop what no reader needs and what is large."""
    metadata = obj.get("metadata") or {}
    metadata.pop("managedFields", None)
    annotations = metadata.get("annotations")
    if annotations:
        annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
    return obj


def object_key(obj: dict[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return metadata.get("namespace") or "", metadata.get("name") or ""


class Informer:
    """A cache of one collection (optionally narrowed by selectors) on one cluster."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform = strip_noise,
        description: str = "",
    ) -> None:
        self.client = client
        self.path = path
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.transform = transform
        self.description = description or path
        self.last_error = ""
        self._objects: dict[Key, dict[str, Any]] = {}
        self._synced = threading.Event()
        self._stopped = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # --- reading -----------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object; callers must not mutate it."""
        return self._objects.get((namespace, name))

    def items(self) -> list[dict[str, Any]]:
        return list(self._objects.values())

    def __len__(self) -> int:
        return len(self._objects)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Called (on the informer thread) after every change and every relist."""
        self._listeners.append(callback)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Informer:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"informer {self.description}", daemon=True)
                self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _selectors(self) -> list[tuple[str, str]]:
        query = []
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query

    def _run(self) -> None:
        backoff = 0.2
        while not self._stopped.is_set():
            try:
                resource_version = self._relist()
                backoff = 0.2
                self._follow(resource_version)
            except KubeError as exc:
                self._record_error(str(exc))
            except ApiException as exc:
                if exc.status == 410:  # our resourceVersion is too old: relist at once
                    continue
                self._record_error(str(self.client.error(exc.status or 0, exc.reason or "", exc.body)))
            except Exception as exc:  # noqa: BLE001 - a cache thread must never die
                # An untrusted cluster's failure is told by its type only: its text may be the server's.
                self._record_error(f"{type(exc).__name__}: {exc}" if self.client.trusted else type(exc).__name__)
            if self._stopped.wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _record_error(self, message: str) -> None:
        if message != self.last_error:
            log.warning("cache watch failed; retrying", extra={"cache": self.description, "error": message})
        self.last_error = message

    def _relist(self) -> str:
        """List in pages, as client-go does, so a large collection never sits decoded at once."""
        fresh = {}
        continue_token = ""
        while True:
            query = self._selectors() + [("limit", str(LIST_PAGE_SIZE))]
            if continue_token:
                query.append(("continue", continue_token))
            data = self.client.request("GET", self.path, query=query)
            for item in data.get("items") or []:
                fresh[object_key(item)] = self.transform(item)
            metadata = data.get("metadata") or {}
            continue_token = metadata.get("continue") or ""
            if not continue_token:
                break
            del data
        self._objects = fresh  # one assignment: readers see the old or the new map, never a mix
        self._synced.set()
        self.last_error = ""
        self._notify()
        return str(metadata.get("resourceVersion") or "")

    def _follow(self, resource_version: str) -> None:
        watch = Watch()

        def open_stream(**kwargs: Any) -> Any:
            query = self._selectors() + [
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(WATCH_TIMEOUT_SECONDS)),
            ]
            if kwargs.get("resource_version"):
                query.append(("resourceVersion", kwargs["resource_version"]))
            return self.client.stream(self.path, query, timeout=(5.0, WATCH_TIMEOUT_SECONDS + 15.0))

        while not self._stopped.is_set():
            for event in watch.stream(
                open_stream, resource_version=resource_version, timeout_seconds=WATCH_TIMEOUT_SECONDS
            ):
                if self._stopped.is_set():
                    watch.stop()
                    return
                resource_version = self._apply(event) or resource_version

    def _apply(self, event: dict[str, Any]) -> str:
        kind, obj = event.get("type"), event.get("raw_object") or event.get("object")
        if not isinstance(obj, dict):
            return ""
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "BOOKMARK":
            return version
        key = object_key(obj)
        if kind == "DELETED":
            self._objects.pop(key, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._objects[key] = self.transform(obj)
        self._notify()
        return version

    def _notify(self) -> None:
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("cache listener failed", extra={"cache": self.description})


class InformerSet:
    """Informers of one cluster, created on first use and shared by key.

    ``on_change`` is called after any change in any of them (derived-data caches use it).
    """

    def __init__(self, client: KubeClient, on_change: Callable[[], None] | None = None) -> None:
        self.client = client
        self.on_change = on_change
        self._informers: dict[tuple[str, str | None, str | None], Informer] = {}
        self._lock = threading.Lock()

    def informer(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform = strip_noise,
        description: str = "",
    ) -> Informer:
        key = (path, label_selector, field_selector)
        with self._lock:
            informer = self._informers.get(key)
            if informer is None:
                informer = Informer(
                    self.client,
                    path,
                    label_selector=label_selector,
                    field_selector=field_selector,
                    transform=transform,
                    description=description,
                )
                if self.on_change is not None:
                    informer.add_listener(self.on_change)
                self._informers[key] = informer.start()
        return informer

    def all(self) -> list[Informer]:
        with self._lock:
            return list(self._informers.values())

    def stop(self) -> None:
        for informer in self.all():
            informer.stop()


class CacheChanges:
    """Lets an admission on the event loop sleep until any cache changes (an informer thread says so).

    A review whose object the cache does not hold yet waits for the watch event that brings it,
    not for a polling tick, so the wait lasts as long as the watch takes and no longer. Informer
    threads call :meth:`changed`; it costs nothing while no admission waits."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[asyncio.Future[None]] = []

    def arm(self) -> asyncio.Future[None]:
        """A future done at the next change from now on: arm it before reading the caches, so no change is missed."""
        self._loop = asyncio.get_running_loop()
        changed = self._loop.create_future()
        self._waiting.append(changed)
        return changed

    async def wait(self, changed: asyncio.Future[None], timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(changed), timeout)
        except TimeoutError:
            pass
        finally:
            if changed in self._waiting:
                self._waiting.remove(changed)

    def changed(self) -> None:
        if self._waiting and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, []
        for changed in waiting:
            if not changed.done():
                changed.set_result(None)
