"""Each clear's recovery, followed in memory (the demo's report; the store keeps the same)."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import ClearedMap
from kvscope.collector.types import Batch, StreamId
from kvscope.storage.recovery import RecoveryPoint
from kvscope.storage.recovery import RecoveryTracker as _Tracker

OFFSETS_S = (1.0, 10.0, 60.0)


@dataclass
class Recovery:
    stream: StreamId
    reason: str
    seq: int
    ts: float
    before_blocks: int
    before_hittable: int
    degraded: bool
    tracker: _Tracker

    @property
    def after(self) -> dict[float, RecoveryPoint]:
        """offset (s) -> the map at that instant; absent if the next clear came first."""
        return {p.offset_s: p for p in self.tracker.points}


class RecoveryTracker:
    """A map listener and pre-apply hook: one `Recovery` per clear, followed until the next."""

    def __init__(self, offsets: tuple[float, ...] = OFFSETS_S) -> None:
        self.offsets = offsets
        self.recoveries: list[Recovery] = []
        self._open: dict[StreamId, Recovery] = {}

    def map_cleared(self, cleared: ClearedMap) -> None:
        tables = cleared.tables
        recovery = Recovery(
            stream=cleared.stream,
            reason=cleared.reason.value,
            seq=cleared.seq,
            ts=cleared.ts,
            before_blocks=sum(len(t) for t in tables.values()),
            before_hittable=sum(t.hittable_count for t in tables.values()),
            degraded=cleared.degraded,
            tracker=_Tracker.start(cleared.ts, tables, self.offsets),
        )
        self.recoveries.append(recovery)
        self._open[cleared.stream] = recovery

    def before_batch(self, ingest: StreamIngest, batch: Batch) -> None:
        recovery = self._open.get(ingest.stream)
        if recovery is not None:
            recovery.tracker.before_batch(ingest.map, batch.ts)
