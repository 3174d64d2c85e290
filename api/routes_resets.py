"""Resets: what the store kept of each (before and recovery), and asking a replica for one."""

from __future__ import annotations

import hmac
import logging
import time
from typing import Annotated, Any, Literal

import httpx
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from sqlalchemy import Row, Select, insert, select

from kvscope.api.context import ApiContext, context
from kvscope.api.errors import ApiError, documented
from kvscope.api.schemas import (
    RecoveryPointOut,
    ResetDetail,
    ResetOut,
    ResetRequestOut,
    table_statuses,
)
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.snapshot import decode_tables
from kvscope.storage import schema
from kvscope.storage.engine import store_down
from kvscope.storage.redact import redact
from kvscope.storage.reset_links import linked_mode, linked_request, load_requests, resets_query

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger, interval_s=60.0)
router = APIRouter(tags=["resets"])
Ctx = Annotated[ApiContext, Depends(context)]
ERRORS = documented(400, 401, 403, 404, 422)
Mode = Literal["default", "preempt", "keep"]


def _engine(ctx: ApiContext) -> Any:
    if ctx.data.engine is None:
        raise ApiError(404, "no_store", "this API keeps no store: resets are not recorded")
    return ctx.data.engine


def _request_out(row: Row[Any]) -> ResetRequestOut:
    return ResetRequestOut(
        id=row.id,
        replica=row.replica,
        requested_at=row.requested_at,
        requested_by=row.requested_by,
        mode=row.mode,
        external=row.external,
        outcome=row.outcome,
        http_status=row.http_status,
        detail=row.detail,
    )


def _offsets_reached(conn: Any, resets: Select[Any]) -> dict[int, list[float]]:
    """reset id -> the offsets of its stored recovery points, in order, for the resets that
    `resets` (a `resets_query`) lists."""
    rr = schema.reset_recovery
    ids = resets.with_only_columns(schema.resets.c.id).order_by(None)
    query = (
        select(rr.c.reset_id, rr.c.offset_s)
        .where(rr.c.reset_id.in_(ids))
        .order_by(rr.c.reset_id, rr.c.offset_s)
    )
    by: dict[int, list[float]] = {}
    for rid, offset in conn.execute(query):
        by.setdefault(int(rid), []).append(float(offset))
    return by


def _reset_out(
    row: Row[Any], request: Row[Any] | None, offsets: dict[int, list[float]]
) -> dict[str, Any]:
    return {
        "id": row.id,
        "replica": row.replica,
        "rank": row.rank,
        "epoch": row.epoch,
        "seq": row.seq,
        "ts": row.ts,
        "reason": row.reason,
        "mode": linked_mode(row.mode, request),
        "degraded": row.degraded,
        "before_blocks": row.before_blocks,
        "before_hittable": row.before_hittable,
        "before_orphans": row.before_orphans,
        "before_tokens": row.before_tokens,
        "t50_s": row.t50_s,
        "t90_s": row.t90_s,
        "peak_orphans": row.peak_orphans,
        "recovery_complete": bool(row.recovery_complete),
        "recovery_until_ts": row.recovery_until_ts,
        "offsets_reached": offsets.get(row.id, []),
        "request": None if request is None else _request_out(request),
    }


@router.get("/resets", response_model=list[ResetOut], responses=ERRORS)
def list_resets(
    ctx: Ctx,
    replica: str | None = None,
    from_: Annotated[float | None, Query(alias="from", ge=0, le=1e11)] = None,
    to: Annotated[float | None, Query(ge=0, le=1e11)] = None,
) -> list[ResetOut]:
    """Each reset (a clear, or a restart) with its before and recovery summary."""
    r, s = schema.resets, schema.streams
    query = resets_query().order_by(r.c.ts)
    if replica is not None:
        query = query.where(s.c.replica == replica)
    if from_ is not None:
        query = query.where(r.c.ts >= from_)
    if to is not None:
        query = query.where(r.c.ts <= to)
    with _engine(ctx).connect() as conn:
        rows = conn.execute(query).all()
        requests = load_requests(conn)
        offsets = _offsets_reached(conn, query)
    window = ctx.settings.link_window_s
    return [
        ResetOut(**_reset_out(row, linked_request(row, requests, window), offsets)) for row in rows
    ]


