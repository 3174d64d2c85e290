"""The store writer's prefix groups, followed batch by batch (storage/prefix_followers.py):
at every offset the answer is `reset_prefixes` computed afresh from the store, every group,
point, status and orphan; each logged batch of a reset's window is replayed once, not once per
offset; past the cap, or once the followers are forgotten, the full rebuild takes over."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, select

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.types import StreamId
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.prefix_followers import PrefixFollowers
from kvscope.storage.reset_follower import ResetFollower
from kvscope.storage.reset_prefix_types import ResetPrefixes
from kvscope.storage.reset_prefixes import offsets_reached, reset_prefixes
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path

STREAM = StreamId("lab", 0)


@dataclass
class Checked:
    """Each answer the writer stored, against the full rebuild in the same transaction."""

    followers: PrefixFollowers
    forget_at: int | None = None
    """Forget the followers after this many answers (as a failed transaction does)."""
    answers: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)
    wrong: list[tuple[ResetPrefixes, ResetPrefixes]] = field(default_factory=list)

    def __call__(self, conn: Connection, found: ResetPrefixes) -> None:
        want = reset_prefixes(conn, found.reset_id)
        self.answers.append((found.reset_id, found.offsets))
        if found != want:
            self.wrong.append((found, want))
        if self.forget_at is not None and len(self.answers) == self.forget_at:
            self.followers.forget()


def _writer(url: str, cap: int = 64, forget_at: int | None = None) -> tuple[StoreWriter, Checked]:
    # A row per transaction: each offset reached is answered on its own.
    settings = StoreSettings(prefix_followers=cap, rows_per_transaction=1)
    writer = StoreWriter(open_store(url), settings)
    checked = Checked(writer._sql.followers, forget_at)
    writer._sql.followers.observe = checked
    return writer, checked


def _recording(url: str, **kw: Any) -> tuple[StoreWriter, Checked]:
    writer, checked = _writer(url, **kw)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    return writer, checked


def _window_batches(conn: Connection, reset_id: int) -> int:
    """The batches a single rebuild to the last offset replays."""
    fresh = ResetFollower(conn, reset_id)
    fresh.advance(conn, offsets_reached(conn, reset_id))
    return fresh.replayed


def _reset_ids(conn: Connection) -> list[int]:
    return list(conn.execute(select(schema.resets.c.id).order_by(schema.resets.c.id)).scalars())


def test_the_recording_is_followed_exactly_each_batch_once(store_url: str) -> None:
    writer, checked = _recording(store_url)
    followers = writer._sql.followers
    assert checked.wrong == []
    with writer.engine.connect() as conn:
        ids = _reset_ids(conn)
        assert len(ids) == 2
        for reset_id in ids:
            offsets = offsets_reached(conn, reset_id)
            # Answered as the offsets were reached, in order (a batch may pass two at once).
            seen = [o for rid, o in checked.answers if rid == reset_id]
            assert seen == sorted(seen, key=len) and seen[-1] == offsets
            assert len(set(seen)) >= 5
        window = sum(_window_batches(conn, rid) for rid in ids)
    assert window > 100
    assert followers.replayed == window  # not the sum over the offsets
    assert followers.rebuilt == 2
    assert followers.held() <= 1


def test_a_keep_running_resets_orphans_and_evicted_orphans_followed(tmp_path: Any) -> None:
    """A keep-running clear (9 under the cleared 8, 5 under the cleared 3), blocks orphaned
    by eviction (2 removed under 3 and 4; 7 stored under 6 as 6 is removed), rejoining, then
    the engine restarts: every offset's answer is the full rebuild's."""
    from tests.test_ingest import CLEAR, frames, payload, remove, store

    writer, checked = _writer(f"sqlite:///{tmp_path / 's.sqlite'}")
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    batches = [
        (0, 100.0, [store(1, 2, 3), store(4, parent=2), store(8), store(20, 21)]),
        (1, 101.0, [CLEAR, store(9, parent=8), store(5, parent=3)]),
        (2, 101.5, [store(1, 2, 3), store(4, parent=2), store(6)]),
        (3, 103.0, [remove(2)]),
        (4, 104.0, [remove(4)]),
        (5, 105.0, [store(2, parent=1), store(7, parent=6), remove(6)]),
        (6, 106.0, [store(20), store(8)]),
        (7, 112.0, [store(21, parent=20)]),
        (8, 125.0, [remove(9)]),
        (9, 133.0, [store(30)]),
        (0, 200.0, [store(1, 2, 3, 5)]),
        (1, 202.0, [store(20)]),
        (2, 210.0, [store(31)]),
    ]
    for seq, ts, events in batches:
        ingest.live_frames(frames(seq, payload(*events, ts=ts)), ts)
    writer.close()
    assert checked.wrong == []
    with writer.engine.connect() as conn:
        ids = _reset_ids(conn)
        clear = reset_prefixes(conn, ids[0])
        window = sum(_window_batches(conn, rid) for rid in ids)
    assert clear.offsets == (1.0, 2.0, 5.0, 10.0, 20.0, 30.0)
    assert sorted(o.hash for o in clear.orphans) == [5, 9]
    assert sorted(o.hash for o in clear.evicted_orphans) == [3, 4, 7]
    assert len({o for rid, o in checked.answers if rid == ids[0]}) >= 5
    assert writer._sql.followers.replayed == window

    # The clear's last row after the restart's first: answered afresh, the newer one kept.
    followers = PrefixFollowers()
    with writer.engine.connect() as conn:
        older, newer = ids
        for rid in (newer, older, newer):
            assert followers.groups(conn, STREAM, rid) == reset_prefixes(conn, rid)
    assert (followers.rebuilt, followers.held()) == (2, 1)


def test_past_the_cap_and_after_forgetting_the_full_rebuild_answers(tmp_path: Any) -> None:
    capped, checked = _recording(f"sqlite:///{tmp_path / 'capped.sqlite'}", cap=0)
    assert checked.wrong == [] and capped._sql.followers.held() == 0
    # No follower held: each answer was a rebuild.
    assert capped._sql.followers.rebuilt == len(checked.answers)
    forgot, checked = _recording(f"sqlite:///{tmp_path / 'forgot.sqlite'}", forget_at=3)
    assert checked.wrong == []
    # The forgotten reset is followed again from its next offset, by one more rebuild.
    assert forgot._sql.followers.rebuilt == 3


def test_a_stream_forgotten_takes_its_followers_along(tmp_path: Path) -> None:
    """A stream whose lease moved away (`forget`): once what it queued is written, the writer
    keeps no follower of its reset, which the cap alone would have held on to."""
    writer = StoreWriter(open_store(f"sqlite:///{tmp_path / 'store.db'}"))
    records = list(read_capture(capture_path("lab_3rps_180s.msgpack.gz")))
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in records:
        ingest.live_frames(record.frames, record.recv_ts)
    writer.forget(STREAM)  # its rows still queued: written first, followed as before
    assert writer.flush(60)
    followers = writer._sql.followers
    other = StreamIngest(StreamId("other", 0), can_replay=False, sink=writer)
    for record in records[:50]:  # another stream's transaction, after the forget
        other.live_frames(record.frames, record.recv_ts)
    assert writer.flush(60)
    assert followers.held() == 0
    writer.close()
