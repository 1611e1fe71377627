"""The whole-loop tier (issue 15): real cert-manager, KEDA, Prometheus and Cluster API around the real-Kubernetes tier.

Everything is built or fetched once, before any test runs (``pytest_collection_finish``, outside
every test's timeout, only when a ``real_loop`` test is selected): :mod:`testbed.real.components`.
"""

from __future__ import annotations

import pytest

from testbed.real.components import prepare_all


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("real_loop") for item in session.items):
        return
    prepare_all(session.config)
