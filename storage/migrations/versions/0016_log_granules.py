"""log chunk format 4: token blocks named by their number in the stream's dictionary

Revision ID: 0016
Revises: 0015

The schema is unchanged: up leaves the chunks stored in formats 1 to 3, which stay readable, and
chunks are written in format 4 from then on. Down re-writes every format 4 chunk in format 3
against the same dictionary (the same batches, exactly), for a kvscope that reads formats 1 to
3 only.
"""

from __future__ import annotations

from alembic import op

from kvscope.storage.log_columns import FORMAT_4_MAGIC
from kvscope.storage.log_rewrite import rewrite_chunks

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    rewrite_chunks(op.get_bind(), FORMAT_4_MAGIC, 3)
