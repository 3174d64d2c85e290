"""The fused half of a stream's apply: a batch decoded and applied in one pass over its bytes
(collector/_replay.pyx's `FusedApply`), and the sink told of each batch applied, which both
halves of the apply share (`_tell_applied`).

A part of `StreamIngest` (collector/ingest.py), which supplies the state it reads; split off to
keep each file to one concern.
"""

from __future__ import annotations

from kvscope.collector._replay import FusedApply
from kvscope.collector.degraded import Degradation
from kvscope.collector.prefix_map import PrefixMap
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

    fused: FusedApply | None = FusedApply()
    """Applies the usual batch straight from its bytes, for every stream (a class attribute:
    one more instance attribute, past CPython 3.11's 30 shared keys, slows each attribute read
    of the ingest); None on a stream: its every batch decoded."""

    def _apply_fused(self, seq: int, payload: bytes, now: float, read: FusedApply | None) -> bool:
        """`_apply`'s decode and apply in one, for a batch of a stream whose engine is told
        already: True, or False (nothing done, nothing told) to leave the batch to decode +
        apply. `read`: the batch as the fleet's router read it. A sink is told as `_apply`
        tells it: `instant` before the map changes, when due, and `applied` after, with the
        changes counted during the apply and no `Batch` (`AppliedBatch.batch` decodes one for
        a sink that reads it)."""
        fused, degraded = self.fused, bool(self._degradation.open)
        if fused is None:
            return False
        sink, max_block_size = self.sink, self.decoder.max_block_size
        if sink is None:
            told = read.apply_read if read is not None else fused.live
            applied = told(self.map, payload, seq, self.epoch, degraded, now, max_block_size)
            if applied < 0:
                return False
        else:
            reader = read if read is not None else fused
            read_ts = reader.prepare(self.map, payload, self.epoch, degraded, now, max_block_size)
            if read_ts is None:
                return False
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
        if self.decoder.layouts[0] is not MAP_LAYOUT:  # (nearly never: without the call)
            self.decoder.took_map_layout()
        rank = (applied >> 1) - 1  # -1: none
        if rank >= 0 and rank != self.stream.rank:
            self.counters.rank_mismatches += 1
        self.counters.batches_applied += 1
        if degraded and applied & 1:
            self._degradation.known_again(seq, now)
        if sink is not None:
            self._tell_applied(sink, seq, ts, now, payload, None, changes)
        return True

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
        """The sink told of a batch applied, with the gaps found since the last one told."""
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
