"""engine samples: what vLLM's own /metrics said, scraped every few seconds

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "engine_samples",
        sa.Column("replica", sa.String(length=200), nullable=False),
        sa.Column("engine", sa.String(length=50), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("prefix_cache_queries", sa.Float(), nullable=True),
        sa.Column("prefix_cache_hits", sa.Float(), nullable=True),
        sa.Column("preemptions", sa.Float(), nullable=True),
        sa.Column("running", sa.Float(), nullable=True),
        sa.Column("waiting", sa.Float(), nullable=True),
        sa.Column("kv_usage", sa.Float(), nullable=True),
        sa.Column("ttft_sum", sa.Float(), nullable=True),
        sa.Column("ttft_count", sa.Float(), nullable=True),
        sa.Column("ttft_buckets", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("replica", "engine", "ts"),
    )


def downgrade() -> None:
    op.drop_table("engine_samples")
