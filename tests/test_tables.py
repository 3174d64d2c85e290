"""Tables the commands print: whole cells at any width, piped or not, and JSON for scripts."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from kvscope.tables import TableData, boxed_width, show_table


def sample(rows: int = 3) -> TableData:
    table = TableData("resets", ["id", "time (UTC)", "replica", "mode", "before"])
    for i in range(rows):
        table.add(
            [str(i), f"2026-11-30 15:0{i}:00", f"replica-{i}/dp0", "preempt", f"{1000 + i} / 900"],
            {"id": i, "mode": "preempt", "before_blocks": 1000 + i},
        )
    table.notes.append("#9 a default refused: 3 requests running")
    return table


def render(table: TableData, *, terminal: bool, width: int, as_json: bool = False) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=width, color_system=None)
    show_table(console, table, as_json)
    return out.getvalue()


@pytest.mark.parametrize(("terminal", "width"), [(True, 40), (True, 80), (True, 200), (False, 80)])
def test_every_cell_is_shown_whole(terminal: bool, width: int) -> None:
    table = sample()
    text = render(table, terminal=terminal, width=width)
    for row in table.rows:
        for cell in row:
            assert cell in text
    assert "…" not in text
    assert table.notes[0] in text.replace("\n", " ")


def test_a_table_that_fits_the_terminal_is_boxed_and_one_that_does_not_is_plain() -> None:
    table = sample()
    wide = render(table, terminal=True, width=boxed_width(table))
    assert "│" in wide
    assert max(len(line) for line in wide.splitlines()) == boxed_width(table)
    narrow = render(table, terminal=True, width=boxed_width(table) - 1)
    assert "│" not in narrow


def test_piped_output_is_plain_columns_whatever_the_width() -> None:
    text = render(sample(), terminal=False, width=500)
    assert "│" not in text
    header = text.splitlines()[1]
    assert header.split() == ["id", "time", "(UTC)", "replica", "mode", "before"]


def test_json_has_the_records_and_the_notes() -> None:
    table = sample(2)
    parsed = json.loads(render(table, terminal=True, width=80, as_json=True))
    assert parsed["rows"] == table.records
    assert parsed["notes"] == table.notes


def test_a_row_must_have_a_cell_per_column() -> None:
    with pytest.raises(ValueError, match="2 cells for 5 columns"):
        sample().add(["a", "b"], {})


def test_a_terminal_too_narrow_for_columns_gets_one_block_per_row() -> None:
    """Plain columns wider than the terminal would wrap into a jumble: each row is shown as
    `column  value` lines instead, every line within the width."""
    table = sample()
    text = render(table, terminal=True, width=40)
    assert max(len(line) for line in text.splitlines()) <= 40, text
    lines = text.splitlines()
    for row in table.rows:
        for name, cell in zip(table.columns, row, strict=True):
            assert any(line.split() == [*name.split(), *cell.split()] for line in lines), text
    assert table.notes[0] in text.replace("\n", " ")
