"""Waiting until a condition holds: the kit's one polling loop.

Every wait of the tests, the demo, the benchmarks and the real components goes through
:func:`wait_for`. A timeout is seconds or the name of an interval of
:data:`testbed.framework.pins.INTERVALS` (which also sets how often to look). On a timeout it
raises :class:`~testbed.framework.errors.WaitTimeout` with what it waited for and, when given,
the ``diagnostics`` of whoever waited (the components' log tails, a site's state).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from testbed.framework.errors import WaitTimeout
from testbed.framework.pins import INTERVALS

T = TypeVar("T")

__all__ = ["WaitTimeout", "wait_for", "waiter"]


def wait_for(
    condition: Callable[[], T],
    timeout: float | str = "default",
    what: str = "condition",
    interval: float | None = None,
    diagnostics: Callable[[], str] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``condition()`` until its value is truthy and return it.

    ``timeout``: seconds, or a name in :data:`~testbed.framework.pins.INTERVALS`. ``interval``:
    seconds between calls (default: the named interval's, else 0.01). ``retry_on``: exceptions
    that mean "not yet" (an API server restarting); any other exception propagates at once (a
    process that exited). On a timeout, :class:`WaitTimeout` carries ``diagnostics()``.
    """
    named = INTERVALS[timeout] if isinstance(timeout, str) else None
    seconds = named.timeout if named else float(timeout)
    poll = interval if interval is not None else (named.poll if named else 0.01)
    deadline = time.monotonic() + seconds
    last_error = ""
    while True:
        try:
            value = condition()
        except retry_on as exc:
            value, last_error = None, f"{type(exc).__name__}: {exc}"
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(_message(seconds, what, last_error, diagnostics))
        time.sleep(poll)


def _message(seconds: float, what: str, last_error: str, diagnostics: Callable[[], str] | None) -> str:
    lines = [f"timed out after {seconds:g} s waiting for {what}"]
    if last_error:
        lines.append(f"last error: {last_error[:500]}")
    if diagnostics is not None:
        try:
            lines.append(diagnostics())
        except Exception as exc:  # noqa: BLE001 - the timeout is the failure; a broken report must not hide it
            lines.append(f"(diagnostics failed: {type(exc).__name__}: {exc})")
    return "\n".join(lines)


def waiter(
    interval: float | None = None,
    diagnostics: Callable[[], str] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Callable[..., Any]:
    """:func:`wait_for` with a site's interval, diagnostics and transient errors filled in (``waiter(...)(cond,
    timeout, what)``)."""
    return functools.partial(wait_for, interval=interval, diagnostics=diagnostics, retry_on=retry_on)
