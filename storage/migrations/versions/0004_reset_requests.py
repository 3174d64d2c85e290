"""reset requests: resets asked for through kvscope

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reset_requests",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("replica", sa.String(length=200), nullable=False),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("external", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("detail", sa.String(length=400), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("reset_requests", schema=None) as batch_op:
        batch_op.create_index(
            "ix_reset_requests_replica_at", ["replica", "requested_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("reset_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_reset_requests_replica_at")

    op.drop_table("reset_requests")
