"""The collector's closed set of input errors; each kind is a label on a counter."""

from __future__ import annotations

from enum import StrEnum


class MalformedKind(StrEnum):
    """Why a frame, payload or event was refused."""

    FRAME_COUNT = "frame_count"
    """A live message without exactly [topic, seq, payload] frames."""
    SEQ_LENGTH = "seq_length"
    """A seq frame that is not 8 bytes."""
    SEQ_BACK = "seq_back"
    """A seq that went back again within `ingest.MESSAGES_BETWEEN_RESTARTS` live messages of a
    restart: refused, not taken as yet another restart."""
    SEQ_RANGE = "seq_range"
    """A seq of 2^63 or more: vLLM's is a signed 64-bit count from 0 (and the store's too)."""
    OVERSIZE = "oversize"
    """A payload larger than the configured maximum."""
    UNDECODABLE = "undecodable_payload"
    """A payload that is not a msgpack `[ts, events, rank?]` batch (or nests too deep)."""
    BAD_BATCH = "bad_batch"
    """A batch whose ts is not a finite number or whose rank is not a small int."""
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    """An event whose tag is none of BlockStored, BlockRemoved, AllBlocksCleared (skipped)."""
    BAD_EVENT = "bad_event"
    """A known event with a field missing, mistyped or out of range (collector/wire_rules.py),
    or an event that is no map or array, or has no str type: its whole batch is refused."""
    LIMIT_EXCEEDED = "limit_exceeded"
    """A batch that would take a stream past one of its limits (collector/limits.py), named in
    the detail: refused whole."""
    BAD_REPLAY = "bad_replay"
    """A replay reply that is not [empty, (topic,) seq, payload]."""

    @property
    def loses_map_state(self) -> bool:
        """Whether dropping this input leaves the map unknown (a known change went missing)."""
        return self in (
            MalformedKind.UNDECODABLE,
            MalformedKind.BAD_BATCH,
            MalformedKind.BAD_EVENT,
            MalformedKind.LIMIT_EXCEEDED,
            MalformedKind.OVERSIZE,
        )


class MalformedPayload(Exception):
    """Input the collector refused; `kind` says which counter it goes to."""

    def __init__(self, kind: MalformedKind, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
