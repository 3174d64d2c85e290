"""log chunk format 6: hash literals found among a checkpoint's hashes stored as positions

Revision ID: 0019
Revises: 0018

The schema is unchanged: up leaves the chunks stored in formats 1 to 5, which stay readable, and
chunks are written in format 6 from then on (a chunk with no stored checkpoint before it still
in format 4 or 5). Down re-writes every format 6 chunk in format 5 (the same batches, exactly,
against the same dictionary), for a kvscope that reads formats 1 to 5 only.
"""

from __future__ import annotations

from alembic import op

from kvscope.storage.log_columns import FORMAT_6_MAGIC
from kvscope.storage.log_rewrite import rewrite_chunks

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    rewrite_chunks(op.get_bind(), FORMAT_6_MAGIC, 5)
