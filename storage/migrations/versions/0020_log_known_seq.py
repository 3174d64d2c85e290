"""log chunks name their checkpoint in a column

Revision ID: 0020
Revises: 0019

A chunk of format 6 names the checkpoint whose hashes it was packed against in its header;
retention keeps that checkpoint while the chunk stays. Reading every chunk's header at every
prune costs a week of log per stream (and, on SQLite, holds the write lock meanwhile), so the
seq goes in a column too. Up adds it and fills it from the headers of the chunks stored, a
chunk at a time; down drops it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.storage.log_chunks import ChunkError
from kvscope.storage.log_columns import FORMAT_6_MAGIC
from kvscope.storage.log_known import known_name_of

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
    conn = op.get_bind()
    chunks = sa.Table("log_chunks", sa.MetaData(), autoload_with=conn)
    keys = (chunks.c.stream_id, chunks.c.epoch, chunks.c.first_seq)
    magic = sa.func.substr(chunks.c.data, 1, 4)
    named_ones = conn.execute(sa.select(*keys).where(magic == FORMAT_6_MAGIC)).all()
    for sid, epoch, first_seq in named_ones:
        where = sa.and_(*(c == v for c, v in zip(keys, (sid, epoch, first_seq), strict=True)))
        head = conn.execute(
            sa.select(sa.func.substr(chunks.c.data, 1, _HEADER_BYTES)).where(where)
        ).scalar_one()
        try:
            named = known_name_of(bytes(head))
        except ChunkError:
            continue  # a damaged chunk cannot be read, whatever is kept for it
        if named is not None:
            conn.execute(sa.update(chunks).where(where).values(known_seq=named[1]))


def downgrade() -> None:
    op.drop_index("ix_log_chunks_stream_known", table_name="log_chunks")
    op.execute("ALTER TABLE log_chunks DROP COLUMN known_seq")
