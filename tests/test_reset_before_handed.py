"""A reset's `before` map handed to the store's writer as the cleared tables themselves (a clear
leaves them to the sink, never changed again): not copied on the ingest thread, encoded on the
writer thread into the very snapshot a copy made, and spilled as a copy."""

from __future__ import annotations

import pickle
from typing import Any

from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearedMap, ClearReason
from kvscope.collector.snapshot import copy_tables, encode_copy
from kvscope.collector.types import (
    AllCleared,
    Batch,
    BlocksRemoved,
    BlocksStored,
    KVEvent,
    StreamId,
    TableKey,
)
from kvscope.storage.engine import open_store
from kvscope.storage.rows import ResetRow
from kvscope.storage.writer import StoreWriter

STREAM = StreamId("r", 0)
GPU0 = TableKey("GPU", 0)
CPU0 = TableKey("CPU", 0)
BS = 4


def _stored(hashes: list[int], parent: int | None, table: TableKey = GPU0) -> BlocksStored:
    tokens = [h * 10 + i for h in hashes for i in range(BS)]
    return BlocksStored(list(hashes), parent, tokens, BS, table)


def _cleared(writer: StoreWriter) -> tuple[ClearedMap, ResetRow]:
    """A map of two tables (an orphan, a removal, odd tokens) cleared into `writer`: what the
    clear handed over, and the reset row the writer would have queued. Kept from its thread,
    which would encode the row (`packed_before`) while the test reads it."""
    queued: list[Any] = []

    def recorded(row: Any, droppable: bool, nbytes: int = 0) -> bool:
        queued.append(row)
        return True

    writer._queue.put = recorded  # type: ignore[method-assign]
    handed: list[ClearedMap] = []

    def on_clear(cleared: ClearedMap) -> None:
        handed.append(cleared)
        writer.map_cleared(cleared)

    prefix_map = PrefixMap(STREAM, on_clear)
    events: list[KVEvent] = [
        _stored([1, 2, 3], None),
        _stored([4, 5], 2),
        _stored([9], 77),  # an orphan
        BlocksStored([20], None, [1, 2, 3, 4, 5, 6, 7, 8], 8, GPU0),  # a block of another size
        _stored([30, 31], None, CPU0),
        BlocksRemoved([5], GPU0),
    ]
    prefix_map.apply(Batch(0, 10.0, 0, events))
    prefix_map.apply(Batch(1, 11.0, 0, [AllCleared(), _stored([40], None)]))
    resets = [row for row in queued if type(row) is ResetRow]
    assert len(handed) == 1 and len(resets) == 1
    return handed[0], resets[0]


def test_the_reset_row_holds_the_cleared_tables_themselves(store_url: str) -> None:
    writer = StoreWriter(open_store(store_url))
    try:
        cleared, row = _cleared(writer)
        assert cleared.reason is ClearReason.ALL_BLOCKS_CLEARED
        assert row.before.tables is cleared.tables
        assert row.before.nbytes >= len(copy_tables(cleared.tables)) // 2
    finally:
        writer.close()


def test_the_writer_encodes_the_snapshot_a_copy_made(store_url: str) -> None:
    writer = StoreWriter(open_store(store_url))
    try:
        cleared, row = _cleared(writer)
        want = encode_copy(copy_tables(cleared.tables))
        writer._sql.prepare([row])
        assert row.packed_before == want
    finally:
        writer.close()


def test_a_spilled_reset_row_holds_a_copy_and_comes_back_the_same(store_url: str) -> None:
    writer = StoreWriter(open_store(store_url))
    try:
        cleared, row = _cleared(writer)
        want = encode_copy(copy_tables(cleared.tables))
        data = pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
        back = pickle.loads(data)
        assert type(back) is ResetRow and back.key == row.key and back.packed_before == b""
        assert back.before.tables is not cleared.tables
        assert copy_tables(back.before.tables) == copy_tables(cleared.tables)
        writer._sql.prepare([back])
        assert back.packed_before == want
    finally:
        writer.close()
