"""docs/performance.md is assembled from sections, each written by the command that measures it.

A section sits between ``<!-- section: NAME -->`` and ``<!-- end section: NAME -->``; a command
replaces only its own section (or appends it), so one benchmark can be re-run without the others.
"""

from __future__ import annotations

import re
from pathlib import Path


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
