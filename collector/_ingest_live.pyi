from collections.abc import Callable

from kvscope.collector._replay import FusedApply
from kvscope.collector.degraded import Degradation
from kvscope.collector.engine_kind import Engine
from kvscope.collector.errors import MalformedKind
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.recent import RecentBatches
from kvscope.collector.replay import Replay, ReplayRequest
from kvscope.collector.sink import EventSink, Span
from kvscope.collector.stream_counters import StreamCounters
from kvscope.collector.types import Batch, StreamId
from kvscope.collector.wire import BatchDecoder

SHARED_FUSED: FusedApply

class LiveIngest:
    fused: FusedApply | None
    """What the usual batch is applied from its bytes with (`SHARED_FUSED`), or None: each
    batch decoded."""
    stream: StreamId
    sink: EventSink | None
    map: PrefixMap
    decoder: BatchDecoder
    counters: StreamCounters
    epoch: int
    engine: Engine | None
    expected: int | None
    last_seq: int | None
    last_message_at: float | None
    max_message_bytes: int
    _replay: Replay | None
    _outbox: ReplayRequest | None
    _quiet: Span
    """Stamps before which the sink needs no `instant` call (what its last one returned)."""
    _gaps_told: int
    """`counters.gaps` as the sink was last told it."""
    _degradation: Degradation
    _malformed: Callable[[MalformedKind, int | None, str], None]
    _messages: int
    _recent: RecentBatches
    def live_frames(
        self, frames: list[bytes], now: float, decoded: Batch | FusedApply | None = None
    ) -> ReplayRequest | None: ...
    def _apply(
        self, seq: int, payload: bytes, now: float, decoded: Batch | FusedApply | None = None
    ) -> None: ...
