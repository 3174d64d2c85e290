"""vLLM's replay socket as the ingest sees it: the request, the replies' layouts, the replay in
flight (what it asked for, and the live batches held until it ends)."""

from __future__ import annotations

from dataclasses import dataclass, field

SEQ_BYTES = 8
END_SEQ = b"\xff" * SEQ_BYTES
"""The seq frame of a replay's end marker."""
MAX_HELD_LIVE = 100_000
"""Live batches held while a replay runs; past this the replay is abandoned."""
MAX_HELD_BYTES = 256 * 1024 * 1024
"""Their payloads' bytes: the same, for a publisher whose batches are large."""


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """Ask the publisher's replay socket for every buffered batch from `start_seq` on."""

    start_seq: int


@dataclass
class Replay:
    """A replay in flight."""

    start_seq: int
    deadline: float
    epoch: int = 0
    held: list[tuple[int, bytes]] = field(default_factory=list)
    """(seq, payload) of the live batches that arrived meanwhile, in arrival order."""
    held_bytes: int = 0
    received: int = 0
    verify_seq: int | None = None
    """The seq of our last applied batch, whose payload the replay must repeat exactly."""
    tail: bool = False
    """Asked only to check that nothing was lost at the end of a silent stream."""


def reply_parts(frames: list[bytes]) -> tuple[bytes, bytes] | None:
    """(seq frame, payload) of one reply: `[b"", topic, seq, payload]` (vLLM >= 0.26) or
    `[b"", seq, payload]` (older); None for any other layout."""
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        return frames[1], frames[2]
    if len(frames) == 2:
        return frames[0], frames[1]
    return None


def can_hold(replay: Replay, payload: bytes) -> bool:
    """Whether one more live batch fits beside those the replay holds already."""
    return len(replay.held) < MAX_HELD_LIVE and replay.held_bytes + len(payload) <= MAX_HELD_BYTES


def hold(replay: Replay, batches: list[tuple[int, bytes]]) -> None:
    replay.held.extend(batches)
    replay.held_bytes += sum(len(p) for _, p in batches)
