"""the batch log in chunks: runs of batches compressed together replace one row per batch

Revision ID: 0006
Revises: 0005

Every stored batch moves, exactly as it was, into `log_chunks` (storage/log_chunks.py), read
and written one stream and epoch at a time so that a large log need not fit in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op

from kvscope.storage.log_chunk_pack import pack
from kvscope.storage.log_chunks import Chunk

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_READ = 20_000
"""Batches read at a time while moving them."""


def _batches_table() -> sa.Table:
    return sa.Table(
        "batches",
        sa.MetaData(),
        sa.Column("stream_id", sa.Integer(), primary_key=True),
        sa.Column("epoch", sa.Integer(), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("recv_ts", sa.Float(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
    )


def _log_rows(conn: sa.Connection, batches: sa.Table, sid: int, epoch: int) -> Iterator[Any]:
    """One epoch's batches in seq order, as the writer's log tuples (stream = the stream id)."""
    after = -1
    while True:
        rows = conn.execute(
            sa.select(batches.c.seq, batches.c.ts, batches.c.recv_ts, batches.c.payload)
            .where(batches.c.stream_id == sid, batches.c.epoch == epoch, batches.c.seq > after)
            .order_by(batches.c.seq)
            .limit(_READ)
        ).all()
        if not rows:
            return
        yield [(sid, epoch, r.seq, r.ts, r.recv_ts, bytes(r.payload)) for r in rows]
        after = rows[-1].seq


def upgrade() -> None:
    chunks = op.create_table(
        "log_chunks",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("min_ts", sa.Float(), nullable=False),
        sa.Column("max_ts", sa.Float(), nullable=False),
        sa.Column("batches", sa.Integer(), nullable=False),
        sa.Column("raw_bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["stream_id"], ["streams.id"]),
        sa.PrimaryKeyConstraint("stream_id", "epoch", "first_seq"),
    )
    with op.batch_alter_table("log_chunks", schema=None) as batch_op:
        batch_op.create_index("ix_log_chunks_stream_min_ts", ["stream_id", "min_ts"])
        batch_op.create_index("ix_log_chunks_stream_max_ts", ["stream_id", "max_ts"])

    conn = op.get_bind()
    batches = _batches_table()
    epochs = conn.execute(sa.select(batches.c.stream_id, batches.c.epoch).distinct()).all()
    for sid, epoch in epochs:
        for read in _log_rows(conn, batches, sid, epoch):
            # Chunks end where a read ends: a chunk may come out shorter, never wrong.
            packed = pack(read)
            conn.execute(
                sa.insert(chunks),
                [c.values(c.stream) for c in packed],
            )
    op.drop_table("batches")


def downgrade() -> None:
    batches = op.create_table(
        "batches",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("recv_ts", sa.Float(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["stream_id"], ["streams.id"]),
        sa.PrimaryKeyConstraint("stream_id", "epoch", "seq"),
    )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.create_index("ix_batches_stream_ts", ["stream_id", "ts"], unique=False)
    conn = op.get_bind()
    chunks = sa.Table("log_chunks", sa.MetaData(), autoload_with=conn)
    keys = conn.execute(
        sa.select(chunks.c.stream_id, chunks.c.epoch, chunks.c.first_seq).order_by(
            chunks.c.stream_id, chunks.c.epoch, chunks.c.first_seq
        )
    ).all()
    for sid, epoch, first_seq in keys:
        data = conn.execute(
            sa.select(chunks.c.data).where(
                chunks.c.stream_id == sid, chunks.c.epoch == epoch, chunks.c.first_seq == first_seq
            )
        ).scalar_one()
        chunk = Chunk(data)
        conn.execute(
            sa.insert(batches),
            [
                {
                    "stream_id": sid,
                    "epoch": epoch,
                    "seq": b.seq,
                    "ts": b.ts,
                    "recv_ts": b.recv_ts,
                    "payload": b.payload,
                }
                for b in (chunk.batch(i) for i in range(len(chunk)))
            ],
        )
    op.drop_table("log_chunks")
