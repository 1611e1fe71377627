"""What a real-component tier does when something it needs is missing: skip locally, fail in CI.

CI runs the whole suite with ``CI=true``; there a tier that cannot run is a failure with its
reason, never a silent skip. On a developer's machine the same reason is a one-line skip.
"""

from __future__ import annotations

import os


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """Stop the current test: ``pytest.fail`` under ``CI=true``, ``pytest.skip`` otherwise."""
    import pytest

    if in_ci():
        pytest.fail(f"CI=true and a prerequisite is missing: {reason}", pytrace=False)
    pytest.skip(reason)
