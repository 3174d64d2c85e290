"""A stream's apply (`_apply`): nearly every batch decoded and applied in one pass over its
bytes (collector/_replay.pyx's `FusedApply`), the rest left to decode + apply (collector/ingest.py's
`_apply_decoded`), and the sink told of each batch applied (`_tell_applied`, which the fused
path repeats inline).

A part of `StreamIngest` (collector/ingest.py), which supplies the state it reads; split off to
keep each file to one concern.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvscope.collector._replay import FusedApply
from kvscope.collector.degraded import Degradation
from kvscope.collector.engine_kind import Engine
from kvscope.collector.errors import MalformedKind
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.recent import KEPT_BYTES, RecentBatches, kept
from kvscope.collector.sink import AppliedBatch, EventSink, Span
from kvscope.collector.stream_counters import StreamCounters
from kvscope.collector.types import Batch, StreamId, TableKey
from kvscope.collector.wire import MAP_LAYOUT, BatchDecoder


class FusedIngest:
    stream: StreamId
    sink: EventSink | None
    map: PrefixMap
    decoder: BatchDecoder
    counters: StreamCounters
    epoch: int
    _degradation: Degradation
    _quiet: Span
    """Stamps before which the sink needs no `instant` call (what its last one returned)."""
    _gaps_told: int
    """`counters.gaps` as the sink was last told it."""
    expected: int | None
    last_seq: int | None
    max_message_bytes: int
    engine: Engine | None
    _recent: RecentBatches
    _malformed: Callable[[MalformedKind, int | None, str], None]

    fused: FusedApply | None = FusedApply()
    """Applies the usual batch straight from its bytes, for every stream (a class attribute:
    one more instance attribute, past CPython 3.11's 30 shared keys, slows each attribute read
    of the ingest); None on a stream: its every batch decoded."""

    def _apply(
        self, seq: int, payload: bytes, now: float, decoded: Batch | FusedApply | None = None
    ) -> None:
        """Apply the batch `seq` (its seq known good). `decoded`: the batch as the fleet's
        router decoded or read it. For a stream whose engine is told already, decoded and
        applied in one pass over its bytes (`FusedApply`) where it can be, else left to
        `_apply_decoded`. A sink is told as `_apply_decoded` tells it: `instant` before the
        map changes, when due, and `applied` after, with the changes counted during the apply
        and no `Batch` (`AppliedBatch.batch` decodes one for a sink that reads it)."""
        # The fused apply is inline, not a call of its own: one Python frame less for nearly
        # every live batch (its frame cost about as much as what it does).
        self.expected = seq + 1
        self.last_seq = seq
        size = len(payload)
        # `self._recent.add`, without its call; `kept` only for a large payload.
        self._recent.batches.append((seq, size, payload if size <= KEPT_BYTES else kept(payload)))
        if size > self.max_message_bytes:
            self._malformed(MalformedKind.OVERSIZE, seq, f"{size} bytes")
            self._degrade("oversize batch dropped", seq, seq, now)
            return
        if type(decoded) is Batch:  # (isinstance asks msgspec's metaclass: it costs more)
            self._apply_decoded(seq, payload, now, decoded)
            return
        if TYPE_CHECKING:  # (`cast` is a call on every batch)
            assert not isinstance(decoded, Batch)
        fused = self.fused
        applied = -1  # not applied, nothing told: decode + apply
        if self.engine is not None and fused is not None:
            degraded = bool(self._degradation.open)
            sink, max_block_size = self.sink, self.decoder.max_block_size
            if sink is None and decoded is not None:  # (each called as a method: no bound one)
                applied = decoded.apply_read(
                    self.map, payload, seq, self.epoch, degraded, now, max_block_size
                )
            elif sink is None:
                applied = fused.live(
                    self.map, payload, seq, self.epoch, degraded, now, max_block_size
                )
            else:
                reader = decoded if decoded is not None else fused
                read_ts = reader.prepare(
                    self.map, payload, self.epoch, degraded, now, max_block_size
                )
                if read_ts is not None:
                    ts = read_ts
                    try:
                        quiet = self._quiet
                        if not quiet[0] <= ts < quiet[1]:
                            self._quiet = sink.instant(self.stream, ts, self.map)
                    except BaseException:
                        reader.release()
                        raise
                    changes: dict[TableKey, list[int]] = {}
                    applied = reader.apply_prepared(seq, changes)
        if applied < 0:
            # What the router read, as a `Batch` (for the sink, or the engine to be told).
            batch = None
            if decoded is not None:
                batch = decoded.batch(payload, seq, self.decoder.max_block_size)
            self._apply_decoded(seq, payload, now, batch)
            return
        if self.decoder.layouts[0] is not MAP_LAYOUT:  # (nearly never: without the call)
            self.decoder.took_map_layout()
        rank = (applied >> 1) - 1  # -1: none
        if rank >= 0 and rank != self.stream.rank:
            self.counters.rank_mismatches += 1
        self.counters.batches_applied += 1
        if degraded and applied & 1:
            self._degradation.known_again(seq, now)
        if sink is not None:  # `_tell_applied`, inline: one frame less for each batch stored
            gaps = self.counters.gaps
            sink.applied(
                AppliedBatch(
                    self.stream,
                    self.epoch,
                    seq,
                    ts,
                    now,
                    payload,
                    None,
                    changes,
                    gaps - self._gaps_told,
                    self.map,
                )
            )
            self._gaps_told = gaps

    # --- what StreamIngest supplies -----------------------------------------------------------
    def _apply_decoded(self, seq: int, payload: bytes, now: float, decoded: Batch | None) -> None:
        raise NotImplementedError

    def _degrade(self, reason: str, from_seq: int, to_seq: int | None, now: float) -> None:
        raise NotImplementedError

    def _tell_applied(
        self,
        sink: EventSink,
        seq: int,
        ts: float,
        now: float,
        payload: bytes,
        batch: Batch | None,
        changes: dict[TableKey, list[int]],
    ) -> None:
        """The sink told of a batch applied, with the gaps found since the last one told (the
        end of `_apply` repeats it inline: keep the two alike)."""
        gaps = self.counters.gaps
        sink.applied(
            AppliedBatch(
                self.stream,
                self.epoch,
                seq,
                ts,
                now,
                payload,
                batch,
                changes,
                gaps - self._gaps_told,
                self.map,
            )
        )
        self._gaps_told = gaps
