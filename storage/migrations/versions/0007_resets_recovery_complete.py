"""resets recovery_complete: recovery is stored as it happens, and said partial until complete

Revision ID: 0007
Revises: 0006

Until 0006 a recovery was written when its window ended (or a later reset or the writer's close
cut it short); a stored window is complete when its last offset (300 s) was reached.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_LAST_OFFSET_S = 300.0
"""The last offset of the recovery window kvscope has always used."""


def upgrade() -> None:
    with op.batch_alter_table("resets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("recovery_complete", sa.Boolean(), nullable=True))
    resets = sa.table("resets", sa.column("id", sa.Integer()), sa.column("recovery_complete"))
    points = sa.table(
        "reset_recovery", sa.column("reset_id", sa.Integer()), sa.column("offset_s", sa.Float())
    )
    reached = (
        sa.select(points.c.reset_id)
        .where(points.c.reset_id == resets.c.id, points.c.offset_s >= _LAST_OFFSET_S)
        .exists()
    )
    op.get_bind().execute(sa.update(resets).values(recovery_complete=reached))


def downgrade() -> None:
    # Not a batch (SQLite would copy `resets`, which `reset_recovery` refers to, and the
    # foreign keys refuse it): SQLite >= 3.35 and PostgreSQL drop a column in place.
    op.execute("ALTER TABLE resets DROP COLUMN recovery_complete")
