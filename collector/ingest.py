"""One stream's ingest: frames in, sequence followed, gaps replayed or declared, map updated.

This is the state machine of a (replica, rank) stream without any socket: the subscriber feeds it
live frames and replay replies and sends the replay requests it asks for; `kvscope replay` feeds
recorded frames through the same path. Keeping it socket-free makes every rule testable.

Rules (see the reference on vLLM's KV events):
- seq == expected: apply. seq > expected: a gap; replay it if a replay endpoint exists, else the
  map is degraded. seq < expected: an exact duplicate of a recent batch is dropped; anything
  else means the publisher restarted (a new epoch with an empty map).
- While a replay is in flight, live batches are held and applied after it.
- A degraded map stays degraded until an `AllBlocksCleared` or a restart makes it known again.

What happens leaves through the stream's `EventSink` (collector/sink.py), if it has one.
"""

from __future__ import annotations

import logging
from collections import deque

from kvscope.collector.degraded import Degradation, DegradedInterval
from kvscope.collector.engine_kind import Engine, engine_of
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.ingest_errors import IngestErrors
from kvscope.collector.ingest_fused import FusedIngest
from kvscope.collector.limits import DEFAULT_LIMITS, IngestLimits
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.recent import RecentBatches
from kvscope.collector.replay import (
    SEQ_BYTES,
    Replay,
    ReplayRequest,
)
from kvscope.collector.replay_rules import ReplayRules
from kvscope.collector.sink import (
    EVERY_BATCH,
    ClearedMap,
    ClearReason,
    EventSink,
    ResumePoint,
    Span,
)
from kvscope.collector.stream_counters import StreamCounters
from kvscope.collector.types import AllCleared, Batch, StreamId
from kvscope.collector.wire import BatchDecoder

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MESSAGES_BETWEEN_RESTARTS = 100
"""A seq that goes back within this many live messages of the last restart is refused
(`seq_back`, the map unknown) instead of starting yet another epoch; the first one after that
restarts as usual, so a publisher that really restarted is followed again."""
MAX_SEQ = 2**63 - 1
"""vLLM counts seqs in a signed 64-bit int from 0; the store keeps them as BIGINT."""
DEFAULT_TAIL_CHECK_AFTER_S = 5.0
"""Silence after which the publisher's replay socket is asked for any lost tail."""


