"""The injection admission's wait for an owner CAPM3 created a moment ago: woken by the watch, not by a timer."""

from __future__ import annotations

import asyncio

from common.cache import CacheChanges
from injection_webhook.resolver import InjectionResolver
from kubemu import Emulator
from testbed.framework.world import seed_metal3

from .test_resolver import review_of


def test_a_wait_for_an_owner_is_woken_by_the_watch_event_that_brings_it(
    emulator: Emulator, resolver: InjectionResolver
) -> None:
    assert resolver.wait_for_metal3_caches() is None
    changes = CacheChanges()
    resolver.add_change_listener(changes.changed)

    async def wait_for_an_owner(index: int) -> int:
        """How many cache changes woke the wait for a Metal3Data created now (0: the watch was first)."""
        changed = changes.arm()  # before the create, as the app arms before it reads the caches
        _, data = seed_metal3(emulator, index=index)
        review = review_of(data)
        wakes = 0
        while resolver.check_owner(review).verified is None:
            # The bound only ends a broken wait: woken by a change, it returns as soon as the watch delivers.
            await changes.wait(changed, 30)
            assert changed.done(), "the wait ran out without a cache change waking it"
            wakes += 1
            changed = changes.arm()
        return wakes

    # The watch runs in a thread of its own and may deliver the object before the first read of the cache;
    # then there was nothing to wait for, and the next Metal3Data tries again (bounded).
    woken = any(asyncio.run(wait_for_an_owner(index)) for index in range(20))
    assert woken, "every Metal3Data was in the cache at the first read: no wait was exercised"


def test_a_wait_with_no_change_ends_at_its_bound() -> None:
    changes = CacheChanges()

    async def unchanged() -> bool:
        changed = changes.arm()
        await changes.wait(changed, 0.01)
        return changed.done()

    assert asyncio.run(unchanged()) is False
