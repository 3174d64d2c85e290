"""`reset_prefix_groups` and the reset explorer's prefix panels (dashboards/
reset_prefixes_panels.py): the bundled lab capture replayed through the real writer into the real
PostgreSQL, the panels' SQL run there, and the answer compared with storage/reset_prefixes.py.
Grafana itself cannot run here: only its $reset substitution is done by hand."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.dashboards.reset_prefixes_panels import BY_STATUS_SQL, GROUPS_SQL
from kvscope.storage import schema
from kvscope.storage.engine import make_engine, upgrade
from kvscope.storage.reset_prefixes import reset_prefixes
from tests.migration_support import downgrade, engine_at
from tests.test_report import CAPTURE


def _replay(store: str) -> None:
    result = CliRunner().invoke(app, ["replay", str(CAPTURE), "--replica", "lab", "--store", store])
    assert result.exit_code == 0, result.output


def _panel(conn: sa.Connection, raw_sql: str, reset_id: int) -> list[sa.Row[*tuple[Any, ...]]]:
    return list(conn.execute(sa.text(raw_sql.replace("$reset", str(int(reset_id))))))


def test_the_prefix_panels_return_what_reset_prefixes_computes(pg_url: str) -> None:
    _replay(pg_url)
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        ids = list(conn.execute(sa.select(schema.resets.c.id).order_by("id")).scalars())
        assert len(ids) == 2
        for reset_id in ids:
            want = reset_prefixes(conn, reset_id)
            assert want.groups and want.offsets
            got = _panel(conn, GROUPS_SQL, reset_id)
            # The root's first tokens as ids (Grafana has no tokenizer to make text of them).
            assert [r._mapping["first tokens"] for r in got] == [
                " ".join(map(str, g.first_tokens or ())) for g in want.groups
            ]
            assert all(r._mapping["first tokens"] for r in got)
            assert [
                (r.tier, r[2], r.root, r.blocks, r.tokens, r[6], r[7], r.status) for r in got
            ] == [
                (
                    g.table.medium,
                    g.table.group,
                    f"{g.root & (2**64 - 1):016x}",
                    g.blocks,
                    g.tokens,
                    g.shared_blocks,
                    g.back_at_s,
                    g.status,
                )
                for g in want.groups
            ]
            by_status = {
                r.status: (r.groups, r.tokens) for r in _panel(conn, BY_STATUS_SQL, reset_id)
            }
            expected: dict[str, tuple[int, int]] = {}
            for g in want.groups:
                n, t = expected.get(g.status, (0, 0))
                expected[g.status] = (n + 1, t + g.tokens)
            assert by_status == expected
            shares = [r[4] for r in _panel(conn, BY_STATUS_SQL, reset_id)]
            assert abs(sum(shares) - 1.0) < 1e-9


def test_0008_adds_the_table_and_goes_back(store_url: str) -> None:
    engine = engine_at(store_url, "0007")
    with engine.connect() as conn:
        assert "reset_prefix_groups" not in sa.inspect(conn).get_table_names()
    upgrade(engine)
    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("reset_prefix_groups")}
    assert columns == {c.name for c in schema.reset_prefix_groups.columns}
    downgrade(engine, "0007")
    with engine.connect() as conn:
        tables = sa.inspect(conn).get_table_names()
        assert "reset_prefix_groups" not in tables and "reset_recovery" in tables
