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
from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.ingest_errors import IngestErrors
from kvscope.collector.prefix_map import PrefixMap
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.recent import RecentBatches
from kvscope.collector.replay import (
    END_SEQ,
    SEQ_BYTES,
    Replay,
    ReplayRequest,
    can_hold,
    hold,
    reply_parts,
)
from kvscope.collector.sink import (
    EVERY_BATCH,
    AppliedBatch,
    ClearedMap,
    ClearReason,
    EventSink,
    ResumePoint,
    Span,
)
from kvscope.collector.stream_counters import StreamCounters
from kvscope.collector.types import AllCleared, StreamId
from kvscope.collector.wire import BatchDecoder

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_TAIL_CHECK_AFTER_S = 5.0
"""Silence after which the publisher's replay socket is asked for any lost tail."""


class StreamIngest:
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
    ) -> None:
        self.stream = stream
        self.sink = sink
        self.can_replay = can_replay
        self.replay_timeout_s = replay_timeout_s
        self.max_message_bytes = max_message_bytes
        self.tail_check_after_s = tail_check_after_s
        self.map = PrefixMap(stream, self._on_clear)
        self.decoder = BatchDecoder()
        self.counters = StreamCounters()
        self.epoch = 0
        self.expected: int | None = None
        """The next seq to apply; None until the stream's position is known."""
        self.last_seq: int | None = None
        self.last_message_at: float | None = None
        self.restarts_at: deque[tuple[int, float]] = deque(maxlen=256)
        """(new epoch, receive time) of the last restarts noticed."""
        self._replay: Replay | None = None
        self._hopeless: set[tuple[int, int]] = set()
        """(epoch, start seq) of gaps a replay could not fill: they are not asked for again."""
        self._outbox: ReplayRequest | None = None
        self._recent = RecentBatches()
        self._log = RateLimitedLog(logger)
        self.errors = IngestErrors(stream, self.counters, self._log)
        self._malformed = self.errors.malformed
        self._degradation = Degradation(stream, self._log, sink)
        self._quiet: Span = EVERY_BATCH
        """Stamps before which the sink needs no `instant` call (what its last one returned)."""
        self._gaps_told = 0
        """`counters.gaps` as the sink was last told it."""
        self._tail_checked: tuple[int, int] | None = None
        """(epoch, next seq) at the last tail check: asked again only once more batches came."""
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

    def live_frames(self, frames: list[bytes], now: float) -> ReplayRequest | None:
        """One message from the SUB socket: [topic, seq, payload]."""
        try:
            return self._live_frames(frames, now)
        except Exception as exc:  # one batch must not stop the stream
            self._failed("live", exc, frames, now)
            return self.take_replay_request()

    def _live_frames(self, frames: list[bytes], now: float) -> ReplayRequest | None:
        self.last_message_at = now
        if len(frames) != 3:
            self._malformed(MalformedKind.FRAME_COUNT, None, f"{len(frames)} frames")
            return None
        _topic, seq_frame, payload = frames
        seq = self._seq_of(seq_frame)
        if seq is None:
            return None
        if self._replay is not None:
            if can_hold(self._replay, payload):
                hold(self._replay, [(seq, payload)])
                return None
            self._replay_failed("too many live batches held during replay", now)
        if self._replay is not None:
            hold(self._replay, [(seq, payload)])  # a replay asked for while releasing
        elif seq == self.expected:
            self._apply(seq, payload, now)  # in order, nearly every batch: no rules to weigh
        else:
            self._accept(seq, payload, now)
        return self.take_replay_request()

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

    def _replay_frames(self, frames: list[bytes], now: float) -> bool:
        replay = self._replay
        if replay is None:
            return True  # a late reply to a replay already given up: nothing to do
        parts = reply_parts(frames)
        if parts is None:
            self._malformed(MalformedKind.BAD_REPLAY, None, f"{len(frames)} frames")
            self._replay_failed("malformed replay reply", now)
            return True
        seq_frame, payload = parts
        if seq_frame == END_SEQ:
            self._replay_done(now)
            return True
        seq = self._seq_of(seq_frame)
        if seq is None:
            self._replay_failed("malformed replay seq", now)
            return True
        first = replay.received == 0
        replay.received += 1
        if first and seq > replay.start_seq:
            # The publisher's buffer no longer reaches back to what we asked for.
            self._hopeless.add((self.epoch, replay.start_seq))
            replay.verify_seq = None
        if replay.verify_seq is not None and seq == replay.verify_seq:
            replay.verify_seq = None
            if not self._is_duplicate(seq, payload):
                # Our last batch's seq holds another batch: the publisher started over.
                self._restart(seq, now)
                self._supersede_replay(now)
                return True
        if self.expected is not None and seq < self.expected:
            # A replay answers with seq >= what was asked: older ones are ours already.
            self.counters.duplicates += 1
            return False
        self._accept(seq, payload, now)
        return False

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

    def tail_unverified(self, now: float) -> bool:
        """Silent long enough that batches may have been lost at the end of the stream, and
        no replay has shown that none were (there is no replay socket, or it was not asked
        yet): the map may lack the stream's last changes."""
        silent = self.silent_for(now)
        return (
            silent is not None
            and silent >= self.tail_check_after_s
            and self.expected is not None
            and self._tail_checked != (self.epoch, self.expected)
        )

    @property
    def checking_tail(self) -> bool:
        """A replay in flight only to check the tail of a silent stream."""
        return self._replay is not None and self._replay.tail

    def _tail_due(self, now: float) -> bool:
        return self.can_replay and self.tail_unverified(now)

    def _check_tail(self, now: float) -> None:
        """Nothing came for a while: if the publisher's last batches were dropped, no later
        seq will ever show the gap. Its replay buffer still holds them: ask for everything
        after the last applied batch (an empty answer says nothing was lost)."""
        assert self.expected is not None
        self._tail_checked = (self.epoch, self.expected)
        self.counters.tail_checks += 1
        self._request_replay(self.expected, now)
        if self._replay is not None:
            self._replay.tail = True

    def take_replay_request(self) -> ReplayRequest | None:
        """The replay to send now, if the last call asked for one (each is handed out once)."""
        request, self._outbox = self._outbox, None
        return request

    @property
    def replaying(self) -> bool:
        return self._replay is not None

    def silent_for(self, now: float) -> float | None:
        return None if self.last_message_at is None else now - self.last_message_at

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
        else:
            self._restart(seq, now)
            self._accept(seq, payload, now)

    def _replay_gap(self, start: int, seq: int, payload: bytes, now: float) -> bool:
        """Ask for the batches from `start` on and hold this one; False if that cannot help."""
        if not self.can_replay or self._replay is not None or (self.epoch, start) in self._hopeless:
            return False
        self._request_replay(start, now)
        assert self._replay is not None
        hold(self._replay, [(seq, payload)])
        return True

    def _is_duplicate(self, seq: int, payload: bytes) -> bool:
        return self._recent.holds(seq, payload)

    def _restart(self, seq: int, now: float) -> None:
        """The seq went backwards: the publisher started over with an empty cache."""
        self.counters.restarts += 1
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
        self._degradation.known_again(None, now)
        self.expected = None
        self._recent.clear()

    def _degrade(self, reason: str, from_seq: int, to_seq: int | None, now: float) -> None:
        self._degradation.degrade(reason, from_seq, to_seq, now, self.epoch)

    def _apply(self, seq: int, payload: bytes, now: float) -> None:
        self.expected = seq + 1
        self.last_seq = seq
        self._recent.add(seq, payload)
        if len(payload) > self.max_message_bytes:
            self._malformed(MalformedKind.OVERSIZE, seq, f"{len(payload)} bytes")
            self._degrade("oversize batch dropped", seq, seq, now)
            return
        errors: list[MalformedPayload] = []
        try:
            batch = self.decoder.decode(payload, seq, errors)
        except MalformedPayload as exc:
            self._malformed(exc.kind, seq, exc.detail)
            self._degrade("undecodable batch", seq, seq, now)
            return
        for error in errors:
            self._malformed(error.kind, seq, error.detail)
            if error.kind.loses_map_state:
                self._degrade("event dropped", seq, seq, now)
        if batch.rank is not None and batch.rank != self.stream.rank:
            self.counters.rank_mismatches += 1
        sink, ts = self.sink, batch.ts
        if sink is not None:
            quiet = self._quiet
            if not quiet[0] <= ts < quiet[1]:
                self._quiet = sink.instant(self.stream, ts, self.map)
        degraded = self._degradation.current is not None
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

    def _on_clear(self, cleared: ClearedMap) -> None:
        self._quiet = EVERY_BATCH  # the sink may want to see the map sooner after a clear
        if self.sink is not None:
            self.sink.map_cleared(cleared)

    # --- replay -------------------------------------------------------------------------------
    def _request_replay(self, start: int, now: float, verify_seq: int | None = None) -> None:
        if not self.can_replay or self._replay is not None:
            return
        self._replay = Replay(start, now + self.replay_timeout_s, self.epoch, verify_seq=verify_seq)
        self._outbox = ReplayRequest(start)
        self.counters.replays_requested += 1

    def _replay_done(self, now: float) -> None:
        self.counters.replays_ok += 1
        assert self._replay is not None
        # The publisher had nothing after what it replayed: with nothing heard since, there
        # is no tail to check.
        nothing_since = not self._replay.held
        self._release_held(now)
        if nothing_since and self.expected is not None:
            self._tail_checked = (self.epoch, self.expected)

    def _replay_failed(self, why: str, now: float) -> None:
        replay = self._replay
        assert replay is not None
        self.counters.replays_failed += 1
        self._hopeless.add((replay.epoch, replay.start_seq))
        self._log.warning(f"replay:{self.stream}", "%s: %s", self.stream, why)
        self._release_held(now)

    def _supersede_replay(self, now: float) -> None:
        """A restart seen mid-replay: this replay is of the new run from the wrong seq, so ask
        again from 0, keeping what arrived live meanwhile."""
        replay = self._replay
        assert replay is not None
        self._replay = None
        self._request_replay(0, now)
        assert self._replay is not None
        hold(self._replay, replay.held)

    def _release_held(self, now: float) -> None:
        """Apply what arrived live during the replay.

        A gap still open from the replay's start cannot be filled by asking again; one that a
        restart opens (a new epoch) can.
        """
        replay = self._replay
        assert replay is not None
        self._replay = None
        self._hopeless.add((replay.epoch, replay.start_seq))
        held = replay.held
        for i, (seq, payload) in enumerate(held):  # arrival order: a restart makes seqs go back
            expected = self.expected
            if (
                replay.epoch == self.epoch
                and expected is not None
                and replay.start_seq <= seq < expected
            ):
                self.counters.duplicates += 1  # the replay already brought it
                continue
            self._accept(seq, payload, now)
            if self._replay is not None:
                # That batch showed a restart and asked for a new replay: the rest waits for it.
                hold(self._replay, held[i + 1 :])
                return
        if not held or replay.received == 0:
            # Nothing to show the replay could not help: asking again later may.
            self._hopeless.discard((replay.epoch, replay.start_seq))

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
        return int.from_bytes(frame, "big")
