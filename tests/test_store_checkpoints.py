"""Checkpoints are paced by the stream alone (storage/_checkpoint_pacing.pyx): on a real SQLite
file and the real PostgreSQL, no replay from a stored checkpoint spans more block-events than
the rule allows; and the same stream stored twice, one writer kept behind at random points, gets
the same checkpoints."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, select

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import BlocksRemoved, BlocksStored
from kvscope.collector.wire import BatchDecoder
from kvscope.storage import batch_log, schema
from kvscope.storage.engine import open_store
from kvscope.storage.history import stream_id
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_store import STREAM, ingest_capture

PER_BLOCK = 3.0
FLOOR = 256
"""Below the lab recording's map: its checkpoints are paced by its own blocks."""
SETTINGS = StoreSettings(
    checkpoint_events_per_block=PER_BLOCK,
    checkpoint_every_batches=10**9,
    checkpoint_min_blocks=FLOOR,
)


def test_no_replay_from_a_checkpoint_spans_more_than_the_rule(store_url: str) -> None:
    writer, _, _ = ingest_capture(store_url, "lab_10rps_300s", SETTINGS)
    assert writer.stats.batches_dropped == 0
    c = schema.checkpoints
    with open_store(store_url).connect() as conn:
        sid = stream_id(conn, STREAM.replica)
        checkpoints = conn.execute(
            select(c.c.epoch, c.c.seq, c.c.blocks).order_by(c.c.epoch, c.c.seq)
        ).all()
        events = _events_by_batch(conn, sid)
    assert len(checkpoints) >= 10
    assert any(blocks > FLOOR for _, _, blocks in checkpoints)
    ends = [(epoch, seq) for epoch, seq, _ in checkpoints[1:]] + [max(events)]
    for (epoch, seq, blocks), end in zip(checkpoints, ends, strict=True):
        # A rebuild before `end` replays from this checkpoint up to the batch before it.
        replayed = sum(n for at, n in events.items() if (epoch, seq) < at < end)
        assert replayed < PER_BLOCK * max(blocks, FLOOR)


def _events_by_batch(conn: Connection, sid: int) -> dict[tuple[int, int], int]:
    """Blocks each stored batch stores and removes, read from the log itself."""
    decoder = BatchDecoder()
    counts = {}
    for stored in batch_log.all_batches(conn, sid):
        batch = decoder.decode(stored.batch.payload, stored.batch.seq)
        counts[(stored.epoch, stored.batch.seq)] = sum(
            len(e.hashes) for e in batch.events if isinstance(e, BlocksStored | BlocksRemoved)
        )
    return counts


class HeldEngine:
    """An engine whose transactions wait until `release` is set, then sleep at random: a writer
    thread far behind the stream, and then slow (a stand-in, duck-typed)."""

    def __init__(self, engine: Engine, release: threading.Event, seed: int) -> None:
        self.engine = engine
        self.release = release
        self.rng = random.Random(seed)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        self.release.wait()
        time.sleep(self.rng.choice((0.0, 0.0, 0.01, 0.05)))
        with self.engine.begin() as conn:
            yield conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_the_same_stream_gets_the_same_checkpoints_whatever_the_writer_speed(
    tmp_path: Path,
) -> None:
    """One writer keeps up (the ingest waits for it every few batches); the other writes
    nothing until the whole stream was ingested, then slowly."""
    release = threading.Event()

    def keeping_up(writer: StoreWriter, i: int) -> None:
        if i % 50 == 0:
            assert writer.flush(60)

    def held(writer: StoreWriter, i: int) -> None:
        return None

    positions = []
    for name, after_batch in (("up", keeping_up), ("held", held)):
        url = f"sqlite:///{tmp_path / name}.sqlite"
        writer = StoreWriter(open_store(url), SETTINGS)
        if after_batch is held:
            writer.engine = HeldEngine(writer.engine, release, seed=3)  # type: ignore[assignment]
        _ingest(writer, after_batch)
        release.set()
        writer.close(120)
        assert writer.stats.batches_dropped == 0 and writer.queue_depth == 0
        c = schema.checkpoints
        with open_store(url).connect() as conn:
            positions.append(conn.execute(select(c.c.epoch, c.c.seq).order_by(c.c.seq)).all())
    assert len(positions[0]) >= 10
    assert positions[0] == positions[1]


def _ingest(writer: StoreWriter, after_batch: Callable[[StoreWriter, int], None]) -> None:
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for i, record in enumerate(read_capture(capture_path("lab_10rps_300s.msgpack.gz"))):
        ingest.live_frames(record.frames, record.recv_ts)
        after_batch(writer, i)


SMALL_MAP_FLOOR = 2048
"""The blocks a small map's checkpoint is counted as by default, at the least (the lab
recording's map holds about a thousand)."""


def test_a_small_map_is_checkpointed_as_if_it_held_the_floors_blocks(tmp_path: Path) -> None:
    """A lab replica of about a thousand blocks: a checkpoint per `per_block` events per block
    made a short recording's checkpoints a quarter of its disk. The default settings count it
    as `SMALL_MAP_FLOOR` blocks (a rebuild replays at most that many events per block)."""
    url = f"sqlite:///{tmp_path / 'small.sqlite'}"
    settings = StoreSettings()
    writer, _, _ = ingest_capture(url, "lab_10rps_300s", settings)
    c = schema.checkpoints
    with open_store(url).connect() as conn:
        events = _events_by_batch(conn, stream_id(conn, STREAM.replica))
        checkpoints = conn.execute(select(c.c.seq, c.c.blocks).order_by(c.c.seq)).all()
    assert max(blocks for _, blocks in checkpoints) < SMALL_MAP_FLOOR
    # The first is due once the events reach the floor's share; each next one as many later.
    span = settings.checkpoint_events_per_block * SMALL_MAP_FLOOR
    assert len(checkpoints) == int(sum(events.values()) // span)
