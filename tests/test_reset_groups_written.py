"""The store writer writes each recovery answer's prefix groups as what changed since its last
(storage/prefix_groups_store.py, `PrefixFollowers.store`): after every transaction
`reset_prefix_groups` and the reset's figures are what a full rewrite of the answer leaves, and
an answer that changes nothing writes no group row. A transaction that did not commit is no
base for the next answer."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection, Engine, event, select

from kvscope.collector.capture import read_capture
from kvscope.collector.ingest import StreamIngest
from kvscope.storage import schema
from kvscope.storage.engine import open_store
from kvscope.storage.prefix_followers import PrefixFollowers
from kvscope.storage.prefix_groups_store import store_prefix_groups, write_prefix_groups
from kvscope.storage.reset_prefix_types import ResetPrefixes, status_of
from kvscope.storage.reset_prefixes import reset_prefixes
from kvscope.storage.store_settings import StoreSettings
from kvscope.storage.writer import StoreWriter
from tests.conftest import capture_path
from tests.test_reset_groups_follow import STREAM


def _stored(conn: Connection, reset_id: int) -> tuple[Any, ...]:
    t, r = schema.reset_prefix_groups, schema.resets
    rows = conn.execute(select(t).where(t.c.reset_id == reset_id).order_by(t.c.position)).all()
    figures = conn.execute(
        select(r.c.tokens_recomputed, r.c.orphans_left).where(r.c.id == reset_id)
    ).one()
    return tuple(map(tuple, rows)), tuple(figures)


def _recorded(engine: Engine) -> StoreWriter:
    """The lab recording written to `engine` by a writer (closed)."""
    writer = StoreWriter(engine)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    return writer


@pytest.fixture
def group_writes() -> Iterator[list[str]]:
    """The statements run on `reset_prefix_groups` that insert or delete rows."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        lowered = statement.lower()
        if "reset_prefix_groups" in lowered and ("insert" in lowered or "delete" in lowered):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", note)
    yield seen
    event.remove(Engine, "before_cursor_execute", note)


class AsRewritten:
    """After each answer, in the writer's transaction: the stored rows against a full rewrite
    of the same answer (made in a savepoint, rolled back)."""

    def __init__(self, writes: list[str]) -> None:
        self.writes = writes
        self.answers = 0
        self.wrong: list[int] = []
        self.quiet = 0
        """Answers that wrote no group row (nothing changed)."""

    def __call__(self, conn: Connection, found: ResetPrefixes) -> None:
        self.answers += 1
        self._before = len(self.writes)

    def check(self, conn: Connection, reset_id: int, found: ResetPrefixes) -> None:
        if len(self.writes) == self._before:
            self.quiet += 1
        got = _stored(conn, reset_id)
        with conn.begin_nested() as nested:
            store_prefix_groups(conn, reset_id, found)
            want = _stored(conn, reset_id)
            nested.rollback()
        if got != want:
            self.wrong.append(reset_id)


