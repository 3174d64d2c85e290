"""log chunk format 2: chunks compressed against their stream's dictionary

Revision ID: 0013
Revises: 0012

Up adds `log_dictionaries` and the column by which a chunk names its dictionary; the chunks
stored are left in format 1, which stays readable. Down re-writes every format 2 chunk in
format 1 (the same batches, exactly), one at a time so that a large log need not fit in memory,
then drops both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import FORMAT_2_MAGIC
from kvscope.storage.log_dictionaries_sql import open_chunk
from kvscope.storage.row_heads import key_where, keys_starting

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_dictionaries",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("made_at", sa.Float(), nullable=False),
        sa.Column("raw_bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["stream_id"], ["streams.id"]),
        sa.PrimaryKeyConstraint("stream_id", "digest"),
    )
    with op.batch_alter_table("log_chunks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dictionary", sa.LargeBinary(), nullable=True))
        batch_op.create_index("ix_log_chunks_stream_dictionary", ["stream_id", "dictionary"])


def downgrade() -> None:
    conn = op.get_bind()
    chunks = sa.Table("log_chunks", sa.MetaData(), autoload_with=conn)
    keys = list(chunks.primary_key.columns)
    format_2 = keys_starting(conn, chunks, "data", FORMAT_2_MAGIC)
    for sid, epoch, first_seq in format_2:
        where = key_where(keys, (sid, epoch, first_seq))
        data = conn.execute(sa.select(chunks.c.data).where(where)).scalar_one()
        chunk = open_chunk(conn, sid, bytes(data))
        rows = [(sid, epoch, *chunk.batch(i)) for i in range(len(chunk))]
        (again,) = pack(rows, 1)  # one run: it was one chunk
        conn.execute(
            sa.update(chunks).where(where).values(data=again.data, raw_bytes=again.raw_bytes)
        )
    op.drop_index("ix_log_chunks_stream_dictionary", table_name="log_chunks")
    op.execute("ALTER TABLE log_chunks DROP COLUMN dictionary")
    op.drop_table("log_dictionaries")
