"""map snapshots without repeats: checkpoints and resets' "before" in snapshot format 3

Revision ID: 0012
Revises: 0011

Every stored snapshot is re-written (collector/snapshot.py's `recode`) in format 3, which leaves
out the parent hashes the tree already names and stores each distinct token block once; down
writes format 2 again (storage/migrations/recode_snapshots.py). The map each holds is unchanged.
"""

from __future__ import annotations

from kvscope.storage.migrations.recode_snapshots import recode_all

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    recode_all(3)


def downgrade() -> None:
    recode_all(2)
