"""docs/performance.md keeps every benchmark's section when another benchmark rewrites its own part."""

from __future__ import annotations

from pathlib import Path

from bench.sections import replace_section, write_head


def test_the_main_report_keeps_the_sections_other_commands_wrote(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    write_head(page, "# Performance\n\nold table\n")
    replace_section(page, "whole-loop", "loop figures")
    replace_section(page, "demand-poll", "poll figures")

    write_head(page, "# Performance\n\nnew table\n")

    text = page.read_text()
    assert "old table" not in text and text.startswith("# Performance\n\nnew table\n")
    assert "<!-- section: whole-loop -->\nloop figures\n<!-- end section: whole-loop -->" in text
    assert "<!-- section: demand-poll -->\npoll figures\n<!-- end section: demand-poll -->" in text
    assert text.index("whole-loop") < text.index("demand-poll")


def test_a_section_is_replaced_in_place_and_appended_once(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    write_head(page, "# Performance\n")
    replace_section(page, "a", "first")
    replace_section(page, "b", "second")
    replace_section(page, "a", "again")

    text = page.read_text()
    assert text.count("<!-- section: a -->") == 1 and "again" in text and "first" not in text
    assert text.index("section: a") < text.index("section: b")
