"""Columns sent to PostgreSQL as whole arrays in binary (storage/_pg_arrays.pyx makes them):
the types psycopg is given for them, and their dumpers, which hand the bytes over as they are.

psycopg dumps a list element by element in Python (and scans it for its type first), and a
column of numbers sent as an array literal in text costs a `str` of each; an array made in C
costs neither. Each PostgreSQL connection gets the dumpers as it opens (storage/engine.py):
psycopg looks a parameter's dumper up by its Python type."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from psycopg.abc import AdaptContext
from psycopg.adapt import Dumper
from psycopg.pq import Format

from kvscope.storage._pg_arrays import ARRAY_OIDS, BYTEA, FLOAT8, INT4, INT8, TEXT, arrays

__all__ = ["BYTEA", "FLOAT8", "INT4", "INT8", "TEXT", "BinaryArray", "columns", "register"]


class BinaryArray:
    """An array in PostgreSQL's binary form, of the element kind its class says."""

    __slots__ = ("data",)
    kind: ClassVar[int]

    def __init__(self, data: bytes) -> None:
        self.data = data


_CLASSES = {
    kind: type(f"BinaryArray_{chr(kind)}", (BinaryArray,), {"__slots__": (), "kind": kind})
    for kind in (INT4, INT8, FLOAT8, BYTEA, TEXT)
}


class _ArrayDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        data: bytes = obj.data
        return data


_DUMPERS = {
    kind: type(f"ArrayDumper_{chr(kind)}", (_ArrayDumper,), {"oid": ARRAY_OIDS[kind]})
    for kind in _CLASSES
}


def register(context: AdaptContext) -> None:
    """The arrays' dumpers, on a psycopg connection (or any adapting context)."""
    for kind, cls in _CLASSES.items():
        context.adapters.register_dumper(cls, _DUMPERS[kind])


def columns(
    rows: Sequence[Any],
    kinds: bytes,
    ids: dict[Any, int] | None = None,
    stream_id: Callable[[Any], int] | None = None,
) -> tuple[BinaryArray, ...]:
    """Each column of `rows` (tuples) as a `BinaryArray` of its kind (`kinds`: one a column);
    with `ids`, each row's first value put as `ids[value]`, where `stream_id` makes (into
    `ids`) those it lacks: looked up in C, not gathered in Python first."""
    made = arrays(rows if type(rows) is list else list(rows), kinds, ids, stream_id)
    return tuple(_CLASSES[kind](data) for kind, data in zip(kinds, made, strict=True))
