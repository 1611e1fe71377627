"""The kit's exception family: every error the kit raises is a :class:`KitError`.

:class:`ComponentUnavailable` means a prerequisite is missing on this machine (a registry, a
binary, a privilege): a real tier skips with its message locally and fails under ``CI=true``.
:class:`ComponentFailed` means a real component was there and did not do its part. Test
verdicts (a host that never joined, a wait that timed out) stay ``AssertionError``s.
"""

from __future__ import annotations


class KitError(RuntimeError):
    """Something the kit could not do; the message says what, and what to try."""


class ComponentUnavailable(KitError):
    """A prerequisite of a real component is missing here (skip locally, fail under CI=true)."""


class ComponentFailed(KitError):
    """A real component was available and failed (its message carries the end of its log)."""
