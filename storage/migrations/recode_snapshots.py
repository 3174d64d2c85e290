"""Re-writing every stored map snapshot in one format: what the snapshot-format migrations do.

Checkpoints and resets' "before" are recoded (collector/snapshot.py's `recode`) one row at a
time, so that a large store need not fit in memory; the map each holds is unchanged, and bytes
that are no snapshot are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.collector.snapshot import SnapshotError, recode
from kvscope.storage.checkpoint_blocks import stored_blocks
from kvscope.storage.row_heads import key_where


def recode_all(version: int) -> None:
    """A checkpoint that names its stream's log dictionary (format 5) is read with it, and
    written holding its blocks (unless in format 5 again)."""
    conn = op.get_bind()
    meta = sa.MetaData()
    checkpoints = sa.Table("checkpoints", meta, autoload_with=conn)
    resets = sa.Table("resets", meta, autoload_with=conn)
    for table, column in ((checkpoints, checkpoints.c.snapshot), (resets, resets.c.before)):
        keys = list(table.primary_key.columns)
        for key in conn.execute(sa.select(*keys)).all():
            where = key_where(keys, key)
            data = conn.execute(sa.select(column).where(where)).scalar_one()
            names = [c.name for c in keys]
            blocks = (
                stored_blocks(conn, key[names.index("stream_id")]) if table is checkpoints else None
            )
            try:
                recoded = recode(bytes(data), version, blocks)
            except SnapshotError:
                continue  # not a snapshot: readers refuse it as before, whatever its format
            conn.execute(sa.update(table).where(where).values({column.name: recoded}))
