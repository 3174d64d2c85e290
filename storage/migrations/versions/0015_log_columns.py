"""log chunk format 3: columns

Revision ID: 0015
Revises: 0014

The schema is unchanged: up leaves the chunks stored in formats 1 and 2, which stay readable,
and chunks are written in format 3 from then on. Down re-writes every format 3 chunk in format
2 against the same dictionary (the same batches, exactly), one at a time so that a large log
need not fit in memory, for a kvscope that reads formats 1 and 2 only.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kvscope.storage.log_chunks import pack
from kvscope.storage.log_columns import FORMAT_3_MAGIC
from kvscope.storage.log_dictionaries_sql import dictionary, open_chunk

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    conn = op.get_bind()
    chunks = sa.Table("log_chunks", sa.MetaData(), autoload_with=conn)
    keys = (chunks.c.stream_id, chunks.c.epoch, chunks.c.first_seq)
    magic = sa.func.substr(chunks.c.data, 1, 4)
    format_3 = conn.execute(sa.select(*keys).where(magic == FORMAT_3_MAGIC)).all()
    for sid, epoch, first_seq in format_3:
        where = sa.and_(*(c == v for c, v in zip(keys, (sid, epoch, first_seq), strict=True)))
        data, digest = conn.execute(
            sa.select(chunks.c.data, chunks.c.dictionary).where(where)
        ).one()
        chunk = open_chunk(conn, sid, bytes(data))
        named = {} if digest is None else {sid: dictionary(conn, sid, bytes(digest))}
        rows = [(sid, epoch, *chunk.batch(i)) for i in range(len(chunk))]
        (again,) = pack(rows, 2, named)  # one run: it was one chunk
        conn.execute(
            sa.update(chunks).where(where).values(data=again.data, raw_bytes=again.raw_bytes)
        )
