"""When a stream's map is known to be incomplete: its degraded intervals, as they open, widen and
close, each change told to the stream's sink."""

from __future__ import annotations

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


class Degradation:
    """A stream's open degraded interval (`current`) and every one it had (`history`)."""

    def __init__(self, stream: StreamId, log: RateLimitedLog, sink: EventSink | None) -> None:
        self.stream = stream
        self.current: DegradedInterval | None = None
        self.history: list[DegradedInterval] = []
        self._log = log
        self._sink = sink

    def degrade(
        self, reason: str, from_seq: int, to_seq: int | None, now: float, epoch: int
    ) -> None:
        """Changes from `from_seq` to `to_seq` are missing: open the interval, or widen it."""
        self._log.warning(
            f"degraded:{self.stream}",
            "%s: map degraded (%s, seq %d..%s): it is incomplete until the next clear or restart",
            self.stream,
            reason,
            from_seq,
            to_seq,
        )
        current = self.current
        if current is None:
            current = self.current = DegradedInterval(reason, from_seq, to_seq, now, epoch)
            self.history.append(current)
            self._tell(DegradedStep.OPENED, current)
        elif to_seq is not None:
            widened = max(current.to_seq or to_seq, to_seq)
            if widened != current.to_seq:
                current.to_seq = widened
                self._tell(DegradedStep.WIDENED, current)

    def known_again(self, seq: int | None, now: float) -> None:
        """A clear (at `seq`) or a restart (None) made the map known: close the interval."""
        current = self.current
        if current is not None:
            current.cleared_at_seq = seq
            current.cleared_at = now
            self.current = None
            self._tell(DegradedStep.CLOSED, current)

    def resume(self, change: DegradedChange | None) -> None:
        """Start from an interval kept elsewhere (still open), or none."""
        self.current = None
        self.history = []
        if change is not None:
            self.current = DegradedInterval(
                change.reason, change.from_seq, change.to_seq, change.since, change.epoch
            )
            self.history.append(self.current)

    def _tell(self, step: DegradedStep, interval: DegradedInterval) -> None:
        if self._sink is not None:
            self._sink.degraded(interval.change(step, self.stream))
