"""A recovery row rides the writer's next take (storage/writer.py, `_put_always`): in a fleet
each reset makes several, and a hurry for each made a transaction of its own. The reset row
itself still hurries the queue as far as itself."""

from __future__ import annotations

import pytest

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import write_loop
from kvscope.storage.engine import open_store
from kvscope.storage.rows import RecoveryRow, ResetRow
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import CLEAR, frames, payload, store


def test_recovery_rows_do_not_hurry_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_loop.WriteLoop, "_run", lambda self: None)
    writer = StoreWriter(open_store("sqlite://"), StoreSettings(recovery_offsets_s=(1, 2, 5)))
    ingest = StreamIngest(StreamId("ride", 0), can_replay=False, sink=writer)
    ts = 1_796_051_000.0
    bodies = [
        payload(store(1, 2, 3), ts=ts),
        payload(CLEAR, ts=ts + 1),
        *(payload(store(10 + n, parent=None), ts=ts + 1.5 + n) for n in range(8)),
    ]
    for seq, body in enumerate(bodies):
        ingest.live_frames(frames(seq, body), ts + seq)
    queue = writer._queue
    rows = list(queue._rows)
    reset_at = next(i for i, row in enumerate(rows) if type(row) is ResetRow)
    assert sum(type(row) is RecoveryRow for row in rows[reset_at + 1 :]) >= 3
    assert queue._hurry.is_set()  # the reset's
    queue.linger_s = 0.0
    assert len(queue.take(reset_at + 1) or []) == reset_at + 1
    queue.done(reset_at + 1)
    assert not queue._hurry.is_set()  # the recovery rows after it wait for the next take
    writer.close(5)
