"""Re-writing every stored map snapshot in one format: what the snapshot-format migrations do.

Checkpoints and resets' "before" are recoded (collector/snapshot.py's `recode`) one row at a
time, so that a large store need not fit in memory; the map each holds is unchanged, and bytes
that are no snapshot are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.collector.snapshot import SnapshotError, recode


def recode_all(version: int) -> None:
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
