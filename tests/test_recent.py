"""The duplicate window: a repeat is the same seq and the same bytes, whatever their size; a
publisher sending large batches cannot make the window hold their bytes."""

from __future__ import annotations

from kvscope.collector.ingest import StreamIngest
from kvscope.collector.recent import KEPT_BYTES, RECENT_BATCHES, RecentBatches
from kvscope.collector.types import StreamId
from tests.test_ingest import payload, store


def test_small_and_large_payloads_are_told_apart_exactly() -> None:
    recent = RecentBatches()
    small, large = b"x" * 100, b"y" * (KEPT_BYTES + 1)
    recent.add(1, small)
    recent.add(2, large)
    assert recent.holds(1, small) and recent.holds(2, large)
    assert not recent.holds(2, small) and not recent.holds(1, large)
    assert not recent.holds(2, large[:-1] + b"z")  # same size, other bytes
    assert not recent.holds(3, large)


def test_the_window_keeps_digests_of_large_payloads_and_forgets_the_oldest() -> None:
    recent = RecentBatches()
    big = bytes(4 * 1024 * 1024)
    for seq in range(RECENT_BATCHES + 10):
        recent.add(seq, big)
    assert recent.kept_bytes() == RECENT_BATCHES * 16
    assert not recent.holds(0, big) and recent.holds(RECENT_BATCHES + 9, big)


def test_a_stream_keeps_the_digest_of_a_large_batch_it_applies_and_knows_its_repeat() -> None:
    ingest = StreamIngest(StreamId("r", 0), can_replay=False)
    large = payload(store(*range(1, 3000)))
    assert len(large) > KEPT_BYTES
    for _ in range(2):
        ingest.live_frames([b"", (0).to_bytes(8, "big"), large], 0.0)
    ingest.live_frames([b"", (1).to_bytes(8, "big"), payload(store(5000, parent=1))], 0.0)
    assert ingest.counters.duplicates == 1 and ingest.counters.batches_applied == 2
    assert ingest._recent.kept_bytes() == 16 + len(payload(store(5000, parent=1)))
