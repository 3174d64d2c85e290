"""map snapshots as byte planes: checkpoints and resets' "before" in snapshot format 2

Revision ID: 0010
Revises: 0009

Every stored snapshot is re-written (collector/snapshot.py's `recode`) in format 2, whose
columns lie as byte planes and pack tighter; down writes format 1 again. The map each holds is
unchanged; bytes that are no snapshot are left as they are. One row is read at a time, so that
a large store need not fit in memory.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.collector.snapshot import SnapshotError, recode

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _recode_all(version: int) -> None:
    conn = op.get_bind()
    meta = sa.MetaData()
    checkpoints = sa.Table("checkpoints", meta, autoload_with=conn)
    resets = sa.Table("resets", meta, autoload_with=conn)
    for table, column in ((checkpoints, checkpoints.c.snapshot), (resets, resets.c.before)):
        keys = list(table.primary_key.columns)
        for key in conn.execute(sa.select(*keys)).all():
            where = sa.and_(*(c == value for c, value in zip(keys, key, strict=True)))
            data = conn.execute(sa.select(column).where(where)).scalar_one()
            try:
                recoded = recode(bytes(data), version)
            except SnapshotError:
                continue  # not a snapshot: readers refuse it as before, whatever its format
            conn.execute(sa.update(table).where(where).values({column.name: recoded}))


def upgrade() -> None:
    _recode_all(2)


def downgrade() -> None:
    _recode_all(1)
