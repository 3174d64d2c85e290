"""`kvscope db upgrade` on a store an older kvscope wrote (before migrations 0008 and 0009): its
resets get the prefix groups, tokens recomputed and orphans left that today's writer stores
with them (storage/backfill.py), on SQLite and on the real PostgreSQL.

The old store: the bundled capture played into a store at head by today's writer, and the rows
of every table revision 0007 had copied, columns of 0007 only, into a store migrated to 0007:
the rows the pre-0008 writer wrote (0008 and 0009 added tables and columns, and changed none
of the rows before them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.storage import schema
from kvscope.storage.engine import make_engine, open_store, upgrade
from tests.test_report import _store


def _old_store(new: sa.Engine, url: str) -> None:
    old = make_engine(url)
    upgrade(old, "0007")
    reflected = sa.MetaData()
    reflected.reflect(old)
    with new.connect() as source, old.begin() as target:
        for table in reflected.sorted_tables:
            if table.name == "alembic_version":
                continue
            columns = [schema.metadata.tables[table.name].c[c.name] for c in table.columns]
            rows = [dict(r._mapping) for r in source.execute(sa.select(*columns))]
            if rows:
                target.execute(table.insert(), rows)
        if target.dialect.name == "postgresql":  # ids were copied: move the sequences on
            for table in reflected.sorted_tables:
                if "id" in table.c and table.c.id.autoincrement is not False:
                    target.execute(
                        sa.text(
                            f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                            f"COALESCE((SELECT max(id) FROM {table.name}), 1))"
                        )
                    )
    old.dispose()


def _figures(engine: sa.Engine) -> tuple[list[Any], list[Any]]:
    r, g = schema.resets, schema.reset_prefix_groups
    with engine.connect() as conn:
        resets = conn.execute(
            sa.select(r.c.id, r.c.tokens_recomputed, r.c.orphans_left).order_by(r.c.id)
        ).all()
        groups = conn.execute(sa.select(g).order_by(g.c.reset_id, g.c.position)).all()
    return [tuple(x) for x in resets], [tuple(x) for x in groups]


def test_db_upgrade_backfills_what_an_old_store_lacks(store_url: str, tmp_path: Path) -> None:
    new = open_store(_store(tmp_path))
    want_resets, want_groups = _figures(new)
    assert len(want_resets) == 2 and want_groups
    assert all(t is not None and t > 0 for _, t, _ in want_resets)
    assert [o for _, _, o in want_resets][1] > 0  # the keep-running reset left orphans

    _old_store(new, store_url)
    result = CliRunner().invoke(app, ["db", "upgrade", "--store", store_url])
    assert result.exit_code == 0, result.output
    assert "backfilled 2 resets" in result.output
    got = make_engine(store_url)
    assert _figures(got) == (want_resets, want_groups)

    again = CliRunner().invoke(app, ["db", "backfill", "--store", store_url])
    assert again.exit_code == 0 and "backfilled 0 resets" in again.output  # nothing left
    got.dispose()


def test_a_reset_whose_log_was_pruned_is_left_without_and_counted(
    store_url: str, tmp_path: Path
) -> None:
    """No figures are made up for a reset whose log is gone: it is left as it is (NULL, no
    groups), and the command says how many."""
    new = open_store(_store(tmp_path))
    _old_store(new, store_url)
    old = make_engine(store_url)
    with old.begin() as conn:  # what `kvscope prune` leaves of a log older than its window
        conn.execute(sa.delete(schema.log_chunks))
        conn.execute(sa.delete(schema.checkpoints))
    old.dispose()
    result = CliRunner().invoke(app, ["db", "upgrade", "--store", store_url])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "backfilled 0 resets" in said and "2 left without: their batch log was pruned" in said
    got = make_engine(store_url)
    resets, groups = _figures(got)
    assert [(t, o) for _, t, o in resets] == [(None, None), (None, None)] and groups == []
    got.dispose()


def test_a_reset_the_writer_answered_meanwhile_is_left_to_the_writer(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # Backfill lists the resets without figures, then rewrites each; a live writer may answer
    # one in between. The writer then writes only what differs from its own last answer, so a
    # rewrite landing after it would stay wrong: backfill takes a reset only while its figures
    # are still missing, claimed in the transaction that writes them.
    from kvscope.storage import backfill as backfill_module

    engine = open_store(_store(tmp_path))
    t = schema.reset_prefix_groups
    with engine.begin() as conn:
        listed = [int(i) for i in conn.execute(sa.select(schema.resets.c.id)).scalars()]
        assert listed
        conn.execute(sa.update(t).values(status="as the writer left it"))
    monkeypatch.setattr(backfill_module, "missing", lambda engine: listed)
    done = backfill_module.backfill(engine)
    assert (done.resets, done.answered_meanwhile) == (0, len(listed))
    with engine.connect() as conn:
        assert set(conn.execute(sa.select(t.c.status)).scalars()) == {"as the writer left it"}
