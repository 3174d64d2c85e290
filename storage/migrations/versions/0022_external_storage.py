"""PostgreSQL stores the compressed blobs as they are

Revision ID: 0022
Revises: 0021

The log's chunks and dictionaries, checkpoints' snapshots and resets' `before` maps are zstd
frames already. PostgreSQL's default storage for bytea (EXTENDED) runs pglz over every value
past about 2 kB before it gives up on bytes that do not shrink: server CPU at every write for
nothing. Up sets those columns to EXTERNAL (out of line, never compressed); down sets them back
to EXTENDED. Either only changes how values written from then on are stored. SQLite has no such
setting: a no-op there.
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

COMPRESSED_COLUMNS = (
    ("log_chunks", "data"),
    ("log_dictionaries", "data"),
    ("checkpoints", "snapshot"),
    ("resets", "before"),
)
"""The bytea columns whose values the writer compresses itself."""


def _set_storage(storage: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in COMPRESSED_COLUMNS:
        op.execute(f'ALTER TABLE {table} ALTER COLUMN "{column}" SET STORAGE {storage}')


def upgrade() -> None:
    _set_storage("EXTERNAL")


def downgrade() -> None:
    _set_storage("EXTENDED")
