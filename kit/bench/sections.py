"""docs/performance.md is assembled from sections, each written by the command that measures it.

A section sits between ``<!-- section: NAME -->`` and ``<!-- end section: NAME -->``; a command
replaces only its own section (or appends it), so one benchmark can be re-run without the others.
The main benchmark renders the page's head; :func:`write_head` keeps every section already there.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
from pathlib import Path

_ANY_SECTION = re.compile(r"<!-- section: (?P<name>[\w-]+) -->\n.*?<!-- end section: (?P=name) -->\n?", re.DOTALL)


def replace_section(path: Path, name: str, text: str) -> None:
    begin, end = f"<!-- section: {name} -->", f"<!-- end section: {name} -->"
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    document = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(document):
        document = pattern.sub(lambda _: block, document)
    else:
        document = document.rstrip() + "\n\n" + block
    path.write_text(document)


def write_head(path: Path, head: str) -> None:
    """Write ``head`` as the page, followed by the sections the page holds now (other commands measured them)."""
    previous = path.read_text() if path.exists() else ""
    sections = [match.group(0).rstrip() + "\n" for match in _ANY_SECTION.finditer(previous)]
    path.write_text("\n".join([head.rstrip() + "\n", *sections]))


def measured_on() -> str:
    """Where and when a section was measured: "the 2-core development machine (x86_64), <date> UTC, commit <c>"."""
    repo = Path(__file__).resolve().parents[2]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    return (
        f"the {os.cpu_count()}-core development machine ({platform.machine()}), "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {commit.stdout.strip() or 'unknown'}"
    )
