"""Columns as PostgreSQL's binary arrays (storage/pg_arrays.py, made in storage/_pg_arrays.pyx):
the server reads each value back exactly, NULLs included, and a value an array cannot hold is
refused before anything is sent."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

from kvscope.storage.pg_arrays import columns, register

ROWS = [
    (1, 2**40, 0.1, b"ab\x00\xff", "x", 7),
    (None, -(2**63), None, None, None, None),
    (-(2**31), 2**63 - 1, 5e-324, b"", 'a,"b}{ NULL', 2**15 - 1),
    (0, None, -0.0, b"\\", "é ü\\", -1),
    (3, 0, 1.7976931348623157e308, bytes(range(256)), "", 0),
]
KINDS = b"iqdbti"
TYPES = "integer[], bigint[], float8[], bytea[], varchar[], smallint[]"


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    url = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        register(connection)
        yield connection


def _sent(
    conn: psycopg.Connection[tuple[object, ...]], rows: Sequence[tuple[object, ...]]
) -> list[list[Any]]:
    casts = ", ".join(f"%b::{t}" for t in TYPES.split(", "))
    found = conn.execute(f"SELECT {casts}", columns(rows, KINDS)).fetchone()
    assert found is not None
    return [list(column) for column in found]  # type: ignore[call-overload]


def test_each_value_comes_back_exactly(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    back = _sent(conn, ROWS)
    assert back == [list(column) for column in zip(*ROWS, strict=True)]
    assert [math.copysign(1.0, v) for v in back[2] if v is not None][2] == -1.0  # -0.0 kept


def test_nan_and_infinities(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    rows = [(0, 0, v, b"", "", 0) for v in (math.nan, math.inf, -math.inf)]
    floats = _sent(conn, rows)[2]
    assert math.isnan(floats[0]) and floats[1:] == [math.inf, -math.inf]


def test_no_rows_are_empty_arrays(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    assert _sent(conn, []) == [[]] * len(KINDS)


def test_ids_put_for_the_first_column(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    found = conn.execute(
        "SELECT %b::integer[], %b::text[]",
        columns([("a", "x"), ("b", "y"), ("a", "z")], b"it", {"a": 5, "b": 6}),
    ).fetchone()
    assert found == ([5, 6, 5], ["x", "y", "z"])


@pytest.mark.parametrize(
    ("kind", "value", "error"),
    [
        (b"i", 2**31, OverflowError),
        (b"q", 2**63, OverflowError),
        (b"i", 1.5, TypeError),
        (b"d", "1", TypeError),
        (b"t", b"x", TypeError),
    ],
)
def test_a_value_the_array_cannot_hold_is_refused(
    kind: bytes, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        columns([(value,)], kind)


def test_a_short_row_is_refused() -> None:
    with pytest.raises(TypeError, match="row 1"):
        columns([(1, 2), (1,)], b"ii")


def test_ids_missing_are_made_once_each_in_order() -> None:
    asked: list[str] = []

    def stream_id(stream: str) -> int:
        asked.append(stream)
        return 10 + len(asked)

    ids = {"b": 5}
    rows = [("a", "x"), ("b", "y"), ("c", "z"), ("a", "w")]
    with_ids = columns(rows, b"it", ids, stream_id)
    assert asked == ["a", "c"]
    assert ids == {"b": 5, "a": 11, "c": 12}
    assert [c.data for c in with_ids] == [
        c.data for c in columns([(11, "x"), (5, "y"), (12, "z"), (11, "w")], b"it")
    ]


def test_an_id_missing_without_a_maker_is_refused() -> None:
    with pytest.raises(KeyError):
        columns([("a", 1)], b"ii", {"b": 5})


_CHANGES_ITS_ROWS = """
from kvscope.storage.pg_arrays import columns

class Number:
    # An int column's value: reading it as an integer runs `__index__`, which empties the rows.
    def __init__(self, rows):
        self.rows = rows
    def __index__(self):
        self.rows.clear()
        return 1

rows = []
rows += [(i % 3, Number(rows)) for i in range(2000)]
print(len(columns(rows, b"iq")[1].data))

rows = [(i % 3, i) for i in range(2000)]
def stream_id(stream):
    # Asked for an id, it empties the rows (as a caller's maker could).
    rows.clear()
    return 10 + stream
print(len(columns(rows, b"iq", {}, stream_id)[0].data))
"""


def test_python_code_that_changes_the_rows_list_cannot_crash_the_arrays() -> None:
    """The arrays read rows unchecked in C; an element's `__index__` or the id maker, Python
    code, that empties the list meanwhile must not make them read freed memory (run apart: a
    crash would end pytest)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHANGES_ITS_ROWS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(20 + 2000 * 12), str(20 + 2000 * 8)]