class StreamIngest(ReplayRules, FusedIngest):
    """Follows one publisher's sequence and keeps its `PrefixMap` exact, or says it is not."""

    def __init__(
        self,
        stream: StreamId,
        *,
        can_replay: bool,
        replay_timeout_s: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tail_check_after_s: float = DEFAULT_TAIL_CHECK_AFTER_S,
        sink: EventSink | None = None,
        engine: Engine | None = None,
        limits: IngestLimits = DEFAULT_LIMITS,
    ) -> None:
        """`engine`: the publisher's engine as configured; None: told by its batches (again
        after each restart, which may be another engine under the same name)."""
        self.stream = stream
        self.sink = sink
        self.can_replay = can_replay
        self.replay_timeout_s = replay_timeout_s
        self.max_message_bytes = max_message_bytes
        self.tail_check_after_s = tail_check_after_s
        self.map = PrefixMap(stream, self._on_clear)
        self.map.limits = limits
        self.decoder = BatchDecoder(limits)
        self.counters = StreamCounters()
        self.epoch = 0
        self.expected: int | None = None
        """The next seq to apply; None until the stream's position is known."""
        self.last_seq: int | None = None
        self.last_message_at: float | None = None
        self.configured_engine = engine
        self.engine: Engine | None = engine
        """"vllm" or "sglang": configured, else told by the epoch's first batch that stores a
        block."""
        self.restarts_at: deque[tuple[int, float]] = deque(maxlen=256)
        """(new epoch, receive time) of the last restarts noticed."""
        self._replay: Replay | None = None
        self._hopeless: set[tuple[int, int]] = set()
        self._outbox: ReplayRequest | None = None
        self._recent = RecentBatches()
        self._log = RateLimitedLog(logger)
        self.errors = IngestErrors(stream, self.counters, self._log)
        self._malformed = self.errors.malformed
        self._degradation = Degradation(stream, self._log, sink)
        self._quiet: Span = EVERY_BATCH
        self._gaps_told = 0
        self._tail_checked: tuple[int, int] | None = None
        self._messages = 0
        """Live messages received (the clock that spaces restarts: data, not time)."""
        self._restarted_at_message = -MESSAGES_BETWEEN_RESTARTS
        self._gap_counted: tuple[int, int] | None = None
        """(epoch, expected seq) of the last gap counted: a gap held for a replay that could
        not fill it comes back through `_accept`, and is one gap all the same."""

    @property
    def degraded(self) -> DegradedInterval | None:
        """The open degraded interval: the map is known to be incomplete."""
        return self._degradation.current

    @property
    def degraded_history(self) -> list[DegradedInterval]:
        """The last intervals (`degraded.MAX_HISTORY`), oldest first; the store keeps all."""
        return list(self._degradation.history)

    def resume(self, point: ResumePoint) -> None:
        """Start from a map kept elsewhere (a store, after a crash): the map after `last_seq`.

        The first replay after connecting asks from `last_seq` and checks that batch against
        `last_payload`: a publisher that restarted meanwhile is noticed, and everything after
        `last_seq` is fetched.
        """
        point.map.on_clear = self._on_clear
        point.map.limits = self.map.limits
        self.map = point.map
        self.epoch = point.epoch
        self.last_seq = point.last_seq
        self.expected = point.last_seq + 1
        self._recent.clear()
        self._recent.add(point.last_seq, point.last_payload)
        self._degradation.resume(point.degraded)
        self._quiet = EVERY_BATCH

    # --- what the subscriber calls ------------------------------------------------------------
    # Each call may leave a replay request behind (`take_replay_request`); the live and connect
    # calls also return it, as that is where one usually arises.
    def connected(self, now: float) -> ReplayRequest | None:
        """The socket (re)connected: replay what was published before we could hear it.

        After a reconnect the replay starts at the last batch applied, not the one after: if
        the publisher restarted meanwhile, that seq now holds another batch, which tells us so
        even when the new run has already gone past the old seq.
        """
        start = 0 if self.last_seq is None or self.expected is None else self.last_seq
        self._request_replay(start, now, verify_seq=self.last_seq if start else None)
        return self.take_replay_request()

    # `live_frames(frames, now, decoded)`: one message from the SUB socket, in C (LiveIngest,
    # collector/_ingest_live.pyx): applied when in order (`_apply`), else weighed by `_accept`.

    def replay_frames(self, frames: list[bytes], now: float) -> bool:
        """One reply from the replay socket; True once that replay has ended (its end marker,
        or an error). A replay that ends may leave the next one to send in
        `take_replay_request`.
        """
        try:
            return self._replay_frames(frames, now)
        except Exception as exc:  # one reply must not stop the stream
            self._failed("replay", exc, frames, now)
            return self._replay is None

    def tick(self, now: float) -> ReplayRequest | None:
        """Give up on a replay that has not ended in time; after a silence, ask for the tail."""
        try:
            if self._replay is not None:
                if now >= self._replay.deadline:
                    self._replay_failed("replay timed out", now)
            elif self._tail_due(now):
                self._check_tail(now)
        except Exception as exc:  # releasing held batches applies them
            self._failed("tick", exc, None, now)
        return self.take_replay_request()

    # --- sequence rules -----------------------------------------------------------------------
    def _accept(self, seq: int, payload: bytes, now: float) -> None:
        expected = self.expected
        if expected is None:
            if seq != 0 and not self._replay_gap(0, seq, payload, now):
                self._degrade("joined mid-stream", 0, seq - 1, now)
                self._apply(seq, payload, now)
            elif seq == 0:
                self._apply(seq, payload, now)
        elif seq == expected:
            self._apply(seq, payload, now)
        elif seq > expected:
            if self._gap_counted != (self.epoch, expected):
                self._gap_counted = (self.epoch, expected)
                self.counters.gaps += 1
            if not self._replay_gap(expected, seq, payload, now):
                self.counters.missing_batches += seq - expected
                self._degrade("gap not recovered", expected, seq - 1, now)
                self._apply(seq, payload, now)
        elif self._is_duplicate(seq, payload):
            self.counters.duplicates += 1
        elif self._messages - self._restarted_at_message < MESSAGES_BETWEEN_RESTARTS:
            # No engine restarts that often: a publisher whose seq keeps going back would make
            # a new epoch (and a stored reset with its map) of every batch.
            self._malformed(MalformedKind.SEQ_BACK, seq, f"seq went back to {seq} again")
            self._degrade("seq went back again", seq, seq, now)
        else:
            self._restart(seq, now)
            self._accept(seq, payload, now)

    def _is_duplicate(self, seq: int, payload: bytes) -> bool:
        return self._recent.holds(seq, payload)

    def _restart(self, seq: int, now: float) -> None:
        """The seq went backwards: the publisher started over with an empty cache."""
        self.counters.restarts += 1
        self._restarted_at_message = self._messages
        self.epoch += 1
        self.restarts_at.append((self.epoch, now))
        self._log.warning(
            f"restart:{self.stream}",
            "%s: seq went back to %d (expected %s): publisher restarted, epoch %d",
            self.stream,
            seq,
            self.expected,
            self.epoch,
        )
        self.map.clear(
            ClearReason.RESTART, seq, now, self.epoch - 1, self.degraded is not None, now
        )
        # The new epoch's engine is told again, and its hashes shown in that engine's form.
        self.engine = self.configured_engine
        self.map.counters.signed_hashes = False
        self._degradation.known_again(None, now)
        self.expected = None
        self._recent.clear()

    def _degrade(self, reason: str, from_seq: int, to_seq: int | None, now: float) -> None:
        self._degradation.degrade(reason, from_seq, to_seq, now, self.epoch)

    def _apply_decoded(self, seq: int, payload: bytes, now: float, decoded: Batch | None) -> None:
        """`_apply`'s decode + apply (collector/ingest_fused.py), for a batch not applied from
        its bytes; `decoded`: the batch as the router decoded or read it."""
        errors: list[MalformedPayload] = []
        try:
            batch = self.decoder.decode(payload, seq, errors, decoded)
        except MalformedPayload as exc:
            self._malformed(exc.kind, seq, exc.detail)
            self._degrade("undecodable batch", seq, seq, now)
            return
        for error in errors:
            self._malformed(error.kind, seq, error.detail)
            if error.kind.loses_map_state:
                self._degrade("event dropped", seq, seq, now)
        if self.engine is None:
            self.engine = engine_of(payload, batch.events)
        if batch.rank is not None and batch.rank != self.stream.rank:
            self.counters.rank_mismatches += 1
        sink, ts = self.sink, batch.ts
        if sink is not None:
            quiet = self._quiet
            if not quiet[0] <= ts < quiet[1]:
                self._quiet = sink.instant(self.stream, ts, self.map)
        degraded = bool(self._degradation.open)  # `current is not None`, without its call
        try:
            changes = self.map.apply(batch, self.epoch, degraded, now)
        except MalformedPayload as exc:  # over a limit: refused whole, nothing applied
            self._malformed(exc.kind, seq, exc.detail)
            self._degrade("batch refused", seq, seq, now)
            return
        self.counters.batches_applied += 1
        if degraded and any(type(e) is AllCleared for e in batch.events):
            self._degradation.known_again(seq, now)
        if sink is not None:
            self._tell_applied(sink, seq, ts, now, payload, batch, changes)

    def _on_clear(self, cleared: ClearedMap) -> None:
        self._quiet = EVERY_BATCH  # the sink may want to see the map sooner after a clear
        if self.sink is not None:
            self.sink.map_cleared(cleared)

    # --- input errors -------------------------------------------------------------------------
    def _failed(self, stage: str, exc: Exception, frames: list[bytes] | None, now: float) -> None:
        """An exception escaped one message's handling: what the message did to the map, or
        to the store's copy of it, is not known, so the map is marked unknown. The next
        message is handled as usual."""
        seq = self.errors.message_failed(stage, exc, frames)
        at = seq if seq is not None else (self.last_seq or 0)
        try:
            self._degrade(f"{stage} message failed ({type(exc).__name__})", at, at, now)
        except Exception as again:  # the sink may be what is broken
            self.counters.ingest_errors[(stage, type(again).__name__)] += 1

    def _seq_of(self, frame: bytes) -> int | None:
        if len(frame) != SEQ_BYTES:
            self._malformed(MalformedKind.SEQ_LENGTH, None, f"{len(frame)}-byte seq frame")
            return None
        seq = int.from_bytes(frame, "big")
        if seq > MAX_SEQ:
            self._malformed(MalformedKind.SEQ_RANGE, None, f"seq {seq}")
            return None
        return seq
