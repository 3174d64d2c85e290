"""The tail of a stream: batches lost at its end show no gap, since no later seq comes. After a
silence the publisher's replay socket is asked for everything after the last applied batch;
without one, the stream says its tail is unverified."""

from __future__ import annotations

import pytest

from kvscope.collector import replay
from kvscope.collector.ingest import StreamIngest
from kvscope.collector.replay import END_SEQ
from kvscope.collector.types import StreamId
from tests.test_ingest import frames, hashes, payload, store

STREAM = StreamId("r1", 0)
AFTER = 5.0


def reply(seq: int, body: bytes) -> list[bytes]:
    return [b"", b"topic", seq.to_bytes(8, "big"), body]


def end() -> list[bytes]:
    return [b"", b"topic", END_SEQ, b""]


def chain(n: int) -> list[bytes]:
    return [payload(store(s + 1, parent=s or None)) for s in range(n)]


def following(n: int) -> tuple[StreamIngest, list[bytes]]:
    """A stream that applied seqs 0..n-1 at t = 0..n-1, with a replay socket."""
    ingest = StreamIngest(STREAM, can_replay=True, tail_check_after_s=AFTER)
    ingest.expected = 0  # as after the connect replay
    bodies = chain(n + 4)
    for seq in range(n):
        ingest.live_frames(frames(seq, bodies[seq]), float(seq))
    return ingest, bodies


def test_after_a_silence_the_lost_tail_is_replayed_and_applied() -> None:
    ingest, bodies = following(4)  # the publisher also sent 4..6; they were dropped
    assert ingest.tick(3.0 + AFTER - 0.1) is None
    assert ingest.tail_unverified(3.0 + AFTER)
    request = ingest.tick(3.0 + AFTER)
    assert request is not None and request.start_seq == 4
    assert ingest.checking_tail
    for seq in (4, 5, 6):
        assert not ingest.replay_frames(reply(seq, bodies[seq]), 9.0)
    assert ingest.replay_frames(end(), 9.0)
    assert ingest.last_seq == 6 and hashes(ingest) == set(range(1, 8))
    assert ingest.degraded is None and ingest.counters.gaps == 0
    assert ingest.counters.tail_checks == 1
    assert not ingest.tail_unverified(20.0)
    assert ingest.tick(20.0) is None  # asked once per position


def test_an_empty_answer_verifies_the_tail_and_new_batches_ask_again() -> None:
    ingest, bodies = following(3)
    request = ingest.tick(2.0 + AFTER)
    assert request is not None and request.start_seq == 3
    assert ingest.replay_frames(end(), 8.0)
    assert not ingest.tail_unverified(30.0) and ingest.tick(30.0) is None
    assert ingest.counters.replays_failed == 0
    ingest.live_frames(frames(3, bodies[3]), 31.0)
    assert ingest.tick(31.0 + AFTER) is not None


def test_live_batches_during_the_tail_check_wait_for_it() -> None:
    ingest, bodies = following(2)
    assert ingest.tick(1.0 + AFTER) is not None
    ingest.live_frames(frames(3, bodies[3]), 7.0)  # 2 was lost; 3 arrives meanwhile
    assert not ingest.replay_frames(reply(2, bodies[2]), 7.0)
    assert not ingest.replay_frames(reply(3, bodies[3]), 7.0)
    assert ingest.replay_frames(end(), 7.0)
    assert ingest.last_seq == 3 and ingest.degraded is None
    assert hashes(ingest) == {1, 2, 3, 4}


def test_without_a_replay_socket_the_tail_is_said_to_be_unverified() -> None:
    ingest = StreamIngest(STREAM, can_replay=False, tail_check_after_s=AFTER)
    for seq, body in enumerate(chain(3)):
        ingest.live_frames(frames(seq, body), float(seq))
    assert not ingest.tail_unverified(2.0 + AFTER - 0.1)
    assert ingest.tail_unverified(2.0 + AFTER)
    assert ingest.tick(2.0 + AFTER) is None
    assert ingest.counters.tail_checks == 0


def test_a_gap_the_replay_cannot_fill_is_one_gap() -> None:
    ingest, bodies = following(2)
    request = ingest.live_frames(frames(5, bodies[5]), 3.0)
    assert request is not None and request.start_seq == 2
    assert not ingest.replay_frames(reply(4, bodies[4]), 3.0)  # the buffer starts past 2
    ingest.replay_frames(end(), 3.0)
    assert ingest.counters.gaps == 1
    assert ingest.degraded is not None


def test_live_batches_held_during_a_replay_are_bounded_in_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replay, "MAX_HELD_BYTES", 2_000)
    ingest, bodies = following(1)
    big = [payload(store(100 + i, parent=None), ts=float(i)) for i in range(40)]
    assert ingest.live_frames(frames(5, big[0]), 2.0) is not None  # a gap: replay asked
    for i, body in enumerate(big[1:], 6):
        ingest.live_frames(frames(i, body), 2.0)
    # Past the bound the replay was given up: its batches applied, the gap declared.
    assert not ingest.replaying
    assert ingest.counters.replays_failed == 1
    assert ingest.degraded is not None
