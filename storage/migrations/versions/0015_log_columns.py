"""log chunk format 3: columns

Revision ID: 0015
Revises: 0014

The schema is unchanged: up leaves the chunks stored in formats 1 and 2, which stay readable,
and chunks are written in format 3 from then on. Down re-writes every format 3 chunk in format
2 against the same dictionary (the same batches, exactly), one at a time so that a large log
need not fit in memory, for a kvscope that reads formats 1 and 2 only.
"""

from __future__ import annotations

from alembic import op

from kvscope.storage.log_columns import FORMAT_3_MAGIC
from kvscope.storage.log_rewrite import rewrite_chunks

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    rewrite_chunks(op.get_bind(), FORMAT_3_MAGIC, 2)
