"""A reset's prefix groups written to `reset_prefix_groups`, and its tokens recomputed and
orphans left to `resets` (storage/reset_prefixes.py decides them), so that SQL (the Grafana
panels) can read what the API computes."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, update

from kvscope.storage import schema
from kvscope.storage.reset_prefix_types import ResetPrefixes, tokens_recomputed
from kvscope.storage.reset_prefixes import reset_prefixes


def store_prefix_groups(conn: Connection, reset_id: int, found: ResetPrefixes | None = None) -> int:
    """Replace the reset's stored groups and figures with `found` (default: computed now from
    the store); returns how many groups."""
    t, r = schema.reset_prefix_groups, schema.resets
    if found is None:
        found = reset_prefixes(conn, reset_id)
    groups = found.groups
    figures = {"tokens_recomputed": tokens_recomputed(groups), "orphans_left": len(found.orphans)}
    conn.execute(update(r).where(r.c.id == reset_id).values(**figures))
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
                    "first_tokens": None
                    if g.first_tokens is None
                    else " ".join(map(str, g.first_tokens)),
                }
                for i, g in enumerate(groups)
            ],
        )
    return len(groups)
