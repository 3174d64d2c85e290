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
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvscope.collector.errors import MalformedKind, MalformedPayload
from kvscope.collector.prefix_map import ClearReason, MapListener, PrefixMap
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.types import AllCleared, Batch, StreamId
from kvscope.collector.wire import BatchDecoder

logger = logging.getLogger(__name__)

SEQ_BYTES = 8
END_SEQ = b"\xff" * SEQ_BYTES
"""The seq frame of a replay's end marker."""
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
RECENT_BATCHES = 256
"""How many applied payloads are remembered to tell a duplicate from a restart."""
MAX_HELD_LIVE = 100_000
"""Live batches held while a replay runs; past this the replay is abandoned."""


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


@dataclass
class StreamCounters:
    batches_applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    missing_batches: int = 0
    replays_requested: int = 0
    replays_ok: int = 0
    replays_failed: int = 0
    restarts: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    rank_mismatches: int = 0


@dataclass
class _Replay:
    start_seq: int
    deadline: float
    epoch: int = 0
    held: list[tuple[int, bytes]] = field(default_factory=list)
    received: int = 0
    verify_seq: int | None = None
    """The seq of our last applied batch, whose payload the replay must repeat exactly."""


BatchObserver = Callable[["StreamIngest", Batch, bytes, float], None]
"""Called after each batch is applied, with its payload as received and the receive time:
history and rollups hang off this."""


PreApplyHook = Callable[["StreamIngest", Batch], None]
"""Called with each decoded batch just before it changes the map."""


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """Ask the publisher's replay socket for every buffered batch from `start_seq` on."""

    start_seq: int


