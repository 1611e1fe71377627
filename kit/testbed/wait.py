"""Poll until a condition holds: the one waiting helper of tests, demo and benchmark."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold in time; the message names it and the time waited.

    An AssertionError, so a test that waits fails (not errors) the way an assert does.
    """


def wait_for(condition: Callable[[], T], timeout: float = 5.0, what: str = "condition", interval: float = 0.01) -> T:
    """Call ``condition()`` until its value is truthy and return it;
    raise :class:`WaitTimeout` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
