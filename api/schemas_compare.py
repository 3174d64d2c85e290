"""GET /resets/compare's answer: the modes side by side (storage/mode_compare.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ResetFiguresOut(BaseModel):
    mode: str | None
    request_id: int | None
    reset_id: int | None = Field(description="None: the request made no clear (refused).")
    ts: float
    outcome: str | None
    refused: bool
    preempted: float | None = Field(description="vLLM's preemptions delta; None: not scraped.")
    tokens_recomputed: int | None = Field(
        description="Tokens of pre-reset blocks cached again at the last offset reached."
    )
    t50_s: float | None
    t90_s: float | None
    share_back_10s: float | None
    orphans: int | None
    hit_rate_before: float | None
    hit_rate_after: float | None
    ttft_p50_before: float | None
    ttft_p50_after: float | None


class ModeFiguresOut(BaseModel):
    mode: str
    resets: int
    refused: int
    medians: dict[str, float | None] = Field(description="Over the mode's resets that cleared.")


class ModeComparisonOut(BaseModel):
    replica: str
    from_ts: float | None
    to_ts: float | None
    resets: list[ResetFiguresOut]
    modes: list[ModeFiguresOut]
