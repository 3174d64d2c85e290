"""Tables the commands print: boxed when they fit the terminal, plain columns otherwise, JSON
for scripts.

A table is built once as `TableData` (the cells as shown, and the same rows as typed records for
`--json`) and rendered by `show_table`. A boxed rich table in a narrow terminal cuts its cells
(`pree…`, `202…`), and a piped one is cut to rich's default width: neither is readable, so a
table that does not fit, or goes anywhere but a terminal, is printed as plain aligned columns
that are never cut; in a terminal too narrow even for those (they would wrap into a jumble), one
block of `column  value` lines per row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

GAP = 2
"""Spaces between plain columns."""


@dataclass
class TableData:
    title: str
    columns: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)
    """Cells as shown (plain text, no markup)."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """The same rows for `--json`: typed values under stable keys."""
    notes: list[str] = field(default_factory=list)
    """Lines printed under the table (and as "notes" in JSON)."""

    def add(self, cells: Sequence[str], record: dict[str, Any]) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)
        self.records.append(record)

    def as_json(self) -> dict[str, Any]:
        return {"title": self.title, "rows": self.records, "notes": self.notes}


def widths(table: TableData) -> list[int]:
    return [
        max([len(name), *(len(row[i]) for row in table.rows)])
        for i, name in enumerate(table.columns)
    ]


def plain_lines(table: TableData) -> list[str]:
    """The title, a header, one line per row and the notes: columns aligned, nothing cut."""
    sizes = widths(table)

    def line(cells: Sequence[str]) -> str:
        return (" " * GAP).join(c.ljust(w) for c, w in zip(cells, sizes, strict=True)).rstrip()

    return [table.title, line(table.columns), *(line(row) for row in table.rows), *table.notes]


def plain_width(table: TableData) -> int:
    sizes = widths(table)
    return sum(sizes) + GAP * (len(sizes) - 1)


def row_blocks(table: TableData) -> list[str]:
    """The title, then each row as `column  value` lines under a `[n]` line, and the notes."""
    label = max(len(name) for name in table.columns)
    lines = [table.title]
    for n, row in enumerate(table.rows, 1):
        lines.append(f"[{n}]")
        lines.extend(
            f"  {name.ljust(label)}{' ' * GAP}{cell}"
            for name, cell in zip(table.columns, row, strict=True)
        )
    return [*lines, *table.notes]


def boxed_width(table: TableData) -> int:
    """The width of `rich_table(table)`: its cells, one space of padding each side, and the
    box's edges and dividers."""
    sizes = widths(table)
    return sum(sizes) + 3 * len(sizes) + 1


def rich_table(table: TableData) -> Table:
    shown = Table(title=table.title, box=box.SQUARE, caption_justify="left")
    for name in table.columns:
        shown.add_column(escape(name), no_wrap=True)
    for row in table.rows:
        shown.add_row(*(escape(cell) for cell in row))
    if table.notes:
        shown.caption = escape("\n".join(table.notes))
    return shown


def show_table(console: Console, table: TableData, as_json: bool = False) -> None:
    """Print `table` as JSON, as a boxed table if it fits the terminal, else as plain columns
    (or, in a terminal too narrow for them, a block per row)."""
    if as_json:
        console.file.write(json.dumps(table.as_json(), default=str) + "\n")
        console.file.flush()
    elif console.is_terminal and boxed_width(table) <= console.width:
        console.print(rich_table(table))
    else:
        too_wide = console.is_terminal and plain_width(table) > console.width
        lines = row_blocks(table) if too_wide else plain_lines(table)
        for text in lines:
            console.file.write(text + "\n")
        console.file.flush()
