"""The cache now and at any instant: replicas, blocks, and the longest cached prefix."""

from __future__ import annotations

import heapq
from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Depends, Query, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from kvscope.api.context import ApiContext, context
from kvscope.api.errors import ONLY_IN_STORE, ApiError, documented
from kvscope.api.schemas import (
    Block,
    BlockPage,
    DegradedInfo,
    LookupRequest,
    LookupResponse,
    RankStatus,
    ReplicaStatus,
    UnavailableRank,
    table_statuses,
)
from kvscope.api.schemas_lease import LeaseInfo
from kvscope.collector.block_table import BlockTable
from kvscope.collector.dump import show_hash
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import PrefixMatch
from kvscope.collector.subscriber import Collector
from kvscope.collector.token_query import TokenQuery
from kvscope.collector.types import StreamId, TableKey
from kvscope.storage.engine import store_down
from kvscope.storage.leases import Lease, leases

router = APIRouter(tags=["cache"])
Ctx = Annotated[ApiContext, Depends(context)]
NOT_FOUND = documented(404, 422)


def streams_of(ctx: ApiContext, replica: str) -> list[StreamId]:
    streams = ctx.data.replica_streams(replica)
    if not streams:
        raise ApiError(404, "unknown_replica", f"no replica named {replica!r}")
    return streams


def _rank_status(ctx: ApiContext, stream: StreamId) -> RankStatus:
    """Where the rank's map stands (live or rebuilt from the store), with the live stream's
    own state when the collector follows it."""
    collector = ctx.data.collector
    with ctx.data.lock():
        view = ctx.data.map_now(stream)
        totals = view.map.totals()
        ingest = None if collector is None else collector.ingests.get(stream)
        status = RankStatus(
            rank=stream.rank,
            source="store" if ingest is None else "live",
            connected=None,
            silent=None,
            epoch=view.epoch,
            last_seq=view.seq,
            last_batch_ts=view.ts,
            age_s=view.age_s,
            engine_clock_offset_s=None,
            degraded=None,
            degraded_intervals=len(view.unknown_because),
            gaps=None,
            replays_ok=None,
            replays_failed=None,
            restarts=None,
            blocks=totals.blocks,
            hittable=totals.hittable,
            orphans=totals.orphans,
            tables=table_statuses(view.map.stats()),
        )
        if collector is not None and ingest is not None:
            _live_state(ctx, collector, ingest, status)
    return status


def _live_state(
    ctx: ApiContext, collector: Collector, ingest: StreamIngest, status: RankStatus
) -> None:
    """The followed stream's connection, counters and degraded state onto `status`."""
    stream, c, d = ingest.stream, ingest.counters, ingest.degraded
    received, batch_ts = ingest.last_message_at, ingest.map.counters.last_ts
    status.connected = collector.is_connected(stream)
    status.silent = collector.is_silent(stream)
    status.gone = collector.is_gone(stream)
    status.engine = ingest.engine
    status.age_s = None if received is None else max(0.0, ctx.data.clock() - received)
    status.engine_clock_offset_s = (
        None if received is None or batch_ts is None else received - batch_ts
    )
    status.degraded = (
        None
        if d is None
        else DegradedInfo(reason=d.reason, from_seq=d.from_seq, to_seq=d.to_seq, since=d.since)
    )
    status.degraded_intervals = len(ingest.degraded_history)
    status.tail_unverified = ingest.tail_unverified(ctx.data.clock())
    status.ingest_errors = sum(c.ingest_errors.values())
    status.gaps, status.restarts = c.gaps, c.restarts
    status.replays_ok, status.replays_failed = c.replays_ok, c.replays_failed


