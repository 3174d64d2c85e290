"""The real PostgreSQL stopped for 30 s during ingest, then started again.

With room to wait, nothing is lost; with a tiny buffer whose overflow spills to a local file,
nothing is lost either; with a tiny buffer and no spill, what was dropped is counted and the
stretch is marked incomplete in the store, and the map is exact again from the next checkpoint.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from kvscope.collector.capture import CaptureRecord, read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch, FanOut, NullSink
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import position_at_seq, position_at_time, rebuild, stream_id
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_store import STREAM

OUTAGE_S = 30.0


def pg_cluster(action: str) -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, "-m", "fast"]
        if action == "stop"
        else ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        timeout=60,
    )


def pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"], timeout=10).returncode == 0


def test_postgres_down_for_30_seconds(new_pg_database: Callable[[], str]) -> None:
    roomy = StoreWriter(open_store(new_pg_database()), StoreSettings(checkpoint_every_batches=500))
    tiny = StoreWriter(
        open_store(new_pg_database()),
        StoreSettings(queue_rows=200, checkpoint_every_batches=500, spill_bytes=0),
    )
    spilling = StoreWriter(
        open_store(new_pg_database()), StoreSettings(queue_rows=200, checkpoint_every_batches=500)
    )
    writers = (roomy, tiny, spilling)
    samples: dict[int, dict[tuple[int, int], int]] = {}

    class Sample(NullSink):
        def applied(self, batch: AppliedBatch) -> None:
            if batch.seq % 50 == 0:
                samples[batch.seq] = ingest.map.counts()

    ingest = StreamIngest(STREAM, can_replay=False, sink=FanOut(*writers, Sample()))
    records = list(read_capture(capture_path("lab_10rps_300s.msgpack.gz")))
    third = len(records) // 3

    def feed_at_a_pace_the_store_keeps(part: list[CaptureRecord]) -> None:
        for i, r in enumerate(part):
            # Flushed first: after the outage the queue still holds what waited through it.
            if i % 50 == 0:
                assert all(w.flush(30) for w in writers)
            ingest.live_frames(r.frames, r.recv_ts)

    try:
        feed_at_a_pace_the_store_keeps(records[:third])
        assert tiny.stats.batches_dropped == 0
        pg_cluster("stop")
        down_at = time.monotonic()
        for r in records[third : 2 * third]:
            ingest.live_frames(r.frames, r.recv_ts)
            time.sleep(0.001)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert roomy.stats.retries > 0 and roomy.stats.batches_dropped == 0
        assert tiny.stats.batches_dropped > 0
        assert spilling.spilled_rows_total > 0 and spilling.stats.batches_dropped == 0
    finally:
        pg_cluster("start")
        deadline = time.monotonic() + 60
        while not pg_ready() and time.monotonic() < deadline:
            time.sleep(0.5)
    # The writers retry on their own backoff (up to 5 s): the store has room again once they
    # have written what waited, not when the server answers.
    assert all(w.flush(60) for w in writers)
    dropped_in_outage = tiny.stats.batches_dropped
    feed_at_a_pace_the_store_keeps(records[2 * third :])
    assert tiny.stats.batches_dropped == dropped_in_outage
    for w in writers:
        w.close(120)

    last = records[-1].seq
    assert spilling.stats.batches_dropped == 0 and spilling.spill_bytes == 0
    for whole in (roomy, spilling):
        with whole.engine.connect() as conn:
            assert batch_log.count_batches(conn) == len(records)
            sid = stream_id(conn, "lab")
            for seq, live in samples.items():
                rebuilt = rebuild(conn, position_at_seq(conn, sid, seq), STREAM)
                assert rebuilt.map.counts() == live and not rebuilt.unknown_because
            assert not conn.execute(select(schema.intervals)).all()

    with tiny.engine.connect() as conn:
        marked = conn.execute(
            select(schema.intervals).where(schema.intervals.c.kind == "incomplete")
        ).all()
        assert sum(m.to_seq - m.from_seq + 1 for m in marked) == tiny.stats.batches_dropped
        assert all(third <= m.from_seq <= m.to_seq < 2 * third for m in marked)
        hole = marked[-1]
        stored = batch_log.count_batches(conn)
        assert stored == len(records) - tiny.stats.batches_dropped
        sid = stream_id(conn, "lab")
        # An instant inside the hole: the store cannot know it, and says so.
        inside = rebuild(conn, position_at_time(conn, sid, hole.to_ts), STREAM)
        assert inside.unknown_because and "incomplete" in inside.unknown_because[0]
        # Right after the hole the writer checkpoints: exact again.
        next_seq = hole.to_seq + 1
        resumed = rebuild(conn, position_at_seq(conn, sid, next_seq), STREAM)
        assert resumed.from_checkpoint_seq == next_seq and not resumed.unknown_because
        after = rebuild(conn, position_at_seq(conn, sid, last), STREAM)
        assert after.map.counts() == ingest.map.counts() and not after.unknown_because
