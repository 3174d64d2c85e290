"""map snapshots as byte planes: checkpoints and resets' "before" in snapshot format 2

Revision ID: 0010
Revises: 0009

Every stored snapshot is re-written (collector/snapshot.py's `recode`) in format 2, whose
columns lie as byte planes and pack tighter; down writes format 1 again
(storage/migrations/recode_snapshots.py). The map each holds is unchanged.
"""

from __future__ import annotations

from kvscope.storage.migrations.recode_snapshots import recode_all

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    recode_all(2)


def downgrade() -> None:
    recode_all(1)
