"""The injection webhook's admission handler: one metaData Secret review, from request to answer.

:class:`InjectionAdmission` runs the pure decision (:mod:`injection_webhook.decision`) around the
resolver's cache reads:

1. ``select`` the metaData Secret (anything else is allowed untouched);
2. when the requester may not receive join data (a dry run, or not one of
   ``--allowed-requesters``), allow it unchanged, with a warning, a metric and, for a Metal3Data
   the cache holds, a rate-limited Event;
3. verify the owner against the cache (a brief wait, woken by the watch event, for a Metal3Data
   CAPM3 created a moment ago);
4. resolve from the caches (a cold cache is waited for in a worker thread) and merge; a template
   the operator's bindings do not cover is answered as in 2 (:class:`~injection_webhook.decision.Withheld`).

Large metaData edits run in a worker thread: editing means a budgeted walk of the YAML, a load,
the merge and a second load to check the result. For the few hundred bytes CAPM3 writes that
takes microseconds and runs inline; over :data:`INLINE_METADATA_BYTES` of base64 the parsers
would hold the event loop for milliseconds, so a burst of them would queue every admission
behind it. (Reviews over 64 KiB are also taken one at a time by the transport.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from common.admission import AdmissionResponse, allow
from common.cache import CacheChanges
from common.events import RateLimitedEvents, metal3data_event
from common.names import METAL3_GROUP, REASON_JOIN_DATA_WITHHELD
from injection_webhook.decision import (
    JoinInfo,
    MetaDataSecret,
    Resolution,
    Unresolved,
    Unverified,
    Withheld,
    respond,
    select,
    withheld,
    withhold,
)
from injection_webhook.metrics import InjectionMetrics
from injection_webhook.resolver import VERIFY_WAIT_SECONDS, InjectionResolver, NeedsWait

INLINE_METADATA_BYTES = 4 * 1024


class InjectionAdmission:
    """The injection webhook's admission handler (an ``AdmissionHandler``)."""

    def __init__(
        self,
        resolver: InjectionResolver,
        metrics: InjectionMetrics,
        allowed_requesters: frozenset[str],
        events: RateLimitedEvents,
    ) -> None:
        self.resolver = resolver
        self.metrics = metrics
        self.allowed_requesters = allowed_requesters
        self.events = events
        self._changes = CacheChanges()
        resolver.add_change_listener(self._changes.changed)

    async def __call__(self, request: dict[str, Any]) -> AdmissionResponse:
        secret = select(request)
        if secret is None:
            return allow()
        reason = withheld(secret, self.allowed_requesters)
        if reason is not None:
            if secret.metadata_unchanged:  # e.g. the baremetal-operator labelling the Secret it consumes
                return allow()
            try:
                verified = self.resolver.check_owner(secret).verified
            except NeedsWait:
                verified = None
            return self._withhold(secret, verified, reason)
        started = time.monotonic()
        metal3data = await self._owner(secret)
        if not isinstance(metal3data, dict):
            if isinstance(metal3data, Unverified):
                self.metrics.unverified.inc()
                # Every unverified review is answered after the same wait a name CAPM3 has not created yet
                # gets, so how fast the answer comes says nothing about which names exist.
                await asyncio.sleep(max(0.0, started + VERIFY_WAIT_SECONDS - time.monotonic()))
            return respond(secret, metal3data)
        try:
            resolution = self.resolver.resolve(secret, metal3data)  # warm caches: dict reads, no I/O
        except NeedsWait:
            resolution = await asyncio.to_thread(self.resolver.resolve, secret, metal3data, True)
        if isinstance(resolution, Withheld):
            return self._withhold(secret, metal3data, resolution.reason, resolution.why)
        return await answer(secret, resolution)

    def _withhold(
        self, secret: MetaDataSecret, verified: dict[str, Any] | None, reason: str, why: str = ""
    ) -> AdmissionResponse:
        """Allowed without join data; an Event on the Metal3Data when the cache holds it (never a live read)."""
        self.metrics.withheld.labels(reason).inc()
        response = withhold(secret, reason, why)
        if verified is not None:
            version = self.resolver.metal3_version or "v1beta1"
            self.events.record(
                metal3data_event(
                    secret.namespace,
                    secret.metal3data,
                    verified["uid"],
                    f"{METAL3_GROUP}/{version}",
                    REASON_JOIN_DATA_WITHHELD,
                    response.message,
                )
            )
        return response

    async def _owner(self, secret: MetaDataSecret) -> dict[str, Any] | Unresolved | Unverified:
        """The verified owner's record; reads caches only (no API call on a review's behalf)."""
        try:
            check = self.resolver.check_owner(secret)
        except NeedsWait:
            cold = await asyncio.to_thread(self.resolver.wait_for_metal3_caches)
            if cold is not None:
                return Unresolved(cold)
            check = self.resolver.check_owner(secret)
        deadline = time.monotonic() + VERIFY_WAIT_SECONDS
        while check.absent and (remaining := deadline - time.monotonic()) > 0:
            changed = self._changes.arm()
            check = self.resolver.check_owner(secret)  # read after arming: a change from here on wakes the wait
            if check.absent:
                await self._changes.wait(changed, remaining)
                check = self.resolver.check_owner(secret)
        if check.absent:
            self.resolver.remember_absent(secret)
        return check.verified if check.verified is not None else Unverified()


async def answer(secret: MetaDataSecret, resolution: Resolution) -> AdmissionResponse:
    """The answer for a resolved Secret: inline when nothing large is parsed, else in a worker thread."""
    if not isinstance(resolution, JoinInfo) or len(secret.encoded_metadata) <= INLINE_METADATA_BYTES:
        return respond(secret, resolution)
    return await asyncio.to_thread(respond, secret, resolution)
