"""The log's rows read as columns, each stream's together (storage/_row_streams.pyx), as the
rows grouped in Python and read then; NamedTuple rows (tuples too) read as plain ones; and the
log's rows picked out of a transaction's."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, NamedTuple

import pytest

from kvscope.collector.types import StreamId
from kvscope.storage import log_runs
from kvscope.storage._row_streams import by_stream, fields_by_stream, plain_tuples
from kvscope.storage.log_chunks import ChunkRow
from kvscope.storage.rows import RollupRow


class NamedLogRow(NamedTuple):
    """A log row's fields by name: a tuple subclass, as rows from Python code may be."""

    stream: StreamId
    epoch: int
    seq: int
    ts: float
    recv_ts: float
    payload: bytes


def _grouped(rows: list[Any]) -> list[Any]:
    """Each stream's rows together, the streams in the order they first come."""
    groups: dict[Any, list[Any]] = {}
    for row in rows:
        groups.setdefault(row[0], []).append(row)
    return [row for group in groups.values() for row in group]


def _reference(rows: list[Any]) -> list[list[Any]]:
    return [[row[k] for row in _grouped(rows)] for k in range(6)]


def _rows(streams: list[StreamId], n: int) -> list[Any]:
    return [(streams[i % len(streams)], 1, i, float(i), float(i) + 0.5, b"x" * i) for i in range(n)]


def test_interleaved_streams_come_together_in_first_order() -> None:
    streams = [StreamId(f"r{k}", k % 2) for k in range(5)]
    rows = _rows(streams, 53)
    rows[7:9] = rows[8:6:-1]  # not round-robin everywhere
    assert fields_by_stream(rows, 6) == _reference(rows)
    assert by_stream(rows) == _grouped(rows)


def test_equal_streams_that_are_other_objects_are_one() -> None:
    rows = _rows([StreamId("a", 0), StreamId("b", 0)], 10)
    rows += [(StreamId("a", 0), 1, 99, 1.0, 2.0, b"y")]  # equal, not the same object
    out = fields_by_stream(rows, 6)
    assert out == _reference(rows)
    assert out[2][:6] == [0, 2, 4, 6, 8, 99]


def test_named_rows_are_grouped_as_plain_tuples_are() -> None:
    plain = _rows([StreamId("a", 0), StreamId("b", 1), StreamId("c", 0)], 31)
    named = [NamedLogRow(*row) for row in plain]
    mixed = [row if i % 3 else named[i] for i, row in enumerate(plain)]
    for rows in (named, mixed):
        assert fields_by_stream(rows, 6) == fields_by_stream(plain, 6) == _reference(plain)
        grouped = by_stream(rows)
        assert [id(row) for row in grouped] == [id(row) for row in _grouped(rows)]
        assert log_runs.split(rows) == log_runs.split(plain)


def test_one_stream_and_none() -> None:
    rows = _rows([StreamId("a", 0)], 4)
    assert fields_by_stream(rows, 6) == [list(column) for column in zip(*rows, strict=True)]
    assert fields_by_stream([], 6) == [[] for _ in range(6)]
    assert by_stream([]) == []


def test_rows_that_are_no_tuples_of_the_fields_are_refused() -> None:
    rows = _rows([StreamId("a", 0)], 4)
    with pytest.raises(TypeError, match="log row"):
        fields_by_stream([*rows, [StreamId("a", 0), 1, 2, 3.0, 4.0, b""]], 6)
    with pytest.raises(TypeError, match="log row"):
        fields_by_stream([(StreamId("a", 0), 1)], 6)
    with pytest.raises(TypeError, match="log row"):
        by_stream([*rows, ()])


def test_columns_by_stream_in_log_runs() -> None:
    rows = _rows([StreamId("a", 0), StreamId("b", 1), StreamId("c", 0)], 30)
    assert log_runs.columns_by_stream(rows) == _reference(rows)
    assert log_runs.columns_by_stream(tuple(rows)) == _reference(rows)


def test_the_log_rows_are_the_plain_tuples_in_order() -> None:
    stream = StreamId("a", 0)
    log = [(stream, 1, i, float(i), float(i) + 0.5, b"x" * i) for i in range(5)]
    rollup = RollupRow(stream, 1, "GPU", 0, 1, 1, 0, 1, 0, 0, 0)
    named = ChunkRow(stream, 0, 0, 0, 0.0, 0.0, 1, 1, b"", 0.0, 0.0)  # a tuple, not a plain one
    rows = [log[0], rollup, log[1], log[2], named, [stream], log[3], log[4]]
    assert plain_tuples(rows) == log
    assert plain_tuples(log) == log and plain_tuples(log) is not log
    assert plain_tuples([]) == []


_CHANGES_ITS_LIST = """
from kvscope.storage._row_streams import by_stream, fields_by_stream

class Key:
    # Keys of one hash: telling them apart runs `__eq__`, which empties the rows' list.
    def __init__(self, name, rows):
        self.name, self.rows = name, rows
    def __hash__(self):
        return 1
    def __eq__(self, other):
        self.rows.clear()
        return self.name == other.name

for grouping in (by_stream, lambda rows: fields_by_stream(rows, 2)):
    rows = []
    rows += [(Key(i % 2, rows), i) for i in range(2000)]
    grouped = grouping(rows)
    print(len(grouped[0]) if grouping is not by_stream else len(grouped))
"""


def test_a_key_that_changes_the_rows_list_cannot_crash_the_grouping() -> None:
    """The grouping reads rows unchecked in C: a stream key's Python `__eq__` that empties the
    list as it runs must not make it read freed memory (run apart: a crash would end pytest)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHANGES_ITS_LIST], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2000", "2000"]
