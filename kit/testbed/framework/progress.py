"""Progress lines of long steps (builds, a site coming up): on the terminal, even under pytest's output capture."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

Progress = Callable[[str], None]


def to_stderr(line: str) -> None:
    """The default progress sink: the process's real stderr, even under pytest's capture of sys.stderr."""
    print(f"[slime real] {line}", file=sys.__stderr__, flush=True)


def quiet(_: str) -> None:
    """A progress sink that drops every line."""


def progress_writer(config: Any, tier: str = "real") -> Progress:
    """Progress lines for a pytest session (``config``: its ``pytest.Config``), through its terminal reporter."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def write(line: str) -> None:
        text = f"[slime {tier}] {line}"
        if reporter is not None and capman is not None:
            with capman.global_and_fixture_disabled():
                reporter.write_line(text)
        else:
            print(text, flush=True)

    return write
