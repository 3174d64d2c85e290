"""A stream's apply from bytes: `_apply` (collector/_ingest_live.pyx's `LiveIngest`, in C)
applies nearly every batch in one pass over its bytes with a `FusedApply`
(collector/_replay.pyx), leaves the rest to decode + apply (collector/ingest.py's
`_apply_decoded`), and tells the sink of each batch applied (`_tell_applied`, which the path
from bytes repeats inline).

A part of `StreamIngest` (collector/ingest.py), which supplies the state it reads; split off to
keep each file to one concern.
"""

from __future__ import annotations

from kvscope.collector._ingest_live import SHARED_FUSED, LiveIngest
from kvscope.collector.sink import AppliedBatch, EventSink
from kvscope.collector.types import Batch, TableKey

__all__ = ["SHARED_FUSED", "FusedIngest"]


class FusedIngest(LiveIngest):
    # `fused` (a C field of `LiveIngest`): applies the usual batch straight from its bytes,
    # `SHARED_FUSED` for every stream; None on a stream: its every batch decoded.

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
        end of `LiveIngest.apply_known` repeats it inline: keep the two alike)."""
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
