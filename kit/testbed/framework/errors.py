"""The kit's exception family: every error the kit raises is a :class:`KitError`.

- :class:`ComponentUnavailable`: a prerequisite is missing on this machine (a registry, a binary,
  a privilege). A real tier skips with its message locally and fails under ``CI=true``
  (:func:`testbed.framework.prerequisites.unavailable`).
- :class:`ComponentFailed`: a real component was there and did not do its part (its message ends
  with the end of its log).
- :class:`ApiCallFailed`: an API server answered a call with an error status.
- :class:`WaitTimeout`: a condition did not hold in time. It is also an ``AssertionError``, so a
  test that waits fails (not errors) the way an assert does, and its message carries the
  diagnostics the waiter asked for.
"""

from __future__ import annotations


class KitError(RuntimeError):
    """Something the kit could not do; the message says what, and what to try."""


class ComponentUnavailable(KitError):
    """A prerequisite of a real component is missing here (skip locally, fail under CI=true)."""


class ComponentFailed(KitError):
    """A real component was available and failed (its message carries the end of its log)."""


class ApiCallFailed(ComponentFailed):
    """An API server answered with an error status: the call, the status and the start of the answer."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:500]}")
        self.method, self.path, self.status, self.body = method, path, status, body


class WaitTimeout(KitError, AssertionError):
    """A condition did not hold in time; the message names it, the time waited and the diagnostics."""
