"""What a stream's ingest counts: the live view, /metrics and GET /replicas read it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class StreamCounters:
    """Slots, not a dict: the live path (collector/_ingest_live.pyx) counts each batch in C,
    where a slot is read and written for less than a dict's entry."""

    batches_applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    missing_batches: int = 0
    replays_requested: int = 0
    replays_ok: int = 0
    replays_failed: int = 0
    restarts: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    """Refused input by kind (`MalformedKind` values)."""
    rank_mismatches: int = 0
    ingest_errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Messages whose handling raised, by (stage, exception type): each marked the map
    unknown, and the stream went on."""
    tail_checks: int = 0
    """Replays asked for after a silence, to find batches lost at the end of the stream."""
