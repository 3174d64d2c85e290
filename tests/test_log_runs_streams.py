"""The log's rows read as columns, each stream's together (storage/_row_streams.pyx), as the
rows grouped in Python and read then."""

from __future__ import annotations

from typing import Any

from kvscope.collector.types import StreamId
from kvscope.storage import log_runs
from kvscope.storage._row_streams import fields_by_stream


def _reference(rows: list[Any]) -> list[list[Any]]:
    return log_runs._columns(log_runs._by_stream(rows))


def _rows(streams: list[StreamId], n: int) -> list[Any]:
    return [(streams[i % len(streams)], 1, i, float(i), float(i) + 0.5, b"x" * i) for i in range(n)]


def test_interleaved_streams_come_together_in_first_order() -> None:
    streams = [StreamId(f"r{k}", k % 2) for k in range(5)]
    rows = _rows(streams, 53)
    rows[7:9] = rows[8:6:-1]  # not round-robin everywhere
    assert fields_by_stream(rows, 6) == _reference(rows)


def test_equal_streams_that_are_other_objects_are_one() -> None:
    rows = _rows([StreamId("a", 0), StreamId("b", 0)], 10)
    rows += [(StreamId("a", 0), 1, 99, 1.0, 2.0, b"y")]  # equal, not the same object
    out = fields_by_stream(rows, 6)
    assert out == _reference(rows)
    assert out[2][:6] == [0, 2, 4, 6, 8, 99]


def test_one_stream_and_none() -> None:
    rows = _rows([StreamId("a", 0)], 4)
    assert fields_by_stream(rows, 6) == log_runs._columns(rows)
    assert fields_by_stream([], 6) == [[] for _ in range(6)]
    assert fields_by_stream([*rows, [StreamId("a", 0), 1, 2, 3.0, 4.0, b""]], 6) is None
    assert fields_by_stream([(StreamId("a", 0), 1)], 6) is None


def test_fields_by_stream_in_log_runs() -> None:
    rows = _rows([StreamId("a", 0), StreamId("b", 1), StreamId("c", 0)], 30)
    assert log_runs._fields_by_stream(rows) == _reference(rows)
    assert log_runs._fields_by_stream(tuple(rows)) == _reference(rows)