def _statuses(ctx: ApiContext, streams: list[StreamId]) -> list[ReplicaStatus]:
    """The replicas of `streams`. While the store does not answer, a rank only it knows is
    listed as unavailable, unless no rank at all can be answered: then the store's error is
    raised (503)."""
    by_replica: dict[str, ReplicaStatus] = {}
    store_error: Exception | None = None
    held = _leases(ctx)
    for stream in streams:
        status = by_replica.setdefault(
            stream.replica, ReplicaStatus(replica=stream.replica, ranks=[])
        )
        try:
            status.ranks.append(_rank_status(ctx, stream))
            lease = held.get(stream)
            if lease is not None:
                status.ranks[-1].lease = LeaseInfo(
                    owner=lease.owner, token=lease.token, live=lease.live
                )
        except Exception as exc:
            if not store_down(exc):
                raise
            store_error = exc
            status.unavailable.append(UnavailableRank(rank=stream.rank, reason=ONLY_IN_STORE))
    if store_error is not None and not any(s.ranks for s in by_replica.values()):
        raise store_error
    return list(by_replica.values())


def _leases(ctx: ApiContext) -> dict[StreamId, Lease]:
    """The streams' leases, where collectors share a PostgreSQL store by lease; none while
    the store does not answer (the rest of the answer does not need them)."""
    engine = ctx.data.engine
    if engine is None or engine.dialect.name != "postgresql":
        return {}
    try:
        with engine.connect() as conn:
            return leases(conn)
    except SQLAlchemyError:
        return {}


@router.get("/replicas", response_model=list[ReplicaStatus])
def list_replicas(ctx: Ctx) -> list[ReplicaStatus]:
    """Every replica with its ranks: connection, epoch, seq, lag, degraded, blocks per tier."""
    return _statuses(ctx, ctx.data.streams())


@router.get("/replicas/{replica}", response_model=ReplicaStatus, responses=NOT_FOUND)
def get_replica(replica: str, ctx: Ctx) -> ReplicaStatus:
    (status,) = _statuses(ctx, streams_of(ctx, replica))
    return status


@router.get("/replicas/{replica}/blocks", response_model=BlockPage, responses=NOT_FOUND)
def list_blocks(
    replica: str,
    ctx: Ctx,
    rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    at: Annotated[
        float | None, Query(ge=0, le=1e11, description="Unix seconds; omit for now.")
    ] = None,
    tier: Annotated[Literal["GPU", "CPU", "STORAGE"] | None, Query()] = None,
    group: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    cursor: Annotated[
        str | None,
        Query(
            pattern=r"^[0-9]{1,20}(\.[A-Za-z0-9_:-]{1,64}\.[0-9]{1,7})?$",
            description="From the previous page: the last entry's hash, tier and group.",
        ),
    ] = None,
) -> BlockPage:
    """The map now or at any instant, ordered by hash, a page at a time."""
    stream = StreamId(replica, rank)
    if stream not in streams_of(ctx, replica):
        raise ApiError(404, "unknown_rank", f"replica {replica!r} has no rank {rank}")
    after = _after(cursor)
    with ctx.data.lock():
        view = ctx.data.map_now(stream) if at is None else ctx.data.map_at(stream, at)
        signed = view.map.counters.signed_hashes
        chosen: list[tuple[int, TableKey, BlockTable]] = []
        for key, table in view.map.tables.items():
            if (tier is not None and key.medium != tier) or (
                group is not None and key.group != group
            ):
                continue
            # Entries sort by (hash, tier, group): a table after the cursor's own takes the
            # cursor's hash too (the same block cached in two tiers).
            lo = after[0] if (key.medium, key.group) > after[1:] else after[0] + 1
            hashes = heapq.nsmallest(limit + 1, (h for h in table.counts() if h >= lo))
            chosen.extend((h, key, table) for h in hashes)
        chosen.sort(key=lambda item: (item[0], item[1].medium, item[1].group))
        page, more = chosen[:limit], len(chosen) > limit
        items = []
        for block_hash, key, table in page:
            entry = table.entry(block_hash)
            items.append(
                Block(
                    hash=show_hash(entry.hash, entry.raw_hash, signed),
                    medium=key.medium,
                    group=key.group,
                    count=entry.count,
                    parent=None
                    if entry.parent is None
                    else show_hash(entry.parent, table.raw_parent(block_hash), signed),
                    hittable=entry.hittable,
                    block_size=table.block_size,
                    token_ids=None if entry.token_ids is None else list(entry.token_ids),
                    lora_name=entry.lora_name,
                    first_stored=entry.first_stored,
                    last_stored=entry.last_stored,
                )
            )
    return BlockPage(
        replica=replica,
        rank=rank,
        source="live" if view.source == "live" else "store",
        epoch=view.epoch,
        seq=view.seq,
        ts=view.ts,
        unknown_because=view.unknown_because,
        items=items,
        next_cursor=f"{page[-1][0]}.{page[-1][1].medium}.{page[-1][1].group}"
        if more and page
        else None,
    )