def test_every_answer_leaves_what_a_full_rewrite_does(
    store_url: str, group_writes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = StoreSettings(rows_per_transaction=1)
    writer = StoreWriter(open_store(store_url), settings)
    followers = writer._sql.followers
    checked = AsRewritten(group_writes)
    followers.observe = checked
    store = PrefixFollowers.store

    def store_and_check(self: PrefixFollowers, conn: Connection, *args: Any) -> Any:
        found = store(self, conn, *args)
        checked.check(conn, found.reset_id, found)
        return found

    monkeypatch.setattr(PrefixFollowers, "store", store_and_check)
    ingest = StreamIngest(STREAM, can_replay=False, sink=writer)
    for record in read_capture(capture_path("lab_3rps_180s.msgpack.gz")):
        ingest.live_frames(record.frames, record.recv_ts)
    writer.close()
    assert checked.answers >= 10
    assert checked.wrong == []
    # Most answers move no group (a t50 or t90 row, an offset where none came back).
    assert checked.quiet >= 3
    with writer.engine.begin() as conn:
        for reset_id in conn.execute(select(schema.resets.c.id)).scalars().all():
            got = _stored(conn, reset_id)
            store_prefix_groups(conn, reset_id)
            assert _stored(conn, reset_id) == got


def test_an_answer_rolled_back_is_not_the_next_ones_base(tmp_path: Any) -> None:
    """The answer at +1 s committed; the full answer written in a transaction that rolled
    back; the full answer again: written against what the store holds (+1 s's rows), not
    against the answer that never landed."""
    writer = _recorded(open_store(f"sqlite:///{tmp_path / 's.sqlite'}"))
    rr = schema.reset_recovery
    followers = PrefixFollowers()

    def answer(conn: Connection, reset_id: int) -> None:
        followers.logged([], [])  # as the writer does first in each transaction
        followers.store(conn, STREAM, reset_id)

    with writer.engine.connect() as conn:
        reset_id = conn.execute(sa.select(sa.func.min(schema.resets.c.id))).scalar_one()
        query = select(rr).where(rr.c.reset_id == reset_id)
        points = [dict(r._mapping) for r in conn.execute(query)]
        later = sa.delete(rr).where(rr.c.reset_id == reset_id, rr.c.offset_s > 1.0)
        conn.commit()
        with conn.begin():
            conn.execute(later)
            answer(conn, reset_id)
            at_one = _stored(conn, reset_id)
        followers.committed()
        with conn.begin() as tx:
            conn.execute(sa.insert(rr), [p for p in points if p["offset_s"] > 1.0])
            answer(conn, reset_id)
            whole = _stored(conn, reset_id)
            tx.rollback()
        assert whole != at_one and _stored(conn, reset_id) == at_one
        conn.commit()
        with conn.begin():
            conn.execute(sa.insert(rr), [p for p in points if p["offset_s"] > 1.0])
            answer(conn, reset_id)
        followers.committed()
        assert _stored(conn, reset_id) == whole


def test_rows_written_from_a_base_equal_a_full_rewrite(store_url: str) -> None:
    """An answer written against the last one's rows leaves what a full rewrite does, also where
    a position's group is another one (a head, a size or its first tokens differ), not only
    where its `back_at_s` and status moved, or groups are fewer; and the next answer is written
    against it."""
    writer = _recorded(open_store(store_url))
    with writer.engine.connect() as conn:
        reset_id = conn.execute(sa.select(sa.func.min(schema.resets.c.id))).scalar_one()
        found = reset_prefixes(conn, reset_id)
        conn.commit()
        groups = found.groups
        assert len(groups) >= 4
        first = groups[3].first_tokens or (1,)
        swapped = (
            groups[1],  # two groups swap places
            groups[0],
            dataclasses.replace(groups[2], back_at_s=123.5, status=status_of(123.5)),
            dataclasses.replace(groups[3], first_tokens=(*first[:-1], first[-1] + 1)),
            *groups[4:],
        )
        resized = (
            dataclasses.replace(groups[0], blocks=groups[0].blocks + 1),
            dataclasses.replace(groups[1], first_tokens=tuple(list(groups[1].first_tokens or ()))),
            *groups[2:],
        )
        answers = (
            found,
            dataclasses.replace(found, groups=swapped),
            found,
            dataclasses.replace(found, groups=resized),
            dataclasses.replace(found, groups=groups[:2]),  # fewer: the rows past them go
            found,
        )
        with conn.begin():
            stored = write_prefix_groups(conn, reset_id, answers[0], None)
        for answer in answers[1:]:
            with conn.begin():
                stored = write_prefix_groups(conn, reset_id, answer, stored)
                got = _stored(conn, reset_id)
                with conn.begin_nested() as nested:  # written into an empty table
                    t = schema.reset_prefix_groups
                    conn.execute(sa.delete(t).where(t.c.reset_id == reset_id))
                    store_prefix_groups(conn, reset_id, answer)
                    want = _stored(conn, reset_id)
                    nested.rollback()
            assert got == want
