"""lease_members, stream_leases, lease_grants: collectors that share streams and fail over

Revision ID: 0011
Revises: 0010

Several `collect --lease` processes on one PostgreSQL hold each stream through a lease with a
fencing token (storage/leases.py). Stores without them are unchanged: a collector without
--lease never reads these tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_AT = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "lease_members",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("started_at", _AT, nullable=False),
        sa.Column("expires_at", _AT, nullable=False),
    )
    op.create_table(
        "stream_leases",
        sa.Column("replica", sa.String(200), primary_key=True),
        sa.Column("rank", sa.Integer(), primary_key=True),
        sa.Column("owner", sa.String(200)),
        sa.Column("token", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "lease_grants",
        sa.Column("replica", sa.String(200), primary_key=True),
        sa.Column("rank", sa.Integer(), primary_key=True),
        sa.Column("token", sa.BigInteger(), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("takeover", sa.Boolean(), nullable=False),
        sa.Column("granted_at", _AT, nullable=False),
        sa.Column("released_at", _AT),
        sa.Column("first_write_at", _AT),
        sa.Column("last_write_at", _AT),
        sa.Column("writes", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("lease_grants")
    op.drop_table("stream_leases")
    op.drop_table("lease_members")
