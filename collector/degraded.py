"""When a stream's map is known to be incomplete: its degraded intervals, as they open, widen and
close, each change told to the stream's sink."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.sink import DegradedChange, DegradedStep, EventSink
from kvscope.collector.types import StreamId


@dataclass
class DegradedInterval:
    """A stretch during which the map is known to be incomplete."""

    reason: str
    from_seq: int
    """First seq whose changes are missing (or the seq at which the stream was joined)."""
    to_seq: int | None
    """Last missing seq, if known."""
    since: float
    """Receive time at which it was noticed."""
    epoch: int
    cleared_at_seq: int | None = None
    """The seq of the batch whose clear made the map known again (None: it ended with its
    epoch, at a restart, or is still open)."""
    cleared_at: float | None = None

    def change(self, step: DegradedStep, stream: StreamId) -> DegradedChange:
        return DegradedChange(
            step,
            stream,
            self.epoch,
            self.reason,
            self.from_seq,
            self.to_seq,
            self.since,
            self.cleared_at_seq,
            self.cleared_at,
        )


MAX_OPEN_INTERVALS = 32
"""Causes kept apart while the map is unknown; past this the newest interval takes the rest
(a publisher breaking every other batch must not grow the list without bound)."""
MAX_HISTORY = 256
"""Intervals remembered in memory (the store keeps every one)."""


class Degradation:
    """A stream's open degraded intervals, one per cause (`open`; `current` is the oldest: the
    map has been unknown since it began), and the last `MAX_HISTORY` it had (`history`)."""

    # Slots: the live path reads `open` for every batch through its descriptor.
    __slots__ = ("stream", "open", "history", "_log", "_sink")

    def __init__(self, stream: StreamId, log: RateLimitedLog, sink: EventSink | None) -> None:
        self.stream = stream
        self.open: list[DegradedInterval] = []
        self.history: deque[DegradedInterval] = deque(maxlen=MAX_HISTORY)
        self._log = log
        self._sink = sink

    @property
    def current(self) -> DegradedInterval | None:
        return self.open[0] if self.open else None

    def degrade(
        self, reason: str, from_seq: int, to_seq: int | None, now: float, epoch: int
    ) -> None:
        """Changes from `from_seq` to `to_seq` are missing. A new cause opens an interval of
        its own; the same cause continuing (the next seqs, for the same reason) widens its
        interval."""
        self._log.warning(
            f"degraded:{self.stream}",
            "%s: map degraded (%s, seq %d..%s): it is incomplete until the next clear or restart",
            self.stream,
            reason,
            from_seq,
            to_seq,
        )
        last = self.open[-1] if self.open else None
        continues = (
            last is not None
            and last.reason == reason
            and last.to_seq is not None
            and from_seq <= last.to_seq + 1
        )
        if last is not None and (continues or len(self.open) >= MAX_OPEN_INTERVALS):
            if to_seq is not None:
                widened = max(last.to_seq or to_seq, to_seq)
                if widened != last.to_seq:
                    last.to_seq = widened
                    self._tell(DegradedStep.WIDENED, last)
            return
        interval = DegradedInterval(reason, from_seq, to_seq, now, epoch)
        self.open.append(interval)
        self.history.append(interval)
        self._tell(DegradedStep.OPENED, interval)

    def known_again(self, seq: int | None, now: float) -> None:
        """A clear (at `seq`) or a restart (None) made the map known: close every interval."""
        closing, self.open = self.open, []
        for interval in closing:
            interval.cleared_at_seq = seq
            interval.cleared_at = now
            self._tell(DegradedStep.CLOSED, interval)

    def resume(self, changes: Sequence[DegradedChange]) -> None:
        """Start from the intervals kept elsewhere (still open), if any."""
        self.open = [
            DegradedInterval(c.reason, c.from_seq, c.to_seq, c.since, c.epoch) for c in changes
        ]
        self.history = deque(self.open, maxlen=MAX_HISTORY)

    def _tell(self, step: DegradedStep, interval: DegradedInterval) -> None:
        if self._sink is not None:
            self._sink.degraded(interval.change(step, self.stream))
