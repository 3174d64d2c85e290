"""A reset's prefix groups and orphans as records, and the status rule (storage/reset_prefixes.py
computes them; the API, the page, the report and the dashboard show them)."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.collector.types import TableKey

BACK_SHARE = 0.9
"""A group is back once this share of its blocks is hittable again."""
STATUS_BUCKETS = ((1.0, "back at +1 s"), (10.0, "back at +10 s"), (60.0, "back at +60 s"))
BACK_LATER = "back later"
NOT_BACK = "not back"
STATUSES = (*(label for _, label in STATUS_BUCKETS), BACK_LATER, NOT_BACK)
STATUS_COLORS = dict(
    zip(STATUSES, ("#1b9e5a", "#8cc43f", "#f2b134", "#e07b00", "#c62828"), strict=True)
)
"""One colour per status for the report and the dashboard (the page's: api/page_prefixes.py)."""
FIRST_TOKENS = 16


@dataclass(frozen=True, slots=True)
class GroupPoint:
    offset_s: float
    blocks_back: int
    hittable_back: int
    shared_back: int
    """Of the group's shared blocks, those hittable again."""


@dataclass(frozen=True, slots=True)
class PrefixGroup:
    table: TableKey
    root: int
    raw_root: bytes | None
    orphan_root: bool
    """The root's parent is named but was not cached before the reset (an orphan chain)."""
    first_tokens: tuple[int, ...] | None
    blocks: int
    tokens: int
    shared_blocks: int
    """Blocks two or more cached prefixes went through (the common prefix: in the lab, the
    system prompt); 0 for a single chain."""
    points: tuple[GroupPoint, ...]
    back_at_s: float | None
    status: str
    orphans_left: int
    """Orphans the reset left whose parent was one of this group's blocks."""


@dataclass(frozen=True, slots=True)
class ResetOrphan:
    table: TableKey
    hash: int
    parent: int
    stored_ts: float
    rejoined_ts: float | None
    removed_ts: float | None
    """Removed before it rejoined (None: still cached, or it rejoined first)."""
    raw_hash: bytes | None
    raw_parent: bytes | None
    group_root: int | None
    """The group of the `before` map its parent belonged to (None: the parent was not cached
    before the reset either)."""


@dataclass(frozen=True)
class ResetPrefixes:
    reset_id: int
    ts: float
    offsets: tuple[float, ...]
    complete: bool
    signed: bool
    groups: tuple[PrefixGroup, ...]
    """Largest first (tokens, then blocks), then by table and root hash."""
    orphans: tuple[ResetOrphan, ...]
    """In the order they were stored."""
    evicted_orphans: tuple[ResetOrphan, ...]
    """Blocks stored after the clear under a cached parent that was evicted later (not the
    reset's orphans), in the order they were orphaned; `stored_ts` is when that was."""
    followed_until_ts: float
    """The last batch the orphans were followed through."""
    unknown_because: tuple[str, ...] = ()
    """Why the map just after the clear may be incomplete (degraded or incomplete intervals)."""


def status_of(back_at_s: float | None) -> str:
    if back_at_s is None:
        return NOT_BACK
    for bound, label in STATUS_BUCKETS:
        if back_at_s <= bound:
            return label
    return BACK_LATER


def tokens_recomputed(groups: tuple[PrefixGroup, ...]) -> int:
    """Tokens of the pre-reset blocks cached again at the last offset reached: they were in the
    cache before the clear, so the engine computed them twice."""
    return sum(
        g.points[-1].blocks_back * (g.tokens // g.blocks) if g.points and g.blocks else 0
        for g in groups
    )
