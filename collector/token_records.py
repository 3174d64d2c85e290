"""A table's tokens column as checkpoint formats 3 and 5 keep it: each slot's block number into
the table's distinct blocks (collector/block_table.py gives it, collector/snapshot_columns.py and
collector/snapshot.py write and restore it)."""

from __future__ import annotations

from typing import Any, NamedTuple


class TokenRecords(NamedTuple):
    """A tokens column as format 3 keeps it, each slot's block number into the distinct blocks:
    what `table_from_state` restores a table from without expanding it first, and what
    `to_state(interned_tokens=True)` gives without the column unpacked."""

    numbers: Any
    records: Any
