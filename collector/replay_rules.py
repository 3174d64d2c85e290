"""The replay half of a stream's rules: asking vLLM's replay socket, following its replies,
checking a silent stream's tail, and releasing the live batches held meanwhile.

A part of `StreamIngest` (collector/ingest.py), which supplies the sequence rules it calls
(`_accept`, `_restart`) and the state both share; split off to keep each file to one concern.
"""

from __future__ import annotations

from collections.abc import Callable

from kvscope.collector.errors import MalformedKind
from kvscope.collector.ratelog import RateLimitedLog
from kvscope.collector.replay import END_SEQ, Replay, ReplayRequest, hold, reply_parts
from kvscope.collector.stream_counters import StreamCounters
from kvscope.collector.types import StreamId


class ReplayRules:
    stream: StreamId
    counters: StreamCounters
    can_replay: bool
    replay_timeout_s: float
    tail_check_after_s: float
    epoch: int
    expected: int | None
    last_message_at: float | None
    _replay: Replay | None
    _outbox: ReplayRequest | None
    _hopeless: set[tuple[int, int]]
    """(epoch, start seq) of gaps a replay could not fill: they are not asked for again."""
    _tail_checked: tuple[int, int] | None
    """(epoch, next seq) at the last tail check: asked again only once more batches came."""
    _log: RateLimitedLog
    _malformed: Callable[[MalformedKind, int | None, str], None]

    # --- what StreamIngest supplies -----------------------------------------------------------
    def _accept(self, seq: int, payload: bytes, now: float) -> None:
        raise NotImplementedError

    def _restart(self, seq: int, now: float) -> None:
        raise NotImplementedError

    def _is_duplicate(self, seq: int, payload: bytes) -> bool:
        raise NotImplementedError

    def _seq_of(self, frame: bytes) -> int | None:
        raise NotImplementedError

    def silent_for(self, now: float) -> float | None:
        return None if self.last_message_at is None else now - self.last_message_at

    # --- replays ------------------------------------------------------------------------------
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

    def _replay_gap(self, start: int, seq: int, payload: bytes, now: float) -> bool:
        """Ask for the batches from `start` on and hold this one; False if that cannot help."""
        if not self.can_replay or self._replay is not None or (self.epoch, start) in self._hopeless:
            return False
        self._request_replay(start, now)
        assert self._replay is not None
        hold(self._replay, [(seq, payload)])
        return True

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
