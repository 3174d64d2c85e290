"""delta checkpoints: a checkpoint may be the rows changed since a key checkpoint (format 4)

Revision ID: 0014
Revises: 0013

Up adds `checkpoints.key_seq`, the seq of the key (format 3) checkpoint of the same stream and
epoch that a delta is read with; null for a key. Down re-writes every delta as the format 3
snapshot of the map it holds (exactly), one at a time so that a large store need not fit in
memory, and drops a delta whose key is gone (its map is unknown either way), then drops the
column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.collector.snapshot import SnapshotError, encode_tables
from kvscope.collector.snapshot_delta import decode_delta

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_seq", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    conn = op.get_bind()
    c = sa.Table("checkpoints", sa.MetaData(), autoload_with=conn)
    deltas = conn.execute(
        sa.select(c.c.stream_id, c.c.epoch, c.c.seq, c.c.key_seq).where(
            c.c.key_seq.is_not(None), c.c.key_seq != c.c.seq
        )
    ).all()
    for sid, epoch, seq, key_seq in deltas:
        at = sa.and_(c.c.stream_id == sid, c.c.epoch == epoch)
        data = conn.execute(sa.select(c.c.snapshot).where(at, c.c.seq == seq)).scalar_one()
        key = conn.execute(sa.select(c.c.snapshot).where(at, c.c.seq == key_seq)).scalar()
        try:
            if key is None:
                raise SnapshotError("its key is gone")
            tables, signed = decode_delta(bytes(data), bytes(key))
        except SnapshotError:
            conn.execute(sa.delete(c).where(at, c.c.seq == seq))
            continue
        whole = encode_tables(tables, signed, version=3)  # what a kvscope at 0013 reads
        conn.execute(sa.update(c).where(at, c.c.seq == seq).values(snapshot=whole))
    op.execute("ALTER TABLE checkpoints DROP COLUMN key_seq")
