"""Markdown tables in the docs render as tables: each starts with a header row and a separator
row. A blank line inside a table ends it, and the rows after it show as plain text with pipes
(as happened to the metrics table in OPERATIONS.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")


def table_starts(text: str) -> list[tuple[int, list[str]]]:
    """(line number, the table's first two lines) for each run of table rows outside code."""
    starts = []
    in_code = False
    previous_was_row = False
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
        is_row = not in_code and line.startswith("|")
        if is_row and not previous_was_row:
            starts.append((number, lines[number - 1 : number + 1]))
        previous_was_row = is_row
    return starts


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_table_has_a_header_and_a_separator(doc: Path) -> None:
    for number, (header, *rest) in table_starts(doc.read_text()):
        assert rest, f"{doc.name}:{number}: a table of one row"
        assert SEPARATOR.match(rest[0]), (
            f"{doc.name}:{number}: table rows with no header row and separator above them "
            "(a blank line inside a table?)"
        )
        assert header.count("|") == rest[0].count("|"), f"{doc.name}:{number}: columns differ"


def test_the_check_finds_a_table_cut_by_a_blank_line() -> None:
    cut = "| a | b |\n| --- | --- |\n| 1 | 2 |\n\n| 3 | 4 |\n"
    (_, first), (_, second) = table_starts(cut)
    assert SEPARATOR.match(first[1])
    assert not SEPARATOR.match(second[1] if len(second) > 1 else "")
