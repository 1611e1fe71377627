"""A watch, streamed: newline-delimited events until ``timeoutSeconds``, the client's disconnect or the server's stop.

As kube-apiserver: the initial state (when asked from no or an old-enough resourceVersion), then
each change; bookmarks every ``bookmark_interval`` when the client allows them, and a last one at
the timeout so the client resumes exactly where the watch ended; a resourceVersion too old is a 200
with an ``ERROR`` event carrying the 410 Status.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .errors import ApiError
from .resources import Resource
from .selectors import FieldSelector, LabelSelector
from .store import Obj, Store, WatchEvent
from .wire import DEFAULT_WATCH_TIMEOUT, Receive, RequestInfo, Send

START = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}


class WatchStream:
    """One watch request's stream over ``store``."""

    def __init__(self, store: Store, info: RequestInfo, res: Resource, send: Send, bookmark_interval: float) -> None:
        self.store, self.info, self.res, self.send = store, info, res, send
        self.bookmark_interval = bookmark_interval
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        try:
            # 0: no explicit timeout
            self.timeout = float(info.query.get("timeoutSeconds") or 0) or DEFAULT_WATCH_TIMEOUT
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid timeoutSeconds: {exc}") from exc
        self.bookmarks = info.query.get("allowWatchBookmarks", "").lower() in ("true", "1")

    def deliver(self, event: WatchEvent | None) -> None:  # called under the store lock, any thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:
            pass  # loop already closed: the server has stopped

    async def write(self, type_: str, obj: Obj) -> None:
        line = json.dumps({"type": type_, "object": obj}).encode() + b"\n"
        await self.send({"type": "http.response.body", "body": line, "more_body": True})

    async def write_event(self, event: WatchEvent) -> None:
        type_, obj = event
        if type_ == "BOOKMARK":
            obj = {
                "kind": self.res.kind,
                "apiVersion": self.res.api_version(self.info.version),
                "metadata": obj["metadata"],
            }
        else:
            obj = {**obj, "apiVersion": self.res.api_version(self.info.version), "kind": self.res.kind}
        await self.write(type_, obj)

    async def serve(self, ns: str, labels: LabelSelector, fields: FieldSelector, receive: Receive) -> None:
        try:
            initial, watcher = self.store.watch(
                self.res, ns, labels, fields, self.info.query.get("resourceVersion"), self.deliver
            )
        except ApiError as err:
            if err.code != 410:
                raise
            await self.send(START)  # like the API server: 200, then an ERROR event with the 410 Status
            await self.write("ERROR", err.status())
            await self.send({"type": "http.response.body", "body": b""})
            return
        disconnected = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await self.send(START)
            for first in initial:
                await self.write_event(first)
            if await self.stream(watcher, disconnected):
                await self.send({"type": "http.response.body", "body": b""})
        finally:
            self.store.unwatch(watcher)
            disconnected.cancel()

    async def stream(self, watcher: Any, disconnected: asyncio.Future[Any]) -> bool:
        """Events until the timeout or the store's stop (True: end the response), or the client left (False)."""
        deadline = self.loop.time() + self.timeout
        next_bookmark = self.loop.time() + self.bookmark_interval
        while (remaining := deadline - self.loop.time()) > 0:
            getter: asyncio.Future[Any] = asyncio.ensure_future(self.queue.get())
            wait = min(remaining, next_bookmark - self.loop.time()) if self.bookmarks else remaining
            done, _ = await asyncio.wait(
                {getter, disconnected}, timeout=max(wait, 0), return_when=asyncio.FIRST_COMPLETED
            )
            if getter not in done:
                getter.cancel()
            if disconnected in done:
                return False
            if getter in done:
                event = getter.result()
                if event is None:
                    return True
                await self.write_event(event)
            elif self.bookmarks and self.loop.time() >= next_bookmark:
                self.store.bookmark(watcher)
                next_bookmark = self.loop.time() + self.bookmark_interval
        if self.bookmarks:  # a last bookmark lets the client resume exactly where this watch ends
            self.store.bookmark(watcher)
            while (event := await self.queue.get()) is not None:
                await self.write_event(event)
                if event[0] == "BOOKMARK":
                    break
        return True


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