class StreamIngest:
    """Follows one publisher's sequence and keeps its `PrefixMap` exact, or says it is not."""

    def __init__(
        self,
        stream: StreamId,
        *,
        can_replay: bool,
        replay_timeout_s: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        listeners: list[MapListener] | None = None,
        observers: list[BatchObserver] | None = None,
        pre_apply: list[PreApplyHook] | None = None,
    ) -> None:
        self.stream = stream
        self.observers = list(observers or [])
        self.pre_apply = list(pre_apply or [])
        self.can_replay = can_replay
        self.replay_timeout_s = replay_timeout_s
        self.max_message_bytes = max_message_bytes
        self.map = PrefixMap(stream, listeners or [])
        self.decoder = BatchDecoder()
        self.counters = StreamCounters()
        self.epoch = 0
        self.expected: int | None = None
        """The next seq to apply; None until the stream's position is known."""
        self.last_seq: int | None = None
        self.last_message_at: float | None = None
        self.degraded: DegradedInterval | None = None
        self.degraded_history: list[DegradedInterval] = []
        self.restarts_at: list[tuple[int, float]] = []
        """(new epoch, receive time) of each restart noticed."""
        self._replay: _Replay | None = None
        self._hopeless: set[tuple[int, int]] = set()
        """(epoch, start seq) of gaps a replay could not fill: they are not asked for again."""
        self._outbox: ReplayRequest | None = None
        self._recent: deque[tuple[int, bytes]] = deque(maxlen=RECENT_BATCHES)
        self._log = RateLimitedLog(logger)

    def resume(
        self,
        prefix_map: PrefixMap,
        epoch: int,
        last_seq: int,
        last_payload: bytes,
        degraded: DegradedInterval | None = None,
    ) -> None:
        """Start from a map kept elsewhere (a store, after a crash): the map after `last_seq`.

        The first replay after connecting asks from `last_seq` and checks that batch against
        `last_payload`: a publisher that restarted meanwhile is noticed, and everything after
        `last_seq` is fetched.
        """
        prefix_map.listeners = self.map.listeners
        self.map = prefix_map
        self.epoch = epoch
        self.last_seq = last_seq
        self.expected = last_seq + 1
        self._recent.clear()
        self._recent.append((last_seq, last_payload))
        self.degraded = degraded
        self.degraded_history = [degraded] if degraded is not None else []

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
        self.last_message_at = now
        if len(frames) != 3:
            self._malformed(MalformedKind.FRAME_COUNT, None, f"{len(frames)} frames")
            return None
        _topic, seq_frame, payload = frames
        seq = self._seq_of(seq_frame)
        if seq is None:
            return None
        if self._replay is not None:
            if len(self._replay.held) < MAX_HELD_LIVE:
                self._replay.held.append((seq, payload))
                return None
            self._replay_failed("too many live batches held during replay", now)
        if self._replay is not None:
            self._replay.held.append((seq, payload))  # a replay asked for while releasing
        elif seq == self.expected:
            self._apply(seq, payload, now)  # in order, nearly every batch: no rules to weigh
        else:
            self._accept(seq, payload, now)
        return self.take_replay_request()

    def replay_frames(self, frames: list[bytes], now: float) -> bool:
        """One reply from the replay socket; True once that replay has ended (marker or error).

        Layouts: `[b"", topic, seq, payload]` (vLLM >= 0.26) or `[b"", seq, payload]` (older),
        each ending with a marker whose seq frame is 0xff * 8. A replay that ends may leave the
        next one to send in `take_replay_request`.
        """
        replay = self._replay
        if replay is None:
            return True  # a late reply to a replay already given up: nothing to do
        if frames and frames[0] == b"":
            frames = frames[1:]
        if len(frames) == 3:
            _topic, seq_frame, payload = frames
        elif len(frames) == 2:
            seq_frame, payload = frames
        else:
            self._malformed(MalformedKind.BAD_REPLAY, None, f"{len(frames)} frames")
            self._replay_failed("malformed replay reply", now)
            return True
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
        """Give up on a replay that has not ended in time."""
        if self._replay is not None and now >= self._replay.deadline:
            self._replay_failed("replay timed out", now)
        return self.take_replay_request()

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
        self._replay.held.append((seq, payload))
        return True

    def _is_duplicate(self, seq: int, payload: bytes) -> bool:
        return any(s == seq and p == payload for s, p in self._recent)

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
        self._undegrade(None, now)
        self.expected = None
        self._recent.clear()

    def _apply(self, seq: int, payload: bytes, now: float) -> None:
        self.expected = seq + 1
        self.last_seq = seq
        self._recent.append((seq, payload))
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
        for hook in self.pre_apply:
            hook(self, batch)
        try:
            self.map.apply(batch, self.epoch, self.degraded is not None, now)
        except MalformedPayload as exc:  # over a limit: refused whole, nothing applied
            self._malformed(exc.kind, seq, exc.detail)
            self._degrade("batch refused", seq, seq, now)
            return
        self.counters.batches_applied += 1
        if self.degraded is not None and any(type(e) is AllCleared for e in batch.events):
            self._undegrade(seq, now)
        for observer in self.observers:
            observer(self, batch, payload, now)

    # --- replay -------------------------------------------------------------------------------
    def _request_replay(self, start: int, now: float, verify_seq: int | None = None) -> None:
        if not self.can_replay or self._replay is not None:
            return
        self._replay = _Replay(
            start, now + self.replay_timeout_s, self.epoch, verify_seq=verify_seq
        )
        self._outbox = ReplayRequest(start)
        self.counters.replays_requested += 1

    def _replay_done(self, now: float) -> None:
        self.counters.replays_ok += 1
        self._release_held(now)

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
        self._replay.held.extend(replay.held)

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
                self._replay.held.extend(held[i + 1 :])
                return
        if not held or replay.received == 0:
            # Nothing to show the replay could not help: asking again later may.
            self._hopeless.discard((replay.epoch, replay.start_seq))

    # --- degraded -----------------------------------------------------------------------------
    def _degrade(self, reason: str, from_seq: int, to_seq: int | None, now: float) -> None:
        self._log.warning(
            f"degraded:{self.stream}",
            "%s: map degraded (%s, seq %d..%s): it is incomplete until the next clear or restart",
            self.stream,
            reason,
            from_seq,
            to_seq,
        )
        if self.degraded is None:
            self.degraded = DegradedInterval(reason, from_seq, to_seq, now, self.epoch)
            self.degraded_history.append(self.degraded)
        elif to_seq is not None:
            self.degraded.to_seq = max(self.degraded.to_seq or to_seq, to_seq)

    def _undegrade(self, seq: int | None, now: float) -> None:
        if self.degraded is not None:
            self.degraded.cleared_at_seq = seq
            self.degraded.cleared_at = now
            self.degraded = None

    # --- input errors -------------------------------------------------------------------------
    def _seq_of(self, frame: bytes) -> int | None:
        if len(frame) != SEQ_BYTES:
            self._malformed(MalformedKind.SEQ_LENGTH, None, f"{len(frame)}-byte seq frame")
            return None
        return int.from_bytes(frame, "big")

    def _malformed(self, kind: MalformedKind, seq: int | None, detail: str) -> None:
        self.counters.malformed[kind.value] += 1
        self._log.warning(
            f"{kind}:{self.stream}", "%s: refused %s at seq %s: %s", self.stream, kind, seq, detail
        )
