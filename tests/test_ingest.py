"""Per-stream rules without sockets: sequence, duplicates, gaps, replay, restarts, bad input."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.replay import END_SEQ, ReplayRequest
from kvscope.collector.sink import ClearedMap, ClearReason, NullSink
from kvscope.collector.types import StreamId

STREAM = StreamId("r1", 0)


def store(*hashes: int, parent: int | None = None) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": [h % 1000 for h in hashes for _ in range(16)],
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def remove(*hashes: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


CLEAR: dict[str, Any] = {"type": "AllBlocksCleared"}


def payload(*events: dict[str, Any], ts: float = 1.0) -> bytes:
    return msgspec.msgpack.encode([ts, list(events), 0])


def frames(seq: int, body: bytes) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), body]


class Recorder(NullSink):
    def __init__(self) -> None:
        self.cleared: list[ClearedMap] = []

    def map_cleared(self, cleared: ClearedMap) -> None:
        self.cleared.append(cleared)


def make(can_replay: bool = False, **kw: Any) -> tuple[StreamIngest, Recorder]:
    rec = Recorder()
    return StreamIngest(STREAM, can_replay=can_replay, sink=rec, **kw), rec


def hashes(ingest: StreamIngest) -> set[int]:
    return {h for h, _ in ingest.map.counts()}


def test_in_order_batches_apply_and_an_exact_duplicate_is_dropped() -> None:
    ingest, _ = make()
    ingest.live_frames(frames(0, payload(store(1, 2))), 0.0)
    ingest.live_frames(frames(1, payload(store(3, parent=2))), 0.0)
    ingest.live_frames(frames(1, payload(store(3, parent=2))), 0.0)
    assert hashes(ingest) == {1, 2, 3}
    assert ingest.counters.duplicates == 1
    assert ingest.counters.restarts == 0
    assert ingest.degraded is None


def test_a_gap_without_replay_degrades_the_map_until_the_next_clear() -> None:
    ingest, _ = make()
    ingest.live_frames(frames(0, payload(store(1))), 0.0)
    ingest.live_frames(frames(3, payload(store(5))), 1.0)
    assert ingest.degraded is not None
    assert (ingest.degraded.from_seq, ingest.degraded.to_seq) == (1, 2)
    assert ingest.counters.missing_batches == 2
    ingest.live_frames(frames(4, payload(CLEAR, store(9))), 2.0)
    assert ingest.degraded is None
    assert ingest.degraded_history[0].cleared_at_seq == 4
    assert hashes(ingest) == {9}


def test_joining_mid_stream_without_replay_says_the_map_is_unknown() -> None:
    ingest, _ = make()
    ingest.live_frames(frames(40, payload(store(1))), 0.0)
    assert ingest.degraded is not None
    assert ingest.degraded.reason == "joined mid-stream"


def test_seq_going_back_is_a_restart_with_an_empty_map() -> None:
    ingest, rec = make()
    for seq in range(3):
        ingest.live_frames(frames(seq, payload(store(seq + 10))), 0.0)
    ingest.live_frames(frames(0, payload(store(99), ts=2.0)), 5.0)
    assert ingest.epoch == 1 and ingest.counters.restarts == 1
    assert hashes(ingest) == {99}
    assert [c.reason for c in rec.cleared] == [ClearReason.RESTART]
    assert rec.cleared[0].epoch == 0
    assert {h for t in rec.cleared[0].tables.values() for h in t.counts()} == {10, 11, 12}
    assert list(ingest.restarts_at) == [(1, 5.0)]


def test_a_gap_is_replayed_and_live_batches_wait_for_it() -> None:
    ingest, _ = make(can_replay=True)
    assert ingest.connected(0.0) == ReplayRequest(0)
    assert ingest.replay_frames([b"", b"", END_SEQ, b""], 0.0)  # nothing published yet
    ingest.live_frames(frames(0, payload(store(1))), 0.0)
    request = ingest.live_frames(frames(3, payload(remove(2))), 0.0)
    assert request == ReplayRequest(1)
    assert ingest.live_frames(frames(4, payload(store(4, parent=1))), 0.0) is None
    # vLLM >= 0.26 replies [empty, topic, seq, payload]; older ones [empty, seq, payload].
    assert not ingest.replay_frames([b"", b"t", (1).to_bytes(8, "big"), payload(store(2))], 0.1)
    assert not ingest.replay_frames([b"", (2).to_bytes(8, "big"), payload(store(3))], 0.1)
    assert not ingest.replay_frames([b"", b"t", (3).to_bytes(8, "big"), payload(remove(2))], 0.1)
    assert ingest.replay_frames([b"", b"", END_SEQ, b""], 0.1)
    assert hashes(ingest) == {1, 3, 4}
    assert ingest.counters.replays_ok == 2
    assert ingest.counters.duplicates == 1  # seq 3 came live and by replay
    assert ingest.degraded is None and ingest.last_seq == 4


def test_a_replay_that_starts_late_cannot_fill_the_gap() -> None:
    ingest, _ = make(can_replay=True)
    ingest.live_frames(frames(0, payload(store(1))), 0.0)
    assert ingest.live_frames(frames(9, payload(store(9))), 0.0) == ReplayRequest(1)
    ingest.replay_frames([b"", b"", (5).to_bytes(8, "big"), payload(store(5))], 0.0)
    ingest.replay_frames([b"", b"", END_SEQ, b""], 0.0)
    # 1..4 are gone for good; 6..8 may have been lost live after the replay was served.
    assert ingest.take_replay_request() == ReplayRequest(6)
    ingest.replay_frames([b"", b"", END_SEQ, b""], 0.0)
    assert ingest.take_replay_request() is None
    assert ingest.degraded is not None
    # Two causes, two intervals: the batches the replay no longer held, and those it could
    # not show were never lost.
    assert [(d.from_seq, d.to_seq) for d in ingest.degraded_history] == [(1, 4), (6, 8)]
    assert ingest.last_seq == 9


def test_a_replay_that_never_ends_times_out_and_degrades() -> None:
    ingest, _ = make(can_replay=True, replay_timeout_s=2.0)
    ingest.live_frames(frames(0, payload(store(1))), 0.0)
    assert ingest.live_frames(frames(2, payload(store(2))), 0.0) == ReplayRequest(1)
    ingest.tick(1.0)
    assert ingest.replaying
    ingest.tick(2.5)
    assert not ingest.replaying
    assert ingest.counters.replays_failed == 1
    assert ingest.degraded is not None and ingest.last_seq == 2
    # The same hopeless gap is not asked for again; a new one is.
    assert ingest.live_frames(frames(5, payload(store(5))), 3.0) == ReplayRequest(3)


@pytest.mark.parametrize(
    ("bad", "kind", "degrades"),
    [
        ([b"", b"\x00" * 8], "frame_count", False),
        ([b"", b"\x00" * 4, b"x"], "seq_length", False),
        ([b"", b"\x80" + bytes(7), payload(store(9))], "seq_range", False),
        ([b"", b"\xff" * 8, payload(store(9))], "seq_range", False),
        ([b"", (1).to_bytes(8, "big"), b"\xc1\xc1"], "undecodable_payload", True),
        ([b"", (1).to_bytes(8, "big"), payload({"type": "Nope"})], "unknown_event_type", False),
        ([b"", (1).to_bytes(8, "big"), payload(remove(1), ts=1.0) + b"x" * 600], "oversize", True),
    ],
)
def test_bad_input_is_counted_and_loses_nothing_else(
    bad: list[bytes], kind: str, degrades: bool
) -> None:
    ingest, _ = make(max_message_bytes=512)
    ingest.live_frames(frames(0, payload(store(1))), 0.0)
    ingest.live_frames(bad, 0.0)
    seq_after = 2 if bad[1] == (1).to_bytes(8, "big") else 1
    ingest.live_frames(frames(seq_after, payload(store(2, parent=1))), 0.0)
    assert ingest.counters.malformed[kind] == 1
    assert (ingest.degraded is not None) is degrades
    assert hashes(ingest) == {1, 2}
    assert ingest.map.totals().hittable == 2


def test_a_seq_that_keeps_going_back_is_refused_not_a_restart_storm() -> None:
    ingest, rec = make()
    for seq in range(5):
        ingest.live_frames(frames(seq, payload(store(seq + 1, parent=seq or None))), 0.0)
    ingest.live_frames(frames(2, payload(store(70))), 1.0)  # a restart: seq back to 2
    assert ingest.counters.restarts == 1 and ingest.epoch == 1
    for n in range(50):  # a hostile publisher: back again, and again
        ingest.live_frames(frames(1, payload(store(80 + n))), 1.0)
        ingest.live_frames(frames(3 + n, payload(store(200 + n))), 1.0)
    assert ingest.counters.restarts == 1 and len(rec.cleared) == 1
    assert ingest.counters.malformed["seq_back"] == 50
    assert ingest.degraded is not None
    for n in range(100):  # enough messages since: a seq going back is a restart again
        ingest.live_frames(frames(53 + n, payload(store(400 + n))), 2.0)
    ingest.live_frames(frames(0, payload(store(9))), 3.0)
    assert ingest.counters.restarts == 2 and ingest.epoch == 2
    assert ingest.degraded is None and hashes(ingest) == {9}


def test_the_live_path_of_every_stream_is_the_compiled_one() -> None:
    """Each live message in order is handled and applied in C (collector/_ingest_live.pyx):
    no Python frame of its own for either call."""
    from kvscope.collector._ingest_live import LiveIngest

    assert StreamIngest.live_frames is LiveIngest.live_frames
    assert StreamIngest._apply is LiveIngest._apply
