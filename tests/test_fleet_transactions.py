"""A collector of many streams writes each stream's log in chunks as large as one stream's: a
transaction takes up to `rows_per_transaction` rows per stream it writes (up to half the queue's
bound), not `rows_per_transaction` shared by all, which cut each stream's chunk to a sliver of it
(a zstd call, a column split and a reading back at the reset per chunk), and every row exact."""

from __future__ import annotations

import random
from itertools import islice, zip_longest

from sqlalchemy import func, select

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, NullSink
from kvscope.collector.types import StreamId
from kvscope.storage import batch_log, log_chunks, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import stream_id
from kvscope.storage.log_chunks import MAX_CHUNK_BATCHES, MAX_CHUNK_RAW_BYTES
from kvscope.storage.rowqueue import RowQueue
from kvscope.storage.rows import LogRow, Row
from kvscope.storage.sql_writer import RowWriter
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.write_loop import WriteLoop
from kvscope.storage.writer_state import WriterStats, rows_per_take
from tests.conftest import capture_path

STREAMS = 12
BATCHES = 250


class LogRows(NullSink):
    """The log rows the store's writer would queue for each batch."""

    def __init__(self) -> None:
        self.rows: list[LogRow] = []

    def applied(self, batch: AppliedBatch) -> None:
        self.rows.append(
            (batch.stream, batch.epoch, batch.seq, batch.ts, batch.recv_ts, batch.payload)
        )


def _fleet_rows() -> list[LogRow]:
    """`STREAMS` replicas playing the lab capture's first batches, interleaved as a fleet's."""
    records = list(islice(read_capture(capture_path("lab_10rps_300s.msgpack.gz")), BATCHES))
    per_stream = []
    for n in range(STREAMS):
        sink = LogRows()
        ingest = StreamIngest(StreamId(f"replica-{n}", 0), can_replay=False, sink=sink)
        for record in records:
            ingest.live_frames(record.frames, record.recv_ts)
        assert len(sink.rows) == BATCHES
        per_stream.append(sink.rows)
    return [row for rows in zip(*per_stream, strict=True) for row in rows]


def test_a_transaction_takes_rows_per_transaction_for_each_stream_it_writes(
    store_url: str,
) -> None:
    settings = StoreSettings(rows_per_transaction=500, queue_rows=100_000, linger_s=0)
    rows = _fleet_rows()
    queue: RowQueue[Row] = RowQueue(settings.queue_rows)
    for row in rows:
        assert queue.put_batch(row, len(row[5]))
    queue.close()  # all queued before the writer's first take: the takes depend on nothing else
    stats = WriterStats()
    loop = WriteLoop(open_store(store_url), queue, RowWriter(None), settings, stats)
    loop.thread.join(60)
    assert loop.failure is None and not loop.thread.is_alive()
    # The first take knows no stream yet (500 rows); the next, 500 for each of the 12 seen.
    assert stats.transactions == 2
    with open_store(store_url).connect() as conn:
        for n in range(STREAMS):
            sid = stream_id(conn, f"replica-{n}")
            assert batch_log.count_batches(conn, sid) == BATCHES
            t = schema.log_chunks
            chunks = conn.execute(
                select(func.count()).select_from(t).where(t.c.stream_id == sid)
            ).scalar_one()
            assert chunks == 2
            stored = [tuple(b.batch) for b in batch_log.all_batches(conn, sid)]
            mine = [r[2:] for r in rows if r[0] == StreamId(f"replica-{n}", 0)]
            assert stored == mine


def test_rows_per_take_grows_with_the_streams_up_to_half_the_queue() -> None:
    settings = StoreSettings(rows_per_transaction=5_000, queue_rows=50_000)
    assert rows_per_take(settings, 0) == 5_000
    assert rows_per_take(settings, 1) == 5_000
    assert rows_per_take(settings, 3) == 15_000
    assert rows_per_take(settings, 200) == 25_000
    small_queue = StoreSettings(rows_per_transaction=5_000, queue_rows=4_000)
    assert rows_per_take(small_queue, 200) == 5_000


def test_a_fleets_transaction_is_cut_into_chunks_as_each_stream_alone() -> None:
    """Each stream's rows of an interleaved transaction make the chunks they make alone: cut at
    an epoch, at the batch, byte and span bounds, in order of arrival, even where a stream's
    clock steps back."""
    rng = random.Random(7)
    alone: dict[StreamId, list[LogRow]] = {}
    for n in range(5):
        stream, rows, ts = StreamId(f"r{n}", 0), [], 1000.0 + n
        for seq in range(3 * MAX_CHUNK_BATCHES // 2 + 40 * n):
            ts += rng.choice((0.01, 0.5, -0.3)) if n == 3 else rng.random() * 0.2
            size = rng.choice((10, 100, MAX_CHUNK_RAW_BYTES // 50))
            rows.append((stream, 1 + (seq > 700 and n == 2), seq, ts, ts, b"x" * size))
        alone[stream] = rows
    fleet = [r for rows in zip_longest(*alone.values()) for r in rows if r is not None]
    cut = log_chunks.split(fleet)
    assert len(cut) > 2 * len(alone)
    assert cut == [run for rows in alone.values() for run in log_chunks.split(rows)]
