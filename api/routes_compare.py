"""The reset modes side by side: GET /resets/compare (computed in storage/mode_compare.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from kvscope.api.context import ApiContext, context
from kvscope.api.errors import ApiError, documented
from kvscope.storage.mode_compare import ModeComparison, compare_modes

router = APIRouter(tags=["resets"])
Ctx = Annotated[ApiContext, Depends(context)]


@router.get("/resets/compare", response_model=ModeComparison, responses=documented(404, 422))
def resets_compare(
    ctx: Ctx,
    replica: Annotated[str, Query(min_length=1, max_length=200)],
    from_: Annotated[float | None, Query(alias="from")] = None,
    to: Annotated[float | None, Query()] = None,
) -> ModeComparison:
    """A replica's resets by mode under the same load: refused or not, preemptions, tokens
    recomputed, t50/t90, share of prefixes back at +10 s, orphans, and vLLM's hit rate and
    TTFT p50 before vs after; per reset and as medians per mode."""
    engine = ctx.data.engine
    if engine is None:
        raise ApiError(404, "no_store", "this API keeps no store: resets are not recorded")
    with engine.connect() as conn:
        return compare_modes(conn, replica, from_, to, ctx.settings.link_window_s)
