"""resets tokens_recomputed and orphans_left: what the modes panel shows of each reset; prefix
groups' first tokens; log chunks' receive-time bounds

Revision ID: 0009
Revises: 0008

batch_log.engine_time finds the batch received nearest before an instant from the chunks whose
receive times can hold it (min_recv_ts, max_recv_ts, indexed), not by reading every chunk.

Both come from storage/reset_prefixes.py's groups and orphans (the map rebuilt from the log,
which SQL cannot do): the writer stores them with each reset's prefix groups, as of the offsets
reached. Resets stored before this revision get them from `kvscope db backfill` (run by
`kvscope db upgrade`), and so do the bounds of chunks written before it (meanwhile
engine_time reads those chunks whole).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("resets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tokens_recomputed", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("orphans_left", sa.Integer(), nullable=True))
    with op.batch_alter_table("reset_prefix_groups", schema=None) as batch_op:
        batch_op.add_column(sa.Column("first_tokens", sa.String(400), nullable=True))
    with op.batch_alter_table("log_chunks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("min_recv_ts", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("max_recv_ts", sa.Float(), nullable=True))
        batch_op.create_index(
            "ix_log_chunks_stream_recv_ts", ["stream_id", "max_recv_ts", "min_recv_ts"]
        )


def downgrade() -> None:
    op.drop_index("ix_log_chunks_stream_recv_ts", table_name="log_chunks")
    op.execute("ALTER TABLE log_chunks DROP COLUMN max_recv_ts")
    op.execute("ALTER TABLE log_chunks DROP COLUMN min_recv_ts")
    op.execute("ALTER TABLE reset_prefix_groups DROP COLUMN first_tokens")
    # In place, as 0007's downgrade (a batch would copy `resets`, which others refer to).
    op.execute("ALTER TABLE resets DROP COLUMN orphans_left")
    op.execute("ALTER TABLE resets DROP COLUMN tokens_recomputed")
