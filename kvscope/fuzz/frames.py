"""Hostile messages, every class of issue 12, deterministic from a seed.

A `FrameFactory` makes one hostile message at a time for a stream whose next contiguous seq is
`next_seq`. What a message does to the stream's sequence is its `SeqRule`:
- `NEXT`: it carries the next seq (the honest batches after it shift by one, so the sequence
  stays contiguous): random bytes, truncations and byte flips of real payloads, structurally
  hostile batches.
- `NONE`: no seq is read from it (wrong frame counts, seq frames that are not 8 bytes).
- `BACK`, `JUMP`: a seq below what was applied (the collector sees a restart) or past the end
  of the whole run (a gap); the honest batches keep their seqs.
- `DUP`: the last seq again with its payload: a duplicate, dropped.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec

from kvscope.collector.capture import CaptureRecord
from kvscope.fuzz import structural
from kvscope.fuzz.structural import Event


class SeqRule(Enum):
    NEXT = "next"
    NONE = "none"
    BACK = "back"
    JUMP = "jump"
    DUP = "dup"


@dataclass(frozen=True, slots=True)
class Hostile:
    cls: str
    """The class counted in the summary (one of `CLASSES`)."""
    detail: str
    rule: SeqRule
    frames: list[bytes]
    """The whole message, its seq frame included."""


CLASSES: dict[str, int] = {
    "random_bytes": 10,
    "truncated": 14,
    "flipped": 18,
    "structural": 35,
    "frame_count": 6,
    "seq_length": 6,
    "seq_back": 4,
    "seq_jump": 3,
    "duplicate": 4,
}
"""Each class and its relative frequency."""
FRAME_COUNTS = (1, 2, 4, 300)
SEQ_LENGTHS = (0, 1, 4, 7, 9, 16, 1024)


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


class FrameFactory:
    """Makes hostile messages from a capture's payloads; `seed` decides every byte."""

    def __init__(
        self,
        records: Sequence[CaptureRecord],
        seed: int,
        jump_past: int,
        wide_seqs: bool = True,
        classes: Sequence[str] = (),
    ) -> None:
        """`jump_past`: a seq greater than any the run will reach (a jump goes beyond it).
        `wide_seqs`: jumps go to 2**63 and 2**64 - 1 too (valid on the wire: 8 unsigned bytes).
        `classes`: only these (default: all of `CLASSES`)."""
        unknown = set(classes) - set(CLASSES)
        if unknown:
            raise ValueError(f"unknown classes {sorted(unknown)}; known: {', '.join(CLASSES)}")
        self.rng = random.Random(seed)
        self.payloads = [r.payload for r in records]
        self.topic = records[0].topic if records else b""
        self.jump_past = jump_past
        self.jumps = (2**63, 2**64 - 1) if wide_seqs else ()
        sample = self.rng.sample(self.payloads, min(300, len(self.payloads)))
        decoder = msgspec.msgpack.Decoder()
        self.events: list[Event] = [
            e for p in sample for e in decoder.decode(p)[1] if isinstance(e, dict)
        ]
        self._classes = [c for c in CLASSES if not classes or c in classes]
        self._weights = [CLASSES[c] for c in self._classes]
        self._builders = list(structural.BUILDERS.items())
        self._builder_weights = [structural.WEIGHTS.get(n, 8) for n, _ in self._builders]

    def make(self, next_seq: int, last: tuple[int, bytes] | None) -> Hostile:
        """One hostile message for a stream at `next_seq`, whose last message with a seq was
        `last` (seq, payload); classes that need one fall back to another without it."""
        cls = self.rng.choices(self._classes, self._weights)[0]
        rng = self.rng
        if cls == "frame_count":
            n = rng.choice(FRAME_COUNTS)
            frames = [self.topic, _seq(next_seq), self._real()][:n]
            frames += [rng.randbytes(rng.randint(0, 16)) for _ in range(n - len(frames))]
            return Hostile(cls, f"{n} frames", SeqRule.NONE, frames)
        if cls == "seq_length":
            n = rng.choice(SEQ_LENGTHS)
            return Hostile(
                cls, f"{n}-byte seq", SeqRule.NONE, [self.topic, b"\0" * n, self._real()]
            )
        if cls == "duplicate" and last is not None:
            return Hostile(cls, "last seq again", SeqRule.DUP, [self.topic, _seq(last[0]), last[1]])
        if cls == "seq_back" and next_seq > 0:
            seq = rng.choice((0, next_seq - 1, rng.randrange(next_seq)))
            detail, payload = self._payload(rng.choice(("real", "flipped", "structural")))
            return Hostile(cls, f"seq {seq} ({detail})", SeqRule.BACK, self._message(seq, payload))
        if cls == "seq_jump":
            seq = rng.choice((self.jump_past + rng.randint(1, 1000), *self.jumps))
            detail, payload = self._payload(rng.choice(("real", "flipped", "structural")))
            return Hostile(cls, f"seq {seq} ({detail})", SeqRule.JUMP, self._message(seq, payload))
        if cls not in ("random_bytes", "truncated", "flipped"):
            cls = "structural"
        detail, payload = self._payload(cls)
        return Hostile(cls, detail, SeqRule.NEXT, self._message(next_seq, payload))

    # --- payloads -----------------------------------------------------------------------------
    def _message(self, seq: int, payload: bytes) -> list[bytes]:
        topic = self.topic if self.rng.random() < 0.9 else self.rng.randbytes(8)
        return [topic, _seq(seq), payload]

    def _real(self) -> bytes:
        return self.rng.choice(self.payloads)

    def _payload(self, kind: str) -> tuple[str, bytes]:
        rng = self.rng
        if kind == "real":
            return "a real payload", self._real()
        if kind == "random_bytes":
            n = rng.choice((0, 1, 2, 3, rng.randint(4, 64), rng.randint(64, 4096)))
            head = rng.choice((b"", b"\x93", b"\x93\xcb", b"\x92\xcb" + bytes(8)))
            return f"{n} random bytes", head + rng.randbytes(n)
        if kind == "truncated":
            real = self._real()
            cut = rng.randrange(len(real)) if real else 0
            return f"cut at {cut}/{len(real)}", real[:cut]
        if kind == "flipped":
            data = bytearray(self._real())
            flips = rng.choice((1, 1, 2, 4, 16))
            for _ in range(flips):
                at = rng.randrange(len(data))
                if rng.random() < 0.5:
                    data[at] ^= 1 << rng.randrange(8)
                else:
                    data[at] = rng.randrange(256)
            return f"{flips} flips", bytes(data)
        name, build = rng.choices(self._builders, self._builder_weights)[0]
        return name, build(rng, self.events)


def generic(payload: bytes) -> Any:
    """A payload decoded without a schema (for tests and reports)."""
    return msgspec.msgpack.decode(payload)
