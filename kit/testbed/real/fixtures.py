"""Fixtures the real tiers share (a pytest plugin, loaded by ``tests/conftest.py``): a control plane, the tier's
stack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.real.controlplane import ControlPlane
from testbed.real.story import Stack, start_control_plane, start_stack


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own, with the upstream CRDs and no webhooks."""
    cp = start_control_plane(tmp_path_factory.mktemp("control-plane"))
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The chart installed with helm, both webhooks as the chart's pods (:func:`testbed.real.story.start_stack`)."""
    stack = start_stack(tmp_path_factory.mktemp("stack"))
    yield stack
    stack.stop_webhooks()
    stack.cp.stop()
