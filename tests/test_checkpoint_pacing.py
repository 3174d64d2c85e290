"""When a checkpoint is due (storage/_checkpoint_pacing.pyx): by the block-events applied since the
last, against the blocks that one held; by count; or forced."""

from __future__ import annotations

from kvscope.collector.types import TableKey
from kvscope.storage._checkpoint_pacing import MIN_BLOCKS, CheckpointPacer

GPU = TableKey("GPU", 0)
CPU = TableKey("CPU", 0)


def test_due_once_the_events_since_reach_per_block_times_the_blocks_checkpointed() -> None:
    pacer = CheckpointPacer(per_block=2.0, every_batches=10**9)
    pacer.queued(blocks=10 * MIN_BLOCKS)
    due = 2 * 10 * MIN_BLOCKS
    # Stored and removed blocks of every table count.
    assert not pacer.batch({GPU: [due // 2 - 1, 0], CPU: [0, due // 2]})
    assert pacer.batch({GPU: [0, 1]})


def test_a_small_map_counts_as_min_blocks() -> None:
    """From the start (no checkpoint yet) and after a checkpoint of a near-empty map."""
    for queued in (None, 0, MIN_BLOCKS // 2):
        pacer = CheckpointPacer(per_block=4.0, every_batches=10**9)
        if queued is not None:
            pacer.queued(blocks=queued)
        assert not pacer.batch({GPU: [4 * MIN_BLOCKS - 1, 0]})
        assert pacer.batch({GPU: [1, 0]})


def test_queued_starts_the_count_again() -> None:
    pacer = CheckpointPacer(per_block=1.0, every_batches=10**9)
    assert pacer.batch({GPU: [MIN_BLOCKS, 0]})
    pacer.queued(blocks=MIN_BLOCKS)
    assert not pacer.batch({GPU: [MIN_BLOCKS - 1, 0]})


def test_due_by_count_and_when_forced() -> None:
    pacer = CheckpointPacer(per_block=2.0, every_batches=3)
    assert [pacer.batch({}) for _ in range(3)] == [False, False, True]
    pacer.queued(blocks=10**6)
    pacer.force()
    assert pacer.batch({})
    pacer.queued(blocks=10**6)
    assert not pacer.batch({GPU: [1, 1]})


def test_an_infinite_ratio_paces_by_count_only() -> None:
    pacer = CheckpointPacer(per_block=float("inf"), every_batches=2)
    assert [pacer.batch({GPU: [10**9, 0]}) for _ in range(2)] == [False, True]


def test_a_batch_counted_by_its_block_events_paces_as_its_changes_do() -> None:
    """The store's writer hands the pacer the block-events the rollup counted already."""
    by_changes, by_events = (CheckpointPacer(per_block=1.0, every_batches=3) for _ in range(2))
    batches = [{GPU: [MIN_BLOCKS - 2, 1]}, {CPU: [0, 1]}, {}, {GPU: [1, 0]}, {}, {}]
    due = [by_changes.batch(changes) for changes in batches]
    assert [by_events.counted(sum(map(sum, c.values()))) for c in batches] == due
    assert due == [False, True, True, True, True, True]
    assert (by_events.events_since, by_events.batches_since) == (MIN_BLOCKS + 1, 6)
