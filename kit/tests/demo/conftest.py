"""The demo runs its own emulator and routes logs to its own file: both join the session's audits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from demo.environment import DemoEnvironment
from testbed.framework.audit import EVIDENCE, RECORDED_CALLS, EvidenceHandler


@pytest.fixture
def audited() -> Iterator[Callable[[DemoEnvironment], None]]:
    """An ``on_start`` callback for ``demo.main.main``.

    The demo's log lines (it replaces the root handlers with its log file) reach the secret scan,
    and its emulator's API calls the RBAC audit, at the end of the session.
    """
    environments: list[DemoEnvironment] = []

    def started(env: DemoEnvironment) -> None:
        environments.append(env)
        logging.getLogger().addHandler(EvidenceHandler(EVIDENCE))  # dropped when the demo restores the handlers

    yield started
    for env in environments:
        if env.emulator is not None:
            RECORDED_CALLS.extend(env.emulator.requests)
