"""When a checkpoint is due (storage/checkpoint_pacing.py): by the log's bytes as stored, by
count, or forced; and the size the writer reports wins over the estimate, in either order."""

from __future__ import annotations

from kvscope.storage.checkpoint_pacing import ESTIMATED_PACKING, CheckpointPacer


def test_due_once_the_stored_log_is_ratio_times_the_checkpoint_on_disk() -> None:
    pacer = CheckpointPacer(ratio=2.0, every_batches=1_000)
    pacer.queued((0, 1), raw_size=1_000)
    pacer.written((0, 1), size_on_disk=100)
    pacer.packed(raw=400, stored=100)  # the log packs 4:1
    # Due at 2 x 100 stored bytes = 800 received.
    assert not any(pacer.batch(100) for _ in range(7))
    assert pacer.batch(100)


def test_due_by_count_and_when_forced_before_any_report() -> None:
    pacer = CheckpointPacer(ratio=2.0, every_batches=3)
    assert [pacer.batch(10**9) for _ in range(3)] == [False, False, True]
    pacer.queued((0, 3), raw_size=10)
    pacer.forced = True
    assert pacer.batch(0)


def test_a_size_reported_before_the_ingest_thread_noted_its_checkpoint_is_kept() -> None:
    """The writer thread may write a checkpoint and report its size before the ingest thread
    (which queued it) notes it: the report must not be lost to the estimate."""
    early = CheckpointPacer(ratio=2.0, every_batches=1_000)
    early.packed(raw=100, stored=100)
    early.written((0, 5), size_on_disk=50)
    early.queued((0, 5), raw_size=1_000)
    late = CheckpointPacer(ratio=2.0, every_batches=1_000)
    late.packed(raw=100, stored=100)
    late.queued((0, 5), raw_size=1_000)
    late.written((0, 5), size_on_disk=50)
    assert early.on_disk == late.on_disk == 50
    assert early.due_bytes == late.due_bytes == 100


def test_a_report_of_an_older_checkpoint_is_ignored() -> None:
    pacer = CheckpointPacer(ratio=2.0, every_batches=1_000)
    pacer.queued((0, 1), raw_size=100)
    pacer.queued((0, 9), raw_size=1_000)
    pacer.written((0, 1), size_on_disk=7)
    assert pacer.on_disk == 1_000 * ESTIMATED_PACKING
