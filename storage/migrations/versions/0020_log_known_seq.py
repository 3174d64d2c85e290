"""log chunks name their checkpoint in a column

Revision ID: 0020
Revises: 0019

A chunk of format 6 names the checkpoint whose hashes it was packed against in its header;
retention keeps that checkpoint while the chunk stays. Reading every chunk's header at every
prune costs a week of log per stream (and, on SQLite, holds the write lock meanwhile), so the
seq goes in a column too. Up adds it and fills it from the headers of the chunks stored, a
chunk at a time, each read no further than its header (storage/row_heads.py); down drops it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.storage.log_chunks import ChunkError
from kvscope.storage.log_columns import FORMAT_6_MAGIC
from kvscope.storage.log_known import known_name_of
from kvscope.storage.row_heads import fill_from_heads

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_HEADER_BYTES = 4 + 2 * (1 + 255)
"""As much of a chunk as its header's names take at most: the magic, then a dictionary's name
and a checkpoint's, each a length byte and its bytes."""


def upgrade() -> None:
    with op.batch_alter_table("log_chunks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("known_seq", sa.BigInteger(), nullable=True))
        batch_op.create_index("ix_log_chunks_stream_known", ["stream_id", "epoch", "known_seq"])
    fill_from_heads(
        op.get_bind(), "log_chunks", "data", _HEADER_BYTES, "known_seq", _seq_named, FORMAT_6_MAGIC
    )


def _seq_named(head: bytes) -> int | None:
    try:
        named = known_name_of(head)
    except ChunkError:
        return None  # a damaged chunk cannot be read, whatever is kept for it
    return None if named is None else named[1]


def downgrade() -> None:
    op.drop_index("ix_log_chunks_stream_known", table_name="log_chunks")
    op.execute("ALTER TABLE log_chunks DROP COLUMN known_seq")
