"""resets recv_ts: the collector's clock when the clear arrived

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("resets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("recv_ts", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("resets", schema=None) as batch_op:
        batch_op.drop_column("recv_ts")
