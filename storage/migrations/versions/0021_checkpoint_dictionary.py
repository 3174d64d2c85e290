"""checkpoints name their log dictionary in a column

Revision ID: 0021
Revises: 0020

A checkpoint whose snapshot numbers the blocks of its stream's log dictionary (snapshot format 5)
names it in a header before its frame; retention keeps that dictionary while the checkpoint
stays. SQLite's substr reads a whole blob, so finding the names in the snapshots at every prune
read every checkpoint whole; the digest goes in a column too. Up adds it and fills it from the
stored snapshots' headers, a checkpoint at a time, each read no further than its header
(storage/row_heads.py); down drops it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.collector.snapshot import blocks_named
from kvscope.storage.row_heads import fill_from_heads

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_HEADER_BYTES = 5 + 255
"""As much of a snapshot as its header takes at most: the mark, the name's length, the name."""


def upgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dictionary", sa.LargeBinary(), nullable=True))
        batch_op.create_index("ix_checkpoints_stream_dictionary", ["stream_id", "dictionary"])
    fill_from_heads(
        op.get_bind(), "checkpoints", "snapshot", _HEADER_BYTES, "dictionary", blocks_named
    )


def downgrade() -> None:
    op.drop_index("ix_checkpoints_stream_dictionary", table_name="checkpoints")
    op.execute("ALTER TABLE checkpoints DROP COLUMN dictionary")
