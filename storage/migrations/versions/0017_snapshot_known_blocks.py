"""map snapshot format 5: checkpoints number the token blocks their log dictionary holds

Revision ID: 0017
Revises: 0016

The schema is unchanged: up leaves the snapshots stored in formats 1 to 3, which stay readable,
and checkpoints are written in format 5 from then on (collector/snapshot.py), naming their
stream's log dictionary in a header (and, from 0021, in a column that retention reads to keep
it). Down re-writes every snapshot in format 3, a checkpoint naming a dictionary read with it
(the same map, exactly), for a kvscope that reads formats 1 to 3 only.
"""

from __future__ import annotations

from kvscope.storage.migrations.recode_snapshots import recode_all

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    recode_all(3)
