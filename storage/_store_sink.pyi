from typing import Any

from kvscope.collector._live_sink import LiveSink
from kvscope.collector.sink import AppliedBatch, MapReader, Span
from kvscope.collector.types import StreamId
from kvscope.storage._checkpoint_pacing import CheckpointPacer
from kvscope.storage._rollup_counts import RollupCounts
from kvscope.storage.recovery_follow import StreamRecoveries
from kvscope.storage.rollups import SecondRollup
from kvscope.storage.rowqueue import RowQueue

class RecoveriesCore:
    """The base of `StreamRecoveries`: the list the sink tests for each batch, a C field."""

    followed: list[Any]

class StreamState:
    """What the writer remembers per stream between batches (ingest thread only)."""

    rollup: SecondRollup
    recoveries: StreamRecoveries
    pacer: CheckpointPacer
    @property
    def counts(self) -> RollupCounts:
        """`rollup.counts`, counted into for each batch."""
    epoch: int | None
    connected_since: float | None
    dropped_from: tuple[int, int, float] | None
    """(epoch, seq, ts) of the first batch dropped since the store last had room."""
    dropped_to: tuple[int, float] | None
    def __init__(
        self,
        rollup: SecondRollup,
        recoveries: StreamRecoveries,
        pacer: CheckpointPacer,
        epoch: int | None = None,
        connected_since: float | None = None,
        dropped_from: tuple[int, int, float] | None = None,
        dropped_to: tuple[int, float] | None = None,
    ) -> None: ...

class StoreSinkCore(LiveSink):
    """The writer's state that each batch reads, and `applied`, in C."""

    @property
    def _streams(self) -> dict[StreamId, StreamState]: ...
    _queue: RowQueue[Any]
    def _forget_state(self, stream: StreamId) -> None:
        """The stream's state goes (`forget`)."""
    def applied(self, batch: AppliedBatch) -> None:
        """After each batch changed the map (`EventSink.applied`)."""
    def instant(self, stream: StreamId, ts: float, view: MapReader) -> Span:
        """The map at each second's end (rollups) and at each recovery offset."""
