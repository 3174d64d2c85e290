"""reset_prefix_groups: a reset's prefix groups and their status, for dashboards

Revision ID: 0008
Revises: 0007

storage/reset_prefixes.py's rule needs the map rebuilt from the log, which SQL cannot do; the
writer stores its groups, as of the offsets reached, with each recovery row it writes. Resets
stored before this revision have none (GET /resets/{id}/prefixes still computes them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reset_prefix_groups",
        sa.Column("reset_id", sa.Integer(), sa.ForeignKey("resets.id"), primary_key=True),
        sa.Column("position", sa.Integer(), primary_key=True),
        sa.Column("medium", sa.String(40), nullable=False),
        sa.Column("kv_group", sa.Integer(), nullable=False),
        sa.Column("root", sa.String(40), nullable=False),
        sa.Column("blocks", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("shared_blocks", sa.Integer(), nullable=False),
        sa.Column("back_at_s", sa.Float()),
        sa.Column("status", sa.String(20), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reset_prefix_groups")
