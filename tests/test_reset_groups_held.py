"""The prefix followers fed the batches the writer holds (storage/prefix_followers.py): the log
chunks a transaction just wrote are not read back to follow a recovery, and every answer is the
one read back from the store (`reset_prefixes`, in the same transaction)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from kvscope.collector import snapshot
from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.storage import batch_log, prefix_followers, recovery_known, schema
from kvscope.storage.engine import open_store
from kvscope.storage.log_dictionaries_sql import open_chunk
from kvscope.storage.reset_follower import ResetFollower
from kvscope.storage.reset_prefixes import reset_prefixes
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_reset_groups_follow import STREAM, Checked, _writer


@pytest.fixture
def observing(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """[True] while the test's own answer is read back from the store (`Checked`'s
    `reset_prefixes`): what followers do meanwhile is the test's, not the writer's."""
    flag = [False]
    fresh = reset_prefixes

    def observed(*args: Any) -> Any:
        flag[0] = True
        try:
            return fresh(*args)
        finally:
            flag[0] = False

    monkeypatch.setattr("tests.test_reset_groups_follow.reset_prefixes", observed)
    return flag


@pytest.fixture
def advance_reads(monkeypatch: pytest.MonkeyPatch, observing: list[bool]) -> Iterator[list[int]]:
    """Per follower advance, the log chunks it opened (its rebuild from the store aside)."""
    reads: list[int] = []
    inside = [False]
    advance = ResetFollower.advance

    def counted_open(*args: Any) -> Any:
        if inside[0]:
            reads[-1] += 1
        return open_chunk(*args)

    def counted_advance(self: ResetFollower, *args: Any) -> Any:
        if observing[0]:
            return advance(self, *args)
        reads.append(0)
        inside[0] = True
        try:
            return advance(self, *args)
        finally:
            inside[0] = False

    monkeypatch.setattr(batch_log, "open_chunk", counted_open, raising=True)
    monkeypatch.setattr(ResetFollower, "advance", counted_advance)
    yield reads


def _play(url: str, **kw: Any) -> Checked:
    writer, checked = _writer(url, **kw)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    assert writer.failure is None
    return checked


def test_a_followed_recovery_reads_no_chunk_back(store_url: str, advance_reads: list[int]) -> None:
    checked = _play(store_url)
    assert checked.wrong == [] and len(checked.answers) >= 10
    # Every answer followed from the batches held: none read back from the store.
    assert len(advance_reads) >= len(checked.answers)
    assert sum(advance_reads) == 0


def test_without_the_batches_held_the_store_is_read_once_and_answers_agree(
    store_url: str, advance_reads: list[int]
) -> None:
    """Forgotten (as after a failed transaction), a follower reads the store again, once, and
    is fed the batches held from there on."""
    checked = _play(store_url, forget_at=3)
    assert checked.wrong == [] and len(checked.answers) >= 10
    assert sum(1 for n in advance_reads if n) == 1


def test_no_log_is_held_from_an_answer_that_read_nothing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked before any recovery offset is reached, with nothing held (after a restart or a
    failed transaction), a follower reads nothing: what the store holds past its start is not
    known, so no log may be held from there (a later answer would skip those batches)."""
    writer, checked = _writer(store_url)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    followers = checked.followers
    followers.forget()
    monkeypatch.setattr(recovery_known, "offsets_reached", lambda conn, reset_id: ())
    engine = open_store(store_url)
    resets = schema.resets
    with engine.begin() as conn:
        reset_id = conn.execute(sa.select(sa.func.min(resets.c.id))).scalar_one()
        conn.execute(
            sa.update(resets).where(resets.c.id == reset_id).values(recovery_complete=False)
        )
        followers.groups(conn, STREAM, reset_id)
    assert STREAM not in followers._logs
    engine.dispose()


def test_a_follower_starts_from_the_before_map_the_writer_holds(
    store_url: str, monkeypatch: pytest.MonkeyPatch, observing: list[bool]
) -> None:
    """The cleared tables themselves: neither the snapshot the same writer just stored (read
    back and decompressed) nor a copy of them is decoded into tables again."""
    decoded = [0]
    from_state = snapshot.table_from_state

    def counted(state: Any) -> Any:
        decoded[0] += not observing[0]
        return from_state(state)

    starts: list[bool] = []

    class Recorded(ResetFollower):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            if not observing[0]:
                starts.append(self.used_copy)

    monkeypatch.setattr(snapshot, "table_from_state", counted)
    monkeypatch.setattr(prefix_followers, "ResetFollower", Recorded)
    checked = _play(store_url)
    assert checked.wrong == [] and len(checked.answers) >= 10
    assert starts.count(True) >= 2 and decoded[0] == 0


def test_a_newer_resets_copy_outlives_an_older_resets_follower(
    store_url: str, monkeypatch: pytest.MonkeyPatch, observing: list[bool]
) -> None:
    """No follower is held (no room): each answer makes one, an older reset's too after a newer
    reset's clear. That one must leave the newer reset's copy for the newer's first follower."""
    firsts: dict[int, bool] = {}

    class Recorded(ResetFollower):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            if not observing[0]:
                firsts.setdefault(self.reset_id, self.used_copy)

    monkeypatch.setattr(prefix_followers, "ResetFollower", Recorded)
    settings = StoreSettings(prefix_follower_bytes=1, rows_per_transaction=1)
    writer = StoreWriter(open_store(store_url), settings)
    checked = Checked(writer._sql.followers)
    writer._sql.followers.observe = checked
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    assert writer.failure is None and checked.wrong == []
    assert writer._sql.followers.turned_away > 0 and len(firsts) >= 2
    assert all(firsts.values()), firsts