def _after(cursor: str | None) -> tuple[int, str, int]:
    """The (hash, tier, group) a page starts after; a bare hash (older cursors) means after
    every entry of that hash."""
    if cursor is None:
        return (-1, "", -1)
    block_hash, _, rest = cursor.partition(".")
    if not rest:
        return (int(block_hash), "\U0010ffff", 2**31)
    medium, _, group = rest.rpartition(".")
    return (int(block_hash), medium, int(group))


@router.post("/lookup", response_model=LookupResponse, responses=NOT_FOUND)
async def lookup(body: LookupRequest, ctx: Ctx) -> Response:
    """For each replica, rank and tier: the longest cached prefix of these tokens.

    Found by matching block contents along cached parents from block 0 (vLLM's hash is not
    recomputed), so a match is what a prefix-cache lookup on that replica would hit.
    """
    tokens = TokenQuery(body.token_ids)  # shared by every table of every replica
    # In the event loop when nothing has to be waited for: the pass over every replica takes
    # less than a hop to a worker thread and back, whose two GIL hand-offs each wait while other
    # threads run (benchmarks/api.py). Else (ingest holds the maps, the store is to be read) in one.
    answer = _lookup(ctx, tokens, body.lora_name, wait=False)
    if answer is None:
        answer = await run_in_threadpool(_lookup, ctx, tokens, body.lora_name, True)
    assert answer is not None  # with wait=True there is always one
    return answer


def _lookup(ctx: ApiContext, tokens: TokenQuery, lora: str | None, wait: bool) -> Response | None:
    """The answer; None, without `wait`, where it would wait for ingest or read the store."""
    streams = ctx.data.streams() if wait else ctx.data.streams_unless_due()
    if streams is None:
        return None
    found: list[list[PrefixMatch] | None] = [None] * len(streams)
    # One pass over the live maps under one lock: taking it per replica made a request wait
    # for it up to 100 times while ingest and other requests wanted it too.
    with ctx.data.lock(wait) as held:
        if not held:
            return None
        for i, stream in enumerate(streams):
            live = ctx.data.live_map(stream)
            if live is not None:
                found[i] = live.longest_prefix(tokens, lora)
            elif not wait:
                return None  # known to the store only: its map is read from the store
    # LookupResponse's JSON from plain dicts: a LookupMatch model per match costs as much as
    # the walks themselves.
    matches: list[dict[str, str | int | bool]] = []
    best: dict[str, str | int | bool] | None = None
    best_key = (0, True)  # the first match with the most tokens, on the GPU if tied; none if 0
    unavailable: list[dict[str, str | int]] = []
    store_error: Exception | None = None
    searched = 0
    for stream, prefixes in zip(streams, found, strict=True):
        if prefixes is None:
            try:  # rebuilt from the store, not shared with ingest: no lock
                prefixes = ctx.data.map_now(stream).map.longest_prefix(tokens, lora)
            except LookupError:
                continue
            except Exception as exc:
                if not store_down(exc):
                    raise
                store_error = exc
                unavailable.append(
                    {"replica": stream.replica, "rank": stream.rank, "reason": ONLY_IN_STORE}
                )
                continue
        searched += 1
        for m in prefixes:
            match: dict[str, str | int | bool] = {
                "replica": stream.replica,
                "rank": stream.rank,
                "medium": m.table.medium,
                "group": m.table.group,
                "blocks": m.blocks,
                "tokens": m.tokens,
                "hittable": m.blocks > 0,
            }
            matches.append(match)
            if (key := (m.tokens, m.table.medium == "GPU")) > best_key:
                best, best_key = match, key
    if store_error is not None and searched == 0:
        raise store_error  # nothing could be searched: the store's error (503)
    body = {"matches": matches, "best": best, "unavailable": unavailable}
    return Response(msgspec.json.encode(body), media_type="application/json")
