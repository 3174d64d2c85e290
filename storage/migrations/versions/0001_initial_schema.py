"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "streams",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("replica", sa.String(length=200), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("shard", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("replica", "rank", name="uq_streams_replica_rank"),
    )
    op.create_table(
        "batches",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("recv_ts", sa.Float(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("stream_id", "epoch", "seq"),
    )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.create_index("ix_batches_recv_ts", ["recv_ts"], unique=False)
        batch_op.create_index("ix_batches_stream_ts", ["stream_id", "ts"], unique=False)

    op.create_table(
        "checkpoints",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("blocks", sa.Integer(), nullable=False),
        sa.Column("snapshot", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("stream_id", "epoch", "seq"),
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index("ix_checkpoints_ts", ["ts"], unique=False)

    op.create_table(
        "epochs",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("started_recv_ts", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("stream_id", "epoch"),
    )
    op.create_table(
        "intervals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("from_ts", sa.Float(), nullable=False),
        sa.Column("to_ts", sa.Float(), nullable=True),
        sa.Column("from_seq", sa.BigInteger(), nullable=True),
        sa.Column("to_seq", sa.BigInteger(), nullable=True),
        sa.Column("detail", sa.String(length=400), nullable=True),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("intervals", schema=None) as batch_op:
        batch_op.create_index("ix_intervals_stream_kind", ["stream_id", "kind"], unique=False)

    op.create_table(
        "resets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("reason", sa.String(length=40), nullable=False),
        sa.Column("degraded", sa.Boolean(), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=True),
        sa.Column("before_blocks", sa.Integer(), nullable=False),
        sa.Column("before_hittable", sa.Integer(), nullable=False),
        sa.Column("before_orphans", sa.Integer(), nullable=False),
        sa.Column("before_tokens", sa.BigInteger(), nullable=False),
        sa.Column("before", sa.LargeBinary(), nullable=False),
        sa.Column("t50_s", sa.Float(), nullable=True),
        sa.Column("t90_s", sa.Float(), nullable=True),
        sa.Column("peak_orphans", sa.Integer(), nullable=True),
        sa.Column("recovery_until_ts", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("stream_id", "epoch", "seq", "reason", name="uq_resets_event"),
    )
    with op.batch_alter_table("resets", schema=None) as batch_op:
        batch_op.create_index("ix_resets_stream_ts", ["stream_id", "ts"], unique=False)

    op.create_table(
        "rollups",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("second", sa.BigInteger(), nullable=False),
        sa.Column("medium", sa.String(length=16), nullable=False),
        sa.Column("grp", sa.Integer(), nullable=False),
        sa.Column("stored", sa.Integer(), nullable=False),
        sa.Column("hittable", sa.Integer(), nullable=False),
        sa.Column("orphans", sa.Integer(), nullable=False),
        sa.Column("stores", sa.Integer(), nullable=False),
        sa.Column("removes", sa.Integer(), nullable=False),
        sa.Column("clears", sa.Integer(), nullable=False),
        sa.Column("gaps", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("stream_id", "second", "medium", "grp"),
    )
    with op.batch_alter_table("rollups", schema=None) as batch_op:
        batch_op.create_index("ix_rollups_second", ["second"], unique=False)

    op.create_table(
        "reset_recovery",
        sa.Column("reset_id", sa.Integer(), nullable=False),
        sa.Column("offset_s", sa.Float(), nullable=False),
        sa.Column("blocks", sa.Integer(), nullable=False),
        sa.Column("hittable", sa.Integer(), nullable=False),
        sa.Column("orphans", sa.Integer(), nullable=False),
        sa.Column("share_blocks_back", sa.Float(), nullable=False),
        sa.Column("share_tokens_back", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["reset_id"],
            ["resets.id"],
        ),
        sa.PrimaryKeyConstraint("reset_id", "offset_s"),
    )


def downgrade() -> None:
    op.drop_table("reset_recovery")
    with op.batch_alter_table("rollups", schema=None) as batch_op:
        batch_op.drop_index("ix_rollups_second")

    op.drop_table("rollups")
    with op.batch_alter_table("resets", schema=None) as batch_op:
        batch_op.drop_index("ix_resets_stream_ts")

    op.drop_table("resets")
    with op.batch_alter_table("intervals", schema=None) as batch_op:
        batch_op.drop_index("ix_intervals_stream_kind")

    op.drop_table("intervals")
    op.drop_table("epochs")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoints_ts")

    op.drop_table("checkpoints")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index("ix_batches_stream_ts")
        batch_op.drop_index("ix_batches_recv_ts")

    op.drop_table("batches")
    op.drop_table("streams")
