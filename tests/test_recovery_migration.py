"""Migration 0007 (resets.recovery_complete) on a real SQLite file and the real PostgreSQL: up
fills it from the points stored so far, down drops it and keeps the rest."""

from __future__ import annotations

import sqlalchemy as sa

from kvscope.storage import schema
from kvscope.storage.engine import upgrade
from tests.migration_support import downgrade, store_at


def _reset(conn: sa.Connection, sid: int, seq: int, offsets: list[float]) -> int:
    # The columns as of 0006 (no recovery_complete).
    resets = sa.Table("resets", sa.MetaData(), autoload_with=conn)
    reset_id = conn.execute(
        sa.insert(resets)
        .values(
            stream_id=sid,
            epoch=0,
            seq=seq,
            ts=1000.0 + seq,
            recv_ts=None,
            reason="all_blocks_cleared",
            degraded=False,
            before_blocks=10,
            before_hittable=10,
            before_orphans=0,
            before_tokens=160,
            before=b"x",
            t50_s=3.0,
            t90_s=None,
            peak_orphans=0,
            recovery_until_ts=1000.0 + seq + max(offsets, default=0.0),
        )
        .returning(resets.c.id)
    ).scalar_one()
    for offset in offsets:
        conn.execute(
            sa.insert(schema.reset_recovery).values(
                reset_id=reset_id,
                offset_s=offset,
                blocks=5,
                hittable=5,
                orphans=0,
                share_blocks_back=0.5,
                share_tokens_back=0.5,
            )
        )
    return int(reset_id)


def test_0007_says_which_stored_windows_are_complete_and_goes_back(store_url: str) -> None:
    engine, sid = store_at(store_url, "0006")
    with engine.begin() as conn:
        complete = _reset(conn, sid, 10, [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0])
        partial = _reset(conn, sid, 20, [1.0, 2.0, 5.0])
        empty = _reset(conn, sid, 30, [])
    upgrade(engine)
    r = schema.resets
    with engine.connect() as conn:
        got = dict(conn.execute(sa.select(r.c.id, r.c.recovery_complete)).all())
    assert got == {complete: True, partial: False, empty: False}

    downgrade(engine, "0006")
    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("resets")}
        assert "recovery_complete" not in columns and "recovery_until_ts" in columns
        kept = conn.execute(sa.select(sa.func.count()).select_from(schema.reset_recovery))
        assert kept.scalar() == 12
    upgrade(engine)  # and up again
    engine.dispose()
