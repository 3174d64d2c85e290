"""The two streams of a fuzz run, message by message, and what the collector must end with.

`honest` is the capture as recorded. `hostile` is the same batches with hostile messages
interleaved (kvscope/fuzz/frames.py): the ones that carry a seq take the next one, so the
sequence stays contiguous. Both are followed offline, as they are sent, by a `StreamIngest`
without sockets (the oracle of the same frames), and the honest one is also the capture alone.

A hostile message that carries a well-formed seq *taints* the hostile map: from there it is not
known to equal the honest one until the capture's next `AllBlocksCleared`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvscope.collector.capture import CaptureRecord
from kvscope.collector.dump import show_hash
from kvscope.collector.errors import MalformedPayload
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.playback import play_into
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.types import AllCleared, StreamId
from kvscope.collector.wire import BatchDecoder
from kvscope.fuzz.frames import FrameFactory, Hostile, SeqRule

HONEST, HOSTILE = "honest", "hostile"
MapRows = list[tuple[Any, ...]]


class Side(Enum):
    HONEST = HONEST
    HOSTILE = HOSTILE


@dataclass
class Tally:
    """What was sent, and where the last taint fell."""

    sent: Counter[str] = field(default_factory=Counter)
    """Hostile messages by class."""
    honest_messages: int = 0
    hostile_bytes: int = 0
    last_taint_before: int | None = None
    """Index of the honest record the last tainting hostile message came before."""
    accepted_after_last_clear: int = 0
    """Tainting messages after the last clear that the oracle applied without a complaint:
    valid batches (a flip that still decodes), which no collector can tell from honest ones."""
    hostile_last_seq: int = -1
    honest_last_seq: int = -1


def last_clear_index(records: Sequence[CaptureRecord]) -> int | None:
    """Index of the last record whose batch holds an `AllBlocksCleared`."""
    decoder, found = BatchDecoder(), None
    for i, record in enumerate(records):
        try:
            batch = decoder.decode(record.payload, record.seq)
        except MalformedPayload:
            continue
        if any(type(e) is AllCleared for e in batch.events):
            found = i
    return found


def map_rows(prefix_map: PrefixMap) -> MapRows:
    """The map as `GET /replicas/{r}/blocks` shows it, one sorted row per (hash, table)."""
    signed = prefix_map.counters.signed_hashes
    rows = []
    for key, table in prefix_map.tables.items():
        for e in table.entries():
            parent = (
                None if e.parent is None else show_hash(e.parent, table.raw_parent(e.hash), signed)
            )
            tokens = None if e.token_ids is None else tuple(e.token_ids)
            rows.append(
                (
                    show_hash(e.hash, e.raw_hash, signed),
                    key.medium,
                    key.group,
                    e.count,
                    parent,
                    e.hittable,
                    table.block_size,
                    tokens,
                    e.lora_name,
                    e.first_stored,
                    e.last_stored,
                )
            )
    return sorted(rows, key=repr)


def api_rows(items: list[dict[str, Any]]) -> MapRows:
    rows = [
        (
            i["hash"],
            i["medium"],
            i["group"],
            i["count"],
            i["parent"],
            i["hittable"],
            i["block_size"],
            None if i["token_ids"] is None else tuple(i["token_ids"]),
            i["lora_name"],
            i["first_stored"],
            i["last_stored"],
        )
        for i in items
    ]
    return sorted(rows, key=repr)


def honest_oracle(records: Sequence[CaptureRecord]) -> StreamIngest:
    """The capture alone, replayed offline."""
    ingest = StreamIngest(StreamId(HONEST, 0), can_replay=False)
    play_into(ingest, records)
    return ingest


class Interleaving:
    """The messages of both streams in send order; the hostile oracle follows them."""

    def __init__(
        self,
        records: Sequence[CaptureRecord],
        frames: int,
        seed: int,
        until_last_clear: bool = False,
        wide_seqs: bool = True,
        classes: Sequence[str] = (),
    ) -> None:
        if len(records) < 2:
            raise ValueError("the capture needs at least two records")
        self.records = records
        self.last_clear = last_clear_index(records)
        last = len(records) - 1
        if until_last_clear:
            if self.last_clear is None:
                raise ValueError("the capture has no AllBlocksCleared")
            last = self.last_clear
        rng = random.Random(seed)
        # Before honest record i (never before the first: a stream starts as recorded).
        self.before = Counter(rng.randint(1, last) for _ in range(frames))
        jump_past = len(records) + frames + 1
        self.factory = FrameFactory(records, rng.getrandbits(64), jump_past, wide_seqs, classes)
        self.oracle = StreamIngest(StreamId(HOSTILE, 0), can_replay=False)
        self.tally = Tally()
        self._clock = 0.0

    def messages(self) -> Iterator[tuple[Side, list[bytes], int | None]]:
        """(side, frames, seq): `seq` is given for honest messages on both sides, the seq the
        collector must show as its last once it has read up to there (a point to sync at)."""
        tally, next_seq = self.tally, 0
        last: tuple[int, bytes] | None = None
        jumped = False  # a BACK or JUMP since the last seq taken: a DUP is no duplicate then
        for i, record in enumerate(self.records):
            for _ in range(self.before[i]):
                hostile = self.factory.make(next_seq, last)
                rule = hostile.rule
                if rule is SeqRule.NEXT:
                    last, next_seq, jumped = (next_seq, hostile.frames[2]), next_seq + 1, False
                elif rule is SeqRule.BACK or rule is SeqRule.JUMP:
                    jumped = True
                taints = rule in (SeqRule.NEXT, SeqRule.BACK, SeqRule.JUMP) or (
                    rule is SeqRule.DUP and jumped
                )
                self._follow(hostile, i, taints)
                yield Side.HOSTILE, hostile.frames, None
            tally.honest_messages += 1
            tally.honest_last_seq = record.seq
            yield Side.HONEST, record.frames, record.seq
            frames = [record.topic, next_seq.to_bytes(8, "big"), record.payload]
            last, jumped = (next_seq, record.payload), False
            tally.hostile_last_seq = next_seq
            next_seq += 1
            self._feed(frames)
            yield Side.HOSTILE, frames, tally.hostile_last_seq

    def _follow(self, hostile: Hostile, before: int, taints: bool) -> None:
        tally = self.tally
        tally.sent[hostile.cls] += 1
        tally.hostile_bytes += sum(map(len, hostile.frames))
        counters = self.oracle.counters
        applied, malformed = counters.batches_applied, counters.malformed.total()
        self._feed(hostile.frames)
        if taints:
            tally.last_taint_before = before
            if (
                self.last_clear is not None
                and before > self.last_clear
                and counters.batches_applied > applied
                and counters.malformed.total() == malformed
            ):
                tally.accepted_after_last_clear += 1

    def _feed(self, frames: list[bytes]) -> None:
        self._clock += 0.001
        self.oracle.live_frames(frames, self._clock)

    @property
    def clean_end(self) -> bool:
        """Whether every taint came before the capture's last clear: the hostile map must then
        equal the honest one at the end, and be known."""
        last_taint = self.tally.last_taint_before
        return last_taint is None or (self.last_clear is not None and last_taint <= self.last_clear)
