"""log chunk format 5: a chunk without a dictionary keeps its token ids as byte planes

Revision ID: 0018
Revises: 0017

The schema is unchanged: up leaves the chunks stored in formats 1 to 4, which stay readable, and
chunks are written in format 5 from then on (a chunk against a dictionary still in format 4).
Down re-writes every format 5 chunk in format 4 (the same batches, exactly), for a kvscope that
reads formats 1 to 4 only.
"""

from __future__ import annotations

from alembic import op

from kvscope.storage.log_columns import FORMAT_5_MAGIC
from kvscope.storage.log_rewrite import rewrite_chunks

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    rewrite_chunks(op.get_bind(), FORMAT_5_MAGIC, 4)
