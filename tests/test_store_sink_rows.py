"""The rows the store's sink queues on the ingest thread, pinned: a random stream (two tiers,
gaps, clears and their recoveries, a restart, seconds of many batches) gives the very rows it
gave when this test was written, in the same order (the writer thread packs and stores what it
is handed, so the same rows make the same bytes). The writer thread is kept from taking rows,
so that checkpoints are paced by batch counts alone and nothing depends on timing."""

from __future__ import annotations

import hashlib
import random
from typing import Any, ClassVar

import pytest

from kvscope.collector._live_sink import LiveSink
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.sink import AppliedBatch
from kvscope.collector.snapshot import copy_tables
from kvscope.collector.types import StreamId
from kvscope.storage import write_loop
from kvscope.storage.engine import open_store
from kvscope.storage.rows import ResetRow, RollupRow
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.test_ingest import CLEAR, frames, payload, remove, store

STREAM = StreamId("pinned", 0)

# sha256 of the rows' reprs (see `_rows_digest`). Pinned again when the slot map's large
# tables began to grow by a quarter, their homes by multiply-shift: 49 rows' map copies then
# listed their hashes in another order, and each decoded to the same tables.
PINNED = {
    "roomy": "51507c72c9ea84830288863ff080d2f8a0421ddba6884081ae86b8c3ba6ccffb",
    "overflowing": "a738185557876e454288add3028d2493401ed4ad1cbaf3f25f615c78dba09d21",
}


def _events(rng: random.Random, cached: list[int]) -> list[dict[str, Any]]:
    """One batch: a chain stored, some blocks removed, now and then a clear, on either tier."""
    events: list[dict[str, Any]] = []
    medium = "CPU" if rng.random() < 0.2 else "GPU"
    chain = [rng.getrandbits(40) + 1 for _ in range(rng.randint(0, 6))]
    if chain:
        parent = rng.choice(cached) if cached and rng.random() < 0.5 else None
        events.append({**store(*chain, parent=parent), "medium": medium})
        cached.extend(chain)
    if cached and rng.random() < 0.5:
        gone = rng.sample(cached, min(len(cached), rng.randint(1, 4)))
        events.append({**remove(*gone), "medium": medium})
        for block in gone:
            cached.remove(block)
    if rng.random() < 0.01:
        events.append(CLEAR)
        cached.clear()
    return events


def _rows_digest(
    queue_rows: int, monkeypatch: pytest.MonkeyPatch, kind: type[StoreWriter] = StoreWriter
) -> str:
    monkeypatch.setattr(write_loop.WriteLoop, "_run", lambda self: None)
    settings = StoreSettings(
        queue_rows=queue_rows, checkpoint_every_batches=97, spill_bytes=0, recovery_offsets_s=(1, 5)
    )
    writer = kind(open_store("sqlite://"), settings)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    rng = random.Random(20261203)
    cached: list[int] = []
    seq, ts, now = 0, 1_796_051_000.0, 1_796_051_000.5
    for _ in range(3000):
        ts += rng.choice((0.0, 0.01, 0.02, 0.02, 0.3))
        now += 0.02
        seq += 2 if rng.random() < 0.003 else 1  # a gap: the map is unknown until a clear
        if rng.random() < 0.002:
            seq = 0  # a restart
        ingest.live_frames(frames(seq, payload(*_events(rng, cached), ts=ts)), now)
    writer.close(5)
    rows = list(writer._queue._rows)
    assert len(rows) > 2000
    digest = hashlib.sha256()
    for text in _canonical(rows):
        digest.update(text.encode())
    return digest.hexdigest()


def _canonical(rows: list[Any]) -> list[str]:
    """The rows' reprs; a second's rollup rows (one per tier) sorted, as their order follows
    the process's string hashing. A reset's cleared tables are shown as their copy (what the
    sink handed the writer thread before it handed the tables themselves)."""
    texts: list[str] = []
    run: list[str] = []
    for row in rows:
        if type(row) is RollupRow:
            run.append(repr(row))
            continue
        texts += sorted(run)
        run = []
        text = repr(row)
        if type(row) is ResetRow:
            copy = copy_tables(row.before.tables, row.before.signed)
            text = text.replace(repr(row.before), repr(copy))
        texts.append(text)
    return texts + sorted(run)


@pytest.mark.parametrize("case, queue_rows", [("roomy", 1_000_000), ("overflowing", 2000)])
def test_the_rows_queued_are_those_pinned(
    case: str, queue_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _rows_digest(queue_rows, monkeypatch) == PINNED[case]


def test_the_live_path_tells_the_writer_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's writer is a `LiveSink`: the live path hands it each batch's fields in C,
    with no `AppliedBatch` built (the rows it queues are pinned above)."""
    monkeypatch.setattr(write_loop.WriteLoop, "_run", lambda self: None)
    writer = StoreWriter(open_store("sqlite://"))
    assert isinstance(writer, LiveSink)
    writer.close(0)


class _Tap(StoreWriter):
    """A writer whose `applied` is overridden (as benchmarks/_store_disk.py's)."""

    told: ClassVar[list[int]] = []

    def applied(self, batch: AppliedBatch) -> None:
        self.told.append(batch.seq)
        super().applied(batch)


def test_a_writer_overriding_applied_is_told_each_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live path's C call goes through a subclass's `applied`: each batch is told to it,
    and the rows are those pinned."""
    assert _rows_digest(1_000_000, monkeypatch, _Tap) == PINNED["roomy"]
    assert len(_Tap.told) > 2000
