"""A reset's prefix groups written to `reset_prefix_groups` (storage/reset_prefixes.py decides
them), so that SQL (the Grafana panel) can read what the API computes."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert

from kvscope.storage import schema
from kvscope.storage.reset_prefixes import reset_prefixes


def store_prefix_groups(conn: Connection, reset_id: int) -> int:
    """Replace the reset's stored groups with those computed now; returns how many."""
    t = schema.reset_prefix_groups
    groups = reset_prefixes(conn, reset_id).groups
    conn.execute(delete(t).where(t.c.reset_id == reset_id))
    if groups:
        conn.execute(
            insert(t),
            [
                {
                    "reset_id": reset_id,
                    "position": i,
                    "medium": g.table.medium,
                    "kv_group": g.table.group,
                    "root": f"{g.root & (2**64 - 1):016x}",
                    "blocks": g.blocks,
                    "tokens": g.tokens,
                    "shared_blocks": g.shared_blocks,
                    "back_at_s": g.back_at_s,
                    "status": g.status,
                }
                for i, g in enumerate(groups)
            ],
        )
    return len(groups)
