"""When a checkpoint is due (storage/_checkpoint_pacing.pyx): by the block-events applied since the
last, against the blocks that one held; by count; or forced."""

from __future__ import annotations

from kvscope.collector.types import TableKey
from kvscope.storage._checkpoint_pacing import MIN_BLOCKS, CheckpointPacer
from kvscope.storage._rollup_counts import RollupCounts

GPU = TableKey("GPU", 0)
CPU = TableKey("CPU", 0)


def batch(pacer: CheckpointPacer, changes: dict[TableKey, list[int]]) -> bool:
    """A batch of `changes` counted as the store's writer counts it: its block-events by the
    rollup's count, handed to the pacer."""
    return pacer.counted(RollupCounts().count(changes))


def test_due_once_the_events_since_reach_per_block_times_the_blocks_checkpointed() -> None:
    pacer = CheckpointPacer(per_block=2.0, every_batches=10**9)
    pacer.queued(blocks=10 * MIN_BLOCKS)
    due = 2 * 10 * MIN_BLOCKS
    # Stored and removed blocks of every table count.
    assert not batch(pacer, {GPU: [due // 2 - 1, 0], CPU: [0, due // 2]})
    assert batch(pacer, {GPU: [0, 1]})


def test_a_small_map_counts_as_min_blocks() -> None:
    """From the start (no checkpoint yet) and after a checkpoint of a near-empty map."""
    for queued in (None, 0, MIN_BLOCKS // 2):
        pacer = CheckpointPacer(per_block=4.0, every_batches=10**9)
        if queued is not None:
            pacer.queued(blocks=queued)
        assert not batch(pacer, {GPU: [4 * MIN_BLOCKS - 1, 0]})
        assert batch(pacer, {GPU: [1, 0]})


def test_queued_starts_the_count_again() -> None:
    pacer = CheckpointPacer(per_block=1.0, every_batches=10**9)
    assert batch(pacer, {GPU: [MIN_BLOCKS, 0]})
    pacer.queued(blocks=MIN_BLOCKS)
    assert not batch(pacer, {GPU: [MIN_BLOCKS - 1, 0]})


def test_due_by_count_and_when_forced() -> None:
    pacer = CheckpointPacer(per_block=2.0, every_batches=3)
    assert [batch(pacer, {}) for _ in range(3)] == [False, False, True]
    pacer.queued(blocks=10**6)
    pacer.force()
    assert batch(pacer, {})
    pacer.queued(blocks=10**6)
    assert not batch(pacer, {GPU: [1, 1]})


def test_an_infinite_ratio_paces_by_count_only() -> None:
    pacer = CheckpointPacer(per_block=float("inf"), every_batches=2)
    assert [batch(pacer, {GPU: [10**9, 0]}) for _ in range(2)] == [False, True]
