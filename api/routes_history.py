"""The cache's shape, what changed between two instants, and per-second series for panels."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from sqlalchemy import func, select

from kvscope.api.context import ApiContext, context
from kvscope.api.errors import ApiError, documented
from kvscope.api.routes_cache import streams_of
from kvscope.api.schemas import (
    DiffResponse,
    Prefix,
    Series,
    SeriesPoint,
    SeriesResponse,
    ShapeResponse,
    TableShape,
)
from kvscope.collector.dump import show_hash
from kvscope.collector.types import StreamId
from kvscope.storage import schema

router = APIRouter(tags=["history"])
Ctx = Annotated[ApiContext, Depends(context)]
Instant = Annotated[float | None, Query(ge=0, le=1e11, description="Unix seconds; omit: now.")]
Rank = Annotated[int, Query(ge=0, le=1_000_000)]
ROLLUP_METRICS = ("stored", "hittable", "orphans", "stores", "removes", "clears", "gaps")


def _bucket(depth: int) -> str:
    low = 1 << (depth.bit_length() - 1)
    return str(low) if low == 1 else f"{low}-{2 * low - 1}"


def _stream(ctx: ApiContext, replica: str, rank: int) -> StreamId:
    stream = StreamId(replica, rank)
    if stream not in streams_of(ctx, replica):
        raise ApiError(404, "unknown_rank", f"replica {replica!r} has no rank {rank}")
    return stream


@router.get(
    "/replicas/{replica}/prefixes", response_model=ShapeResponse, responses=documented(404, 422)
)
def prefixes(
    replica: str,
    ctx: Ctx,
    rank: Rank = 0,
    at: Instant = None,
    top: Annotated[int, Query(ge=1, le=1000)] = 10,
) -> ShapeResponse:
    """The shape of the cache: roots, chain lengths, the largest prefixes, orphan chains."""
    stream = _stream(ctx, replica, rank)
    with ctx.data.lock():
        view = ctx.data.map_now(stream) if at is None else ctx.data.map_at(stream, at)
        signed = view.map.counters.signed_hashes
        tables = []
        for key, table in sorted(
            view.map.tables.items(), key=lambda kv: (kv[0].medium, kv[0].group)
        ):
            trees = list(table.subtrees())
            lengths: dict[str, int] = {}
            for tree in trees:
                for depth in tree.leaf_depths:
                    lengths[_bucket(depth)] = lengths.get(_bucket(depth), 0) + 1
            roots = [t for t in trees if not t.orphan]
            largest = sorted(roots, key=lambda t: max(t.leaf_depths, default=0), reverse=True)[:top]
            tables.append(
                TableShape(
                    medium=key.medium,
                    group=key.group,
                    blocks=len(table),
                    roots=len(roots),
                    orphan_chains=len(trees) - len(roots),
                    orphan_chain_blocks=sum(t.blocks for t in trees if t.orphan),
                    chain_lengths=lengths,
                    largest_prefixes=[
                        Prefix(
                            blocks=max(t.leaf_depths, default=0),
                            tokens=max(t.leaf_depths, default=0) * table.block_size,
                            first_tokens=None
                            if (e := table.entry(t.head)).token_ids is None
                            else list(e.token_ids),
                            leaf=show_hash(t.deepest_leaf, table.raw_hash(t.deepest_leaf), signed),
                        )
                        for t in largest
                    ],
                )
            )
    return ShapeResponse(
        replica=replica,
        rank=rank,
        source="live" if view.source == "live" else "store",
        seq=view.seq,
        ts=view.ts,
        tables=tables,
    )


@router.get("/replicas/{replica}/diff", response_model=DiffResponse, responses=documented(404, 422))
def diff(
    replica: str,
    ctx: Ctx,
    from_: Annotated[float, Query(alias="from", ge=0, le=1e11)],
    to: Instant = None,
    rank: Rank = 0,
    limit: Annotated[int, Query(ge=0, le=10_000)] = 100,
) -> DiffResponse:
    """Blocks stored and removed between two instants (to: now when omitted)."""
    stream = _stream(ctx, replica, rank)
    if to is not None and to < from_:
        raise ApiError(422, "invalid", "`to` is before `from`", "to")
    before_view = ctx.data.map_at(stream, from_)
    before = {(h, k) for k, t in before_view.map.tables.items() for h in t.counts()}
    with ctx.data.lock():
        after_view = ctx.data.map_now(stream) if to is None else ctx.data.map_at(stream, to)
        after = {(h, k) for k, t in after_view.map.tables.items() for h in t.counts()}
        signed = after_view.map.counters.signed_hashes
    stored, removed = (
        sorted(after - before, key=lambda x: x[0]),
        sorted(before - after, key=lambda x: x[0]),
    )
    return DiffResponse(
        replica=replica,
        rank=rank,
        from_seq=before_view.seq,
        to_seq=after_view.seq,
        stored=len(stored),
        removed=len(removed),
        kept=len(after & before),
        stored_hashes=[show_hash(h, None, signed) for h, _ in stored[:limit]],
        removed_hashes=[show_hash(h, None, signed) for h, _ in removed[:limit]],
    )


@router.get(
    "/replicas/{replica}/series", response_model=SeriesResponse, responses=documented(404, 422)
)
def series(
    replica: str,
    ctx: Ctx,
    metric: Literal["stored", "hittable", "orphans", "stores", "removes", "clears", "gaps"],
    from_: Annotated[float | None, Query(alias="from", ge=0, le=1e11)] = None,
    to: Instant = None,
    step: Annotated[int, Query(ge=1, le=86_400)] = 10,
) -> SeriesResponse:
    """The per-second rollups, averaged (levels) or summed (counts) over `step` seconds."""
    if ctx.data.engine is None:
        raise ApiError(404, "no_store", "this API keeps no store: no series")
    streams_of(ctx, replica)
    r, s = schema.rollups, schema.streams
    column = r.c[metric]
    agg = func.avg(column) if metric in ("stored", "hittable", "orphans") else func.sum(column)
    # Integer division on both SQLite and PostgreSQL: (second - second % step).
    bucket = r.c.second - r.c.second % step
    query = (
        select(s.c.rank, r.c.medium, r.c.grp, bucket.label("t"), agg.label("value"))
        .join(s, s.c.id == r.c.stream_id)
        .where(s.c.replica == replica)
        .group_by(s.c.rank, r.c.medium, r.c.grp, bucket)
        .order_by(s.c.rank, r.c.medium, r.c.grp, bucket)
    )
    if from_ is not None:
        query = query.where(r.c.second >= from_)
    if to is not None:
        query = query.where(r.c.second <= to)
    out: dict[tuple[int, str, int], list[SeriesPoint]] = {}
    with ctx.data.engine.connect() as conn:
        for row in conn.execute(query):
            out.setdefault((row.rank, row.medium, row.grp), []).append(
                SeriesPoint(t=float(row[3]), value=float(row[4]))
            )
    return SeriesResponse(
        replica=replica,
        metric=metric,
        step=step,
        series=[Series(rank=k[0], medium=k[1], group=k[2], points=v) for k, v in out.items()],
    )
