"""A stream that leaves a writer (its lease lost: `forget`), is written by another, and comes
back to the first while that one was idle: the first writer must not name its own old
checkpoint in the stream's next chunks (format 6 names the checkpoint just before a chunk), or
retention, anchored at a later checkpoint, deletes the named one and keeps the chunk, which
then cannot be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, NullSink
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import stream_id
from kvscope.storage.log_chunks import known_name_of
from kvscope.storage.retention import Retention, prune
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_store import STREAM


def test_a_stream_taken_back_names_no_checkpoint_from_before_it_left(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    settings = StoreSettings(
        checkpoint_every_batches=300, rows_per_transaction=50, log_chunk_format=6, linger_s=0.0
    )
    first, second = StoreWriter(open_store(url), settings), StoreWriter(open_store(url), settings)
    to: list[Any] = [first]

    class Holder(NullSink):  # the writer that holds the stream's lease now
        def applied(self, batch: AppliedBatch) -> None:
            to[0].applied(batch)

    ingest = StreamIngest(STREAM, can_replay=False, sink=Holder())
    for i, record in enumerate(read_capture(capture_path("lab_10rps_300s.msgpack.gz"))):
        if i == 1000:
            assert first.flush()
            first.forget(STREAM)  # its lease lost, its writer idle from here
            to[0] = second
        if i == 2600:
            assert second.flush()
            second.forget(STREAM)
            to[0] = first  # taken back, in the same epoch
        ingest.live_frames(record.frames, record.recv_ts)
    first.close()
    second.close()
    engine = open_store(url)
    with engine.connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        c, k = schema.log_chunks, schema.checkpoints
        chunks = conn.execute(sa.select(c.c.first_seq, c.c.data).order_by(c.c.first_seq)).all()
        checkpoints = conn.execute(sa.select(k.c.seq, k.c.ts).order_by(k.c.seq)).all()
        stale = []
        for first_seq, data in chunks:
            named = known_name_of(bytes(data))
            if named is not None:
                passed_by = [seq for seq, _ in checkpoints if named[1] < seq < first_seq]
                if passed_by:
                    stale.append((first_seq, named[1], passed_by))
        assert stale == []
        assert any(known_name_of(bytes(data)) is not None for _, data in chunks)
        anchor_ts = max(ts for seq, ts in checkpoints if seq < 2600)
    prune(engine, Retention(log_s=10.0, checkpoints_s=10.0), anchor_ts + 10.001)
    with engine.connect() as conn:
        assert sum(1 for _ in batch_log.all_batches(conn, sid)) > 0  # every kept chunk reads
    engine.dispose()
