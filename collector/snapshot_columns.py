"""A table state's arrays rewritten as the snapshot formats lay them out, and back.

Format 2 splits each array into byte planes (`_as_planes`); format 3 first drops what the
columns repeat (`_deduplicated`: parents the tree already names, slot numbers, last store times
equal to the first, token blocks stored once each); format 5 also leaves out what the child
lists imply (`_implied`). collector/snapshot.py and collector/snapshot_delta.py frame and
compress the states these make.
"""

from __future__ import annotations

from array import array
from functools import cache
from typing import Any, Literal

from kvscope.collector._byte_planes import join_planes, split_planes
from kvscope.collector._checkpoint_columns import (
    aligned,
    by_slot,
    expand_records,
    from_slots,
    intern_records,
    minus,
    previous_siblings,
    same_bytes,
    xor_linked_parents,
)
from kvscope.collector.block_table import BlockTable
from kvscope.collector.token_records import TokenRecords
from kvscope.collector.types import TableKey

_ARRAYS = ("hashes", "slots", "free")
"""A table state's array fields besides its `columns`."""


def _as_planes(table: dict[str, Any]) -> dict[str, Any]:
    """A table state of format 1 as format 2: each array as byte planes, its width beside it."""
    flat = [memoryview(a).cast("B") for a in (*(table[n] for n in _ARRAYS), *table["columns"])]
    widths = [_width(len(a), size) for a, size in zip(flat, _item_sizes(), strict=True)]
    planes = [a if w == 1 else split_planes(a, w) for a, w in zip(flat, widths, strict=True)]
    return {
        **table,
        **dict(zip(_ARRAYS, planes, strict=False)),
        "columns": planes[len(_ARRAYS) :],
        "widths": widths,
    }


@cache
def _typecodes() -> tuple[str, ...]:
    """The array type of each of a table state's arrays (`_ARRAYS`, then its columns): a state
    read back from msgpack has only bytes, so the types come from the table itself."""
    table = BlockTable(TableKey("GPU", 0), 0.0)
    types = {"hashes": "Q", "slots": "i", "free": "i"}
    return (
        *(types[name] for name in _ARRAYS),
        *(getattr(table, name).typecode for name in BlockTable._COLUMNS),
    )


@cache
def _item_sizes() -> tuple[int, ...]:
    return tuple(array(typecode).itemsize for typecode in _typecodes())


def _width(size: int, item_size: int) -> int:
    """Planes of `item_size` when the bytes are whole items of it (a column written with a
    narrower type is not): any width goes back exactly, the item's packs best."""
    return item_size if size % item_size == 0 else 1


