"""App factory of the injection webhook: ``POST /mutate`` over the shared admission transport.

The flow of one admission: ``select`` the metaData Secret; when the requester may not receive
join data (a dry run, or not one of ``--allowed-requesters``) allow it unchanged, with a warning,
a metric and, for a Metal3Data the cache holds, an Event; else verify the owner against the
cache (a brief wait, woken by the watch event, for one CAPM3 created a moment ago), resolve from the caches and merge.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp

from common.admission import AdmissionResponse, allow
from common.events import EventRecorder, ObjectEvent
from common.names import METAL3_GROUP, REASON_JOIN_DATA_WITHHELD
from common.webhook import AdmissionEndpoint, AdmissionHandler, admission_app
from injection_webhook.handler import MetaDataSecret, Unresolved, Unverified, respond, select, withheld, withhold
from injection_webhook.large import respond_off_loop
from injection_webhook.metrics import InjectionMetrics
from injection_webhook.resolver import VERIFY_WAIT_SECONDS, InjectionResolver, NeedsWait

WEBHOOK_NAME = "injection"
PATH = "/mutate"
EVENT_INTERVAL_SECONDS = 60.0  # one withheld Event per Metal3Data a minute at most
EVENT_KEYS = 1024


class CacheChanges:
    """Lets an admission on the event loop sleep until any cache changes (an informer thread says so).

    A review whose owner the cache does not hold yet waits for the watch event that brings it,
    not for a polling tick, so the wait lasts as long as the watch takes and no longer."""

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
        """Informer threads call this after every change; it costs nothing while no admission waits."""
        if self._waiting and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, []
        for changed in waiting:
            if not changed.done():
                changed.set_result(None)


class WithheldEvents:
    """Events on the Metal3Data of a Secret whose join data was withheld, rate-limited per object."""

    def __init__(self, recorder: EventRecorder | None, resolver: InjectionResolver) -> None:
        self.recorder = recorder
        self.resolver = resolver
        self._last: dict[tuple[str, str], float] = {}

    def report(self, secret: MetaDataSecret, metal3data: dict[str, Any], message: str) -> None:
        if self.recorder is None:
            return
        key = (secret.namespace, secret.metal3data)
        now = time.monotonic()
        if now - self._last.get(key, -EVENT_INTERVAL_SECONDS) < EVENT_INTERVAL_SECONDS:
            return
        if len(self._last) >= EVENT_KEYS:
            self._last.clear()
        self._last[key] = now
        version = self.resolver.metal3_version or "v1beta1"
        self.recorder.record(
            ObjectEvent(
                "Metal3Data",
                f"{METAL3_GROUP}/{version}",
                secret.namespace,
                secret.metal3data,
                REASON_JOIN_DATA_WITHHELD,
                message,
                "Warning",
                "Admit",
                metal3data["uid"],
            )
        )


def make_handler(
    resolver: InjectionResolver,
    metrics: InjectionMetrics,
    allowed_requesters: frozenset[str],
    events: WithheldEvents,
) -> AdmissionHandler:
    changes = CacheChanges()
    resolver.add_change_listener(changes.changed)

    async def owner(secret: MetaDataSecret) -> dict[str, Any] | Unresolved | Unverified:
        """The verified owner's record; reads caches only (no API call on a review's behalf)."""
        try:
            check = resolver.check_owner(secret)
        except NeedsWait:
            cold = await asyncio.to_thread(resolver.wait_for_metal3_caches)
            if cold is not None:
                return Unresolved(cold)
            check = resolver.check_owner(secret)
        deadline = time.monotonic() + VERIFY_WAIT_SECONDS
        while check.absent and (remaining := deadline - time.monotonic()) > 0:
            changed = changes.arm()
            check = resolver.check_owner(secret)  # read after arming: a change from here on wakes the wait
            if check.absent:
                await changes.wait(changed, remaining)
                check = resolver.check_owner(secret)
        if check.absent:
            resolver.remember_absent(secret)
        return check.verified if check.verified is not None else Unverified()

    async def handle(request: dict[str, Any]) -> AdmissionResponse:
        secret = select(request)
        if secret is None:
            return allow()
        reason = withheld(secret, allowed_requesters)
        if reason is not None:
            if secret.metadata_unchanged:  # e.g. the baremetal-operator labelling the Secret it consumes
                return allow()
            metrics.withheld.labels(reason).inc()
            response = withhold(secret, reason)
            try:
                verified = resolver.check_owner(secret).verified
            except NeedsWait:
                verified = None
            if verified is not None:
                events.report(secret, verified, response.message)
            return response
        metal3data = await owner(secret)
        if not isinstance(metal3data, dict):
            if isinstance(metal3data, Unverified):
                metrics.unverified.inc()
            return respond(secret, metal3data)
        try:
            resolution = resolver.resolve(secret, metal3data)  # warm caches: dict reads, no I/O
        except NeedsWait:
            resolution = await asyncio.to_thread(resolver.resolve, secret, metal3data, True)
        return await respond_off_loop(secret, resolution)

    return handle


def create_app(
    resolver: InjectionResolver,
    metrics: InjectionMetrics,
    max_body_bytes: int,
    allowed_requesters: frozenset[str],
    events: EventRecorder | None = None,
    deadline_seconds: float = 5.0,
) -> ASGIApp:
    handler = make_handler(resolver, metrics, allowed_requesters, WithheldEvents(events, resolver))
    endpoint = AdmissionEndpoint(WEBHOOK_NAME, handler, metrics.webhook, max_body_bytes, deadline_seconds)
    return admission_app("SliMe injection webhook", PATH, endpoint)
