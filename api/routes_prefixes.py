"""What came back of a reset, prefix by prefix: GET /resets/{id}/prefixes.

The computation is the store's (storage/reset_prefixes.py); its answer is kept per reset in
the app (`ApiContext.prefixes`) until the reset's recovery reaches another offset.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from sqlalchemy import select

from kvscope.api.context import ApiContext, context
from kvscope.api.errors import ApiError, documented
from kvscope.api.schemas import (
    EvictedOrphanOut,
    PrefixGroupOut,
    PrefixGroupPoint,
    ResetOrphanOut,
    ResetPrefixesPage,
)
from kvscope.collector.dump import show_hash
from kvscope.storage import schema
from kvscope.storage.reset_prefix_types import BACK_SHARE, STATUSES, PrefixGroup, ResetOrphan
from kvscope.storage.token_text import TokenText

router = APIRouter(tags=["resets"])
Ctx = Annotated[ApiContext, Depends(context)]
MAX_ORPHANS = 1000


def _group_out(g: PrefixGroup, signed: bool, text: TokenText | None) -> PrefixGroupOut:
    root = show_hash(g.root, g.raw_root, signed)
    return PrefixGroupOut(
        medium=g.table.medium,
        group=g.table.group,
        root=root,
        root_text=str(root),
        orphan_root=g.orphan_root,
        first_tokens=None if g.first_tokens is None else list(g.first_tokens),
        first_text=None if g.first_tokens is None or text is None else text.text(g.first_tokens),
        blocks=g.blocks,
        tokens=g.tokens,
        shared_blocks=g.shared_blocks,
        points=[
            PrefixGroupPoint(
                offset_s=p.offset_s,
                blocks_back=p.blocks_back,
                hittable_back=p.hittable_back,
                shared_back=p.shared_back,
            )
            for p in g.points
        ],
        back_at_s=g.back_at_s,
        status=g.status,  # type: ignore[arg-type]
        orphans_left=g.orphans_left,
    )


def _orphan_out(o: ResetOrphan, signed: bool, roots: dict[Any, bytes | None]) -> ResetOrphanOut:
    root = o.group_root
    return ResetOrphanOut(
        medium=o.table.medium,
        group=o.table.group,
        hash=show_hash(o.hash, o.raw_hash, signed),
        parent=show_hash(o.parent, o.raw_parent, signed),
        stored_ts=o.stored_ts,
        rejoined_ts=o.rejoined_ts,
        removed_ts=o.removed_ts,
        group_root=None if root is None else show_hash(root, roots.get((o.table, root)), signed),
    )


def _evicted_out(o: ResetOrphan, signed: bool, roots: dict[Any, bytes | None]) -> EvictedOrphanOut:
    shown = _orphan_out(o, signed, roots)
    return EvictedOrphanOut(
        orphaned_ts=shown.stored_ts, **shown.model_dump(exclude={"stored_ts"}, by_alias=True)
    )


@router.get(
    "/resets/{reset_id}/prefixes",
    response_model=ResetPrefixesPage,
    responses=documented(404, 422),
)
def reset_prefixes(
    reset_id: Annotated[int, Path(ge=1, le=2**62)],
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    cursor: Annotated[
        str | None, Query(pattern=r"^[0-9]{1,20}$", description="From the previous page.")
    ] = None,
) -> ResetPrefixesPage:
    """The pre-reset cache as prefix groups (chains by their root block), largest first, each
    followed through the recovery offsets reached: blocks cached and hittable again, and when
    it was back (90 % of its shared blocks hittable again); and the orphans the reset left.
    Partial while the recovery is (`recovery_complete` false: the offsets so far)."""
    engine = ctx.data.engine
    if engine is None:
        raise ApiError(404, "no_store", "this API keeps no store: resets are not recorded")
    r, s = schema.resets, schema.streams
    with engine.connect() as conn:
        row = conn.execute(
            select(s.c.replica, s.c.rank).join(r, r.c.stream_id == s.c.id).where(r.c.id == reset_id)
        ).first()
        if row is None:
            raise ApiError(404, "unknown_reset", f"no reset {reset_id}")
        found = ctx.prefixes.get(conn, reset_id)
    start = 0 if cursor is None else int(cursor)
    groups = found.groups
    page = groups[start : start + limit]
    more = start + limit < len(groups)
    by_status = dict.fromkeys(STATUSES, 0)
    for g in groups:
        by_status[g.status] += g.tokens
    roots = {(g.table, g.root): g.raw_root for g in groups}
    return ResetPrefixesPage(
        reset_id=reset_id,
        replica=row.replica,
        rank=row.rank,
        ts=found.ts,
        offsets_reached=list(found.offsets),
        recovery_complete=found.complete,
        back_share=BACK_SHARE,
        groups_total=len(groups),
        blocks_total=sum(g.blocks for g in groups),
        tokens_total=sum(g.tokens for g in groups),
        tokens_by_status=by_status,
        items=[_group_out(g, found.signed, ctx.settings.token_text) for g in page],
        next_cursor=str(start + limit) if more else None,
        orphans_total=len(found.orphans),
        orphans=[_orphan_out(o, found.signed, roots) for o in found.orphans[:MAX_ORPHANS]],
        evicted_orphans_total=len(found.evicted_orphans),
        evicted_orphans=[
            _evicted_out(o, found.signed, roots) for o in found.evicted_orphans[:MAX_ORPHANS]
        ],
        followed_until_ts=found.followed_until_ts,
        unknown_because=list(found.unknown_because),
    )
