"""What a run reports at its end, gathered from every pytest-xdist worker.

Under ``-n 2`` the tests run in worker processes: what they print is not shown, and what they
collect in module globals stays in them. The run's figures (the reliability scenarios', the
real-Slurm simulation's), its lines (the audits' verdicts, the real components' build progress)
are therefore kept here: each worker hands them to the controller when it ends
(:func:`worker_output`, through xdist's ``workeroutput``), the controller merges them
(:func:`merge`), prints them at the end and writes each group of figures to the file its
environment variable names. Without xdist the one process does all of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# group -> (name -> figure): e.g. "reliability figures" -> {"cert_rotation": {...}}
FIGURES: dict[str, dict[str, Any]] = {}
FIGURE_FILES: dict[str, str] = {}  # group -> the environment variable naming the JSON file it is written to
LINES: dict[str, list[str]] = {}  # section -> its lines, in the order they came
KEY = "slime_summary"  # the workeroutput key


def figures(group: str, env: str = "") -> dict[str, Any]:
    """The figures of ``group`` (one dict for the process: tests add to it); ``env``: the variable naming the file the
    group is written to at the end."""
    if env:
        FIGURE_FILES[group] = env
    return FIGURES.setdefault(group, {})


def line(section: str, text: str) -> None:
    LINES.setdefault(section, []).append(text)


def worker_output() -> dict[str, Any]:
    return {"figures": FIGURES, "files": FIGURE_FILES, "lines": LINES}


def merge(output: dict[str, Any]) -> None:
    """Add what a worker gathered to this process's summary."""
    for group, named in output.get("figures", {}).items():
        FIGURES.setdefault(group, {}).update(named)
    FIGURE_FILES.update(output.get("files", {}))
    for section, texts in output.get("lines", {}).items():
        LINES.setdefault(section, []).extend(texts)


def write_figure_files() -> None:
    for group, env in FIGURE_FILES.items():
        target = os.environ.get(env)
        if target and FIGURES.get(group):
            Path(target).write_text(json.dumps(FIGURES[group], indent=2, sort_keys=True) + "\n")


def report(terminalreporter: Any) -> None:
    """Print every section and every group of figures (the controller's, or the one process's, terminal summary)."""
    for section, texts in LINES.items():
        terminalreporter.section(section)
        for text in texts:
            terminalreporter.write_line(text)
    for group, named in FIGURES.items():
        if named:
            terminalreporter.section(group)
            for name in sorted(named):
                terminalreporter.write_line(f"{name}: {json.dumps(named[name], sort_keys=True)}")
