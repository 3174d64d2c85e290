"""How a map refilled after each clear: stored and hittable blocks at fixed offsets after it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.prefix_map import ClearedMap
from kvscope.collector.types import Batch, StreamId

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
    after: dict[float, tuple[int, int, int]] = field(default_factory=dict)
    """offset (s) -> (blocks, hittable, orphans) at the first batch at least that long after."""


class RecoveryTracker:
    """A map listener and batch observer: one `Recovery` per clear, filled as batches arrive.

    Time is the batch `ts` (the engine's clock), so a recorded stream played fast gives the
    same figures as it did live.
    """

    def __init__(self, offsets: tuple[float, ...] = OFFSETS_S) -> None:
        self.offsets = offsets
        self.recoveries: list[Recovery] = []
        self._open: dict[StreamId, Recovery] = {}
        self._last: dict[StreamId, tuple[int, int, int]] = {}

    def map_cleared(self, cleared: ClearedMap) -> None:
        recovery = Recovery(
            stream=cleared.stream,
            reason=cleared.reason.value,
            seq=cleared.seq,
            ts=cleared.ts,
            before_blocks=sum(len(t) for t in cleared.tables.values()),
            before_hittable=sum(t.hittable_count for t in cleared.tables.values()),
            degraded=cleared.degraded,
        )
        self.recoveries.append(recovery)
        self._open[cleared.stream] = recovery
        self._last[cleared.stream] = (0, 0, 0)

    def __call__(self, ingest: StreamIngest, batch: Batch, payload: bytes, recv_ts: float) -> None:
        recovery = self._open.get(ingest.stream)
        totals = ingest.map.totals()
        current = (totals.blocks, totals.hittable, totals.orphans)
        before_this_batch = self._last.get(ingest.stream, current)
        self._last[ingest.stream] = current
        if recovery is None or batch.seq == recovery.seq:
            return
        for offset in self.offsets:
            if offset not in recovery.after and batch.ts > recovery.ts + offset:
                # The map at the instant clear + offset is the one before this batch.
                recovery.after[offset] = before_this_batch
        if len(recovery.after) == len(self.offsets):
            del self._open[ingest.stream]