def _from_planes(table: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `_as_planes`."""
    widths = table.pop("widths")
    planes = [table[name] for name in _ARRAYS] + list(table["columns"])
    arrays = [
        p if w == 1 else join_planes(p, w, typecode)
        for p, w, typecode in zip(planes, widths, _typecodes(), strict=True)
    ]
    return {
        **table,
        **dict(zip(_ARRAYS, arrays, strict=False)),
        "columns": arrays[len(_ARRAYS) :],
    }


_PARENT, _FIRST_CHILD, _NEXT_SIBLING, _FIRST_MS, _LAST_MS, _TOKENS = (
    BlockTable._COLUMNS.index(name)
    for name in ("_parent", "_first_child", "_next_sibling", "_first_ms", "_last_ms", "_tokens")
)
_TOKEN_ITEM = 4
"""Bytes per token in the tokens column (and in `token_blocks`' planes)."""


def _deduplicated(
    table: dict[str, Any], known: bytes = b"", compact: bool = False
) -> dict[str, Any]:
    """A table state of format 1 without what format 3 leaves out (still format 1's shape):
    - parents XORed with their linked parent's hash;
    - the slot map as each slot's hash (0 for a free one) and a bitmap of the slots in use
      (`present`), `slots` empty;
    - last store times as their difference from the first (mostly 0);
    - the tokens column, when it is whole blocks, as block numbers plus the distinct blocks
      (`token_blocks`, as byte planes).

    Token blocks in `known` (distinct records, as a key checkpoint holds them) are numbered
    first, and left out of `token_blocks`: a delta names them in its key. `compact` (format 5)
    also leaves out what the child lists imply (`_implied`)."""
    # The arrays read as items more than once, as items once (aligned: copied if need be).
    table = {**table, "hashes": _items(table["hashes"], "Q"), "slots": _items(table["slots"], "i")}
    columns = list(table["columns"])
    for at in (_FIRST_CHILD, _NEXT_SIBLING):
        columns[at] = _items(columns[at], "i")
    columns[_PARENT] = _linked_parents_xored(table, columns)
    n_slots = len(columns[_PARENT])  # (an array of them now)
    hash_of_slot, present = by_slot(table["hashes"], table["slots"], n_slots)
    columns[_LAST_MS] = minus(_items(columns[_LAST_MS], "I"), _items(columns[_FIRST_MS], "I"))
    implied = _implied(columns) if compact else None
    record = table["block_size"] * _TOKEN_ITEM
    blocks = None
    if type(columns[_TOKENS]) is TokenRecords and not known:
        numbers, distinct = columns[_TOKENS]
        columns[_TOKENS] = numbers
        blocks = split_planes(distinct, _TOKEN_ITEM)
        return _with_slots(table, columns, hash_of_slot, present, blocks, implied)
    if type(columns[_TOKENS]) is TokenRecords:
        numbers, distinct = columns[_TOKENS]
        columns[_TOKENS] = expand_records(numbers, distinct, record)
    tokens = memoryview(columns[_TOKENS]).cast("B")
    if record and len(tokens) % record == 0:
        columns[_TOKENS], distinct = intern_records(tokens, record, known)
        blocks = split_planes(distinct, _TOKEN_ITEM)
    return _with_slots(table, columns, hash_of_slot, present, blocks, implied)


def _with_slots(
    table: dict[str, Any],
    columns: list[Any],
    hash_of_slot: Any,
    present: Any,
    blocks: Any,
    implied: list[str] | None,
) -> dict[str, Any]:
    """`_deduplicated`'s state, from its rewritten parts."""
    state = {
        **table,
        "hashes": hash_of_slot,
        "slots": b"",
        "present": present,
        "columns": columns,
        "token_blocks": blocks,
    }
    if implied is not None:
        state["implied"] = implied
    return state


_PREV_SIBLING = BlockTable._COLUMNS.index("_prev_sibling")
_IMPLIED = ("prev_sibling",)
"""What format 5 may leave out: previous siblings (the next siblings say them)."""


def _implied(columns: list[Any]) -> list[str]:
    """Rewrites `columns` (a copy) as `_IMPLIED` allows; the names of the rewrites made (what
    the other columns do not say exactly, a free slot's stale link say, is left as it is)."""
    n_slots = memoryview(columns[_PARENT]).nbytes // 8
    if not _whole(columns, n_slots, _NEXT_SIBLING, _PREV_SIBLING):
        return []
    try:
        derived = previous_siblings(_items(columns[_NEXT_SIBLING], "i"))
    except ValueError:
        return []
    if not same_bytes(memoryview(derived).cast("B"), memoryview(columns[_PREV_SIBLING]).cast("B")):
        return []
    columns[_PREV_SIBLING] = b""
    return ["prev_sibling"]


def _whole(columns: list[Any], n_slots: int, *which: int) -> bool:
    """Whether each of `which` is a 4-byte item per slot."""
    return all(memoryview(columns[i]).nbytes == 4 * n_slots for i in which)


def _undo_implied(columns: list[Any], implied: list[str]) -> None:
    """The inverse of `_implied`, on `columns` in place."""
    unknown = set(implied) - set(_IMPLIED)
    if unknown:
        raise ValueError(f"rewrites this version does not know: {sorted(unknown)}")
    if "prev_sibling" in implied:
        columns[_PREV_SIBLING] = previous_siblings(_items(columns[_NEXT_SIBLING], "i"))


def _restored(
    table: dict[str, Any], records: Any = None, as_records: bool = False
) -> dict[str, Any]:
    """The inverse of `_deduplicated`; `records`, when given, are its token blocks already
    joined (a delta's: its key's and its own); `as_records` leaves the tokens column as
    `TokenRecords`, for `table_from_state`."""
    columns = list(table["columns"])
    hashes, slots = from_slots(_items(table["hashes"], "Q"), table.pop("present"))
    table = {**table, "hashes": hashes, "slots": slots}
    _undo_implied(columns, table.pop("implied", []))
    columns[_LAST_MS] = minus(_items(columns[_LAST_MS], "I"), _items(columns[_FIRST_MS], "I"), True)
    blocks = table.pop("token_blocks")
    if blocks is not None:
        numbers = _items(columns[_TOKENS], "I")
        joined = join_planes(blocks, _TOKEN_ITEM) if records is None else records
        columns[_TOKENS] = (
            TokenRecords(numbers, joined)
            if as_records
            else expand_records(numbers, joined, table["block_size"] * _TOKEN_ITEM)
        )
    columns[_PARENT] = _linked_parents_xored(table, columns)
    return {**table, "columns": columns}


def _linked_parents_xored(table: dict[str, Any], columns: list[Any]) -> Any:
    return xor_linked_parents(
        memoryview(columns[_PARENT]).cast("B"),
        _items(table["hashes"], "Q"),
        _items(table["slots"], "i"),
        _items(columns[_FIRST_CHILD], "i"),
        _items(columns[_NEXT_SIBLING], "i"),
    )


_ITEM_SIZES = {"Q": 8, "I": 4, "i": 4}


def _items(data: Any, fmt: Literal["Q", "I", "i"]) -> memoryview:
    """`data` (bytes or an array's view) as items of struct format `fmt` (TypeError if the
    bytes are not whole items), aligned to them (copied where they are not)."""
    return memoryview(aligned(memoryview(data).cast("B"), _ITEM_SIZES[fmt])).cast(fmt)
