"""A collector killed while a stream was connected leaves that connected interval open; the
next collector closes it when it resumes, at the last batch the store holds."""

from __future__ import annotations

from sqlalchemy import select

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import ConnectionChange
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.dangling import close_dangling_connections
from kvscope.storage.engine import open_store
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import frames, payload, store

STREAM = StreamId("r", 0)


def connected_intervals(url: str) -> list[tuple[float, float | None]]:
    t = schema.intervals
    with open_store(url).connect() as conn:
        rows = conn.execute(
            select(t.c.from_ts, t.c.to_ts).where(t.c.kind == "connected").order_by(t.c.from_ts)
        )
        return [(r.from_ts, r.to_ts) for r in rows]


def test_an_interval_left_open_by_a_killed_collector_is_closed_on_resume(
    store_url: str,
) -> None:
    writer = StoreWriter(open_store(store_url))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    writer.connection(ConnectionChange(STREAM, True, 100.0))
    for seq in range(10):
        ingest.live_frames(frames(seq, payload(store(seq + 1, parent=seq or None))), 101.0 + seq)
    assert writer.flush()
    # kill -9: the writer is never closed, so the interval is never closed either.
    assert connected_intervals(store_url) == [(100.0, None)]

    assert close_dangling_connections(open_store(store_url), STREAM) == 1
    assert connected_intervals(store_url) == [(100.0, 110.0)]
    assert close_dangling_connections(open_store(store_url), STREAM) == 0
    assert close_dangling_connections(open_store(store_url), StreamId("other", 0)) == 0