@router.get("/resets/{reset_id}", response_model=ResetDetail, responses=ERRORS)
def get_reset(reset_id: Annotated[int, Path(ge=1, le=2**62)], ctx: Ctx) -> ResetDetail:
    """One reset: the map just before it, per tier, and its recovery series."""
    r = schema.resets
    with _engine(ctx).connect() as conn:
        row = conn.execute(resets_query().where(r.c.id == reset_id)).first()
        if row is None:
            raise ApiError(404, "unknown_reset", f"no reset {reset_id}")
        before = conn.execute(select(r.c.before).where(r.c.id == reset_id)).scalar_one()
        points = conn.execute(
            select(schema.reset_recovery)
            .where(schema.reset_recovery.c.reset_id == reset_id)
            .order_by(schema.reset_recovery.c.offset_s)
        ).all()
        requests = load_requests(conn, row.replica)
    tables, _ = decode_tables(before)
    return ResetDetail(
        **_reset_out(
            row,
            linked_request(row, requests, ctx.settings.link_window_s),
            {reset_id: [p.offset_s for p in points]},
        ),
        before_tables=table_statuses({key: table.stats() for key, table in tables.items()}),
        recovery=[
            RecoveryPointOut(
                offset_s=p.offset_s,
                blocks=p.blocks,
                hittable=p.hittable,
                orphans=p.orphans,
                share_blocks_back=p.share_blocks_back,
                share_tokens_back=p.share_tokens_back,
            )
            for p in points
        ],
    )


def _authorize(ctx: ApiContext, authorization: str | None) -> None:
    token = ctx.settings.api_token
    if token is None:
        raise ApiError(403, "disabled", "mutating endpoints are disabled: no api_token configured")
    scheme, _, given = (authorization or "").partition(" ")
    # In constant time: how long a refusal takes says nothing of how much of the token matched.
    matches = hmac.compare_digest(given.encode(), token.encode())
    if scheme.lower() != "bearer" or not given or not matches:
        raise ApiError(401, "unauthorized", "a valid bearer token is needed")


@router.post("/replicas/{replica}/reset", response_model=ResetRequestOut, responses=ERRORS)
async def reset_replica(
    replica: str,
    request: Request,
    ctx: Ctx,
    mode: Annotated[list[Mode], Query(description="default, preempt or keep.")] = ["default"],  # noqa: B006
    external: bool = False,
    authorization: Annotated[str | None, Header()] = None,
) -> ResetRequestOut:
    """Ask the replica's vLLM (POST /reset_prefix_cache, dev mode) to reset; record it.

    preempt sends `reset_running_requests=true`; keep sends the proposed
    `keep_running_requests=true`; vLLM rejects the two together, and so does this endpoint.
    The AllBlocksCleared that follows (at the engine's next step) is linked to this request.
    """
    _authorize(ctx, authorization)
    modes = set(mode)
    if len(modes) != 1:
        raise ApiError(
            400, "bad_request", "one mode at a time: keep with preempt is refused by vLLM", "mode"
        )
    chosen = modes.pop()
    base = ctx.settings.replica_urls.get(replica)
    if base is None:
        raise ApiError(404, "unknown_replica", f"no API URL configured for replica {replica!r}")
    params = {"reset_external": "true"} if external else {}
    if chosen == "preempt":
        params["reset_running_requests"] = "true"
    elif chosen == "keep":
        params["keep_running_requests"] = "true"
    requested_at = time.time()
    outcome, status, detail = await _call(
        base.rstrip("/") + "/reset_prefix_cache", params, ctx.settings.reset_timeout_s
    )
    record = ResetRequestOut(
        id=0,
        replica=replica,
        requested_at=requested_at,
        requested_by=f"token@{request.client.host if request.client else 'unknown'}",
        mode=chosen,
        external=external,
        outcome=outcome,
        http_status=status,
        detail=detail,
    )
    ctx.reset_counter.labels(replica, chosen, outcome).inc()
    if ctx.data.engine is not None:
        try:
            with ctx.data.engine.begin() as conn:
                t = schema.reset_requests
                values = record.model_dump(exclude={"id", "recorded"})
                inserted = conn.execute(insert(t).values(**values).returning(t.c.id))
                record.id = int(inserted.scalar_one())
        except Exception as exc:
            # The replica was asked all the same: its answer is the answer (a 503 would invite
            # a retry, a second reset), said to be unrecorded.
            if not store_down(exc):
                raise
            kind = type(exc).__name__
            _log.warning(
                "record", "reset request not recorded: the store does not answer (%s)", kind
            )
            record.recorded = False
    return record


async def _call(url: str, params: dict[str, str], timeout: float) -> tuple[str, int | None, str]:
    """The outcome, vLLM's status and what it said. The detail is stored and served: the URL's
    password (and any in the error's text) is masked."""
    shown = redact(url)
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            response = await client.post(url, params=params)
    except httpx.TimeoutException:
        return "timeout", None, f"no answer from {shown} in {timeout:.0f}s"
    except httpx.HTTPError as exc:
        return "unreachable", None, redact(f"{shown}: {exc}")[:400]
    if response.status_code != 200:
        return "http_error", response.status_code, response.text[:400]
    if not response.content:
        return "success", 200, "empty body (vLLM < 0.26 does not say)"
    try:
        success = response.json().get("success")
    except ValueError:
        return "http_error", 200, "not JSON: " + response.text[:300]
    return ("success" if success else "refused"), 200, response.text[:400]
