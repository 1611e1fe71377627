"""The real-Kubernetes tier (issue 12): the one-time build before any test runs (``pytest_collection_finish``,
only when a ``real_k8s`` test was selected; :mod:`testbed.real.story`). Its fixtures are in
:mod:`testbed.real.fixtures`."""

from __future__ import annotations

import pytest

from testbed.real.story import prepare, progress_writer


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("real_k8s") for item in session.items):
        return
    prepare(progress_writer(session.config))
