"""A reset's prefix groups written to `reset_prefix_groups`, and its tokens recomputed and
orphans left to `resets` (storage/reset_prefixes.py decides them), so that SQL (the Grafana
panels) can read what the API computes.

The store's writer answers a recovering reset at every offset it reaches, and from one answer
to the next few groups change (a group's order and sizes come from the `before` map alone; its
`back_at_s` and status move as blocks come back): given what it wrote last (`StoredGroups`),
`write_prefix_groups` writes only the rows that differ, and the table ends as a full rewrite
would leave it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, delete, update

from kvscope.storage import schema
from kvscope.storage.bulk_sql import upsert_rows
from kvscope.storage.reset_prefix_types import PrefixGroup, ResetPrefixes, tokens_recomputed
from kvscope.storage.reset_prefixes import reset_prefixes

GroupRow = tuple[str, int, str, int, int, int, float | None, str, str | None]
"""A group's `reset_prefix_groups` row, from `medium` on (its position is its index)."""
_GROUPS = schema.reset_prefix_groups
_KEY = ("reset_id", "position")
assert tuple(c.name for c in _GROUPS.columns)[:2] == _KEY  # a row is (*_KEY, *GroupRow)
# Built once (SQLAlchemy makes a statement's cache key anew for each one built).
_DELETE_PAST = delete(_GROUPS).where(
    _GROUPS.c.reset_id == bindparam("reset"), _GROUPS.c.position >= bindparam("rows")
)
_FIGURES = (
    update(schema.resets)
    .where(schema.resets.c.id == bindparam("reset"))
    .values(tokens_recomputed=bindparam("recomputed"), orphans_left=bindparam("left"))
)


@dataclass(frozen=True, slots=True)
class StoredGroups:
    """What a reset's rows are in the store (as one transaction wrote them)."""

    reset_id: int
    figures: tuple[int, int]
    """(tokens_recomputed, orphans_left) of the `resets` row."""
    rows: tuple[GroupRow, ...]
    groups: tuple[PrefixGroup, ...] = ()
    """The groups `rows` were made of: a row whose group has the same head and sizes is reused
    (its constant columns are not formatted again), only `back_at_s` and status looked at."""


def store_prefix_groups(conn: Connection, reset_id: int, found: ResetPrefixes | None = None) -> int:
    """Replace the reset's stored groups and figures with `found` (default: computed now from
    the store); returns how many groups."""
    if found is None:
        found = reset_prefixes(conn, reset_id)
    return len(write_prefix_groups(conn, reset_id, found, None).rows)


def write_prefix_groups(
    conn: Connection, reset_id: int, found: ResetPrefixes, stored: StoredGroups | None
) -> StoredGroups:
    """Make the reset's stored groups and figures `found`'s, writing only what differs from
    `stored` (what they are in the store now, as this connection sees them; None: not known,
    all are replaced). Returns what they are now."""
    figures = (tokens_recomputed(found.groups), len(found.orphans))
    groups = found.groups
    if stored is not None and stored.reset_id != reset_id:
        stored = None
    if stored is None or figures != stored.figures:
        conn.execute(_FIGURES, {"reset": reset_id, "recomputed": figures[0], "left": figures[1]})
    if stored is None or len(stored.rows) != len(groups):
        rows = tuple(map(_row, groups))
        _replace(conn, reset_id, rows, None)
    else:
        rows, changed = _moved(groups, stored)
        if changed:
            _replace(conn, reset_id, rows, changed)
    return StoredGroups(reset_id, figures, rows, groups)


def _moved(
    groups: tuple[PrefixGroup, ...], stored: StoredGroups
) -> tuple[tuple[GroupRow, ...], list[int]]:
    """`groups`' rows and the positions where they differ from `stored`'s (as many). A
    follower's answers keep each position's group (its head and sizes come from the `before`
    map), so most rows are `stored`'s own, or it with another `back_at_s` and status."""
    rows: list[GroupRow] = []
    changed: list[int] = []
    olds = stored.groups if len(stored.groups) == len(groups) else (None,) * len(groups)
    for i, (g, old, row) in enumerate(zip(groups, olds, stored.rows, strict=True)):
        if old is None or not _same_head(g, old):
            new = _row(g)
            if new != row:
                changed.append(i)
            rows.append(new)
        elif g.back_at_s == row[6] and g.status == row[7]:
            rows.append(row)
        else:
            changed.append(i)
            rows.append((*row[:6], g.back_at_s, g.status, row[8]))
    return tuple(rows), changed


def _same_head(g: PrefixGroup, old: PrefixGroup) -> bool:
    """Whether `g`'s row differs from `old`'s in `back_at_s` and status at most."""
    return (
        g.root == old.root
        and g.blocks == old.blocks
        and g.tokens == old.tokens
        and g.shared_blocks == old.shared_blocks
        and g.table == old.table
        and (g.first_tokens is old.first_tokens or g.first_tokens == old.first_tokens)
    )


def _replace(
    conn: Connection, reset_id: int, rows: tuple[GroupRow, ...], positions: list[int] | None
) -> None:
    """The rows at `positions` (None: every row, and none past them) written anew."""
    if positions is None:
        conn.execute(_DELETE_PAST, {"reset": reset_id, "rows": len(rows)})
        positions = list(range(len(rows)))
    if positions:
        upsert_rows(conn, _GROUPS, _KEY, [(reset_id, i, *rows[i]) for i in positions])


def _row(g: PrefixGroup) -> GroupRow:
    return (
        g.table.medium,
        g.table.group,
        f"{g.root & (2**64 - 1):016x}",
        g.blocks,
        g.tokens,
        g.shared_blocks,
        g.back_at_s,
        g.status,
        None if g.first_tokens is None else " ".join(map(str, g.first_tokens)),
    )
