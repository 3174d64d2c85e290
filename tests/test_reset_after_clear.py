"""A reset's follower starts from the map just after its clear (storage/reset_follower.py,
`map_after_clear`): the clear's batch alone applied to an empty map. It must be the map the
store rebuilds at that batch (a checkpoint restored and the log replayed up to it), table for
table and slot for slot, with the same reasons it may be incomplete; and it reads no log but
the clear's batch."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, select

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.sink import ClearReason
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import Position, rebuild
from kvscope.storage.log_dictionaries_sql import open_chunk
from kvscope.storage.reset_follower import ResetFollower, follow_start
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_ingest import CLEAR, frames, payload, remove, store
from tests.test_replay_fused import map_state

STREAM = StreamId("lab", 0)


def _tables(view: PrefixMap) -> dict[str, Any]:
    """What a follower reads of its map (its counters, which count the batches replayed to
    reach it, are no part of the answer)."""
    state = map_state(view)
    del state["counters"]
    return state


def _cleared_ids(conn: Connection) -> list[int]:
    r = schema.resets
    query = select(r.c.id).where(r.c.reason == ClearReason.ALL_BLOCKS_CLEARED.value)
    return list(conn.execute(query.order_by(r.c.id)).scalars())


def _assert_as_rebuilt(conn: Connection, reset_id: int) -> None:
    follower = ResetFollower(conn, reset_id)
    r = schema.resets
    row = conn.execute(select(r).where(r.c.id == reset_id)).one()
    epoch, after = follow_start(row.epoch, row.seq, row.reason)
    rebuilt = rebuild(conn, Position(row.stream_id, epoch, after, row.ts), STREAM)
    assert _tables(follower.view) == _tables(rebuilt.map)
    assert follower.unknown == rebuilt.unknown_because


def test_the_recordings_clears_start_from_the_rebuilt_map(store_url: str) -> None:
    writer = StoreWriter(open_store(store_url))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    with writer.engine.connect() as conn:
        ids = _cleared_ids(conn)
        assert ids
        for reset_id in ids:
            _assert_as_rebuilt(conn, reset_id)


def test_a_clear_mid_batch_starts_from_its_later_events_reading_no_other_batch(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clear's batch removes and stores before the clear (wiped) and after it (kept, one
    an orphan under a cleared parent); no checkpoint precedes it, so the store's rebuild
    replays the whole log: the follower's start reads only the clear's chunk."""
    settings = StoreSettings(
        rows_per_transaction=1, checkpoint_events_per_block=float("inf"), checkpoint_min_blocks=1
    )
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"), settings)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    batches = [
        (0, 100.0, [store(1, 2, 3), store(4, parent=2), store(8), store(20, 21)]),
        (1, 100.5, [store(22, parent=21), remove(4)]),
        (2, 101.0, [store(40, parent=1), remove(20), CLEAR, store(9, parent=8), store(1, 2)]),
        (3, 101.5, [store(3, parent=2), store(6)]),
        (4, 103.0, [remove(2)]),
    ]
    for seq, ts, events in batches:
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer.close()
    opened: list[int] = []

    def counted(*args: Any) -> Any:
        opened.append(1)
        return open_chunk(*args)

    with writer.engine.connect() as conn:
        (reset_id,) = _cleared_ids(conn)
        monkeypatch.setattr(batch_log, "open_chunk", counted)
        follower = ResetFollower(conn, reset_id)
        assert len(opened) == 1  # the clear's batch, not the two before it
        monkeypatch.undo()
        assert sorted(h for t in follower.view.tables.values() for h in t.counts()) == [1, 2, 9]
        _assert_as_rebuilt(conn, reset_id)
