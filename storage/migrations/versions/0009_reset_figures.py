"""resets tokens_recomputed and orphans_left: what the modes panel shows of each reset

Revision ID: 0009
Revises: 0008

Both come from storage/reset_prefixes.py's groups and orphans (the map rebuilt from the log,
which SQL cannot do): the writer stores them with each reset's prefix groups, as of the offsets
reached. Resets stored before this revision get them from `kvscope db backfill` (run by
`kvscope db upgrade`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("resets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tokens_recomputed", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("orphans_left", sa.Integer(), nullable=True))


def downgrade() -> None:
    # In place, as 0007's downgrade (a batch would copy `resets`, which others refer to).
    op.execute("ALTER TABLE resets DROP COLUMN orphans_left")
    op.execute("ALTER TABLE resets DROP COLUMN tokens_recomputed")
