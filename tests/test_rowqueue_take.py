"""A take pops the queue's first rows and their sizes: all of them in one copy, some one by one,
and a size put ahead of its row left for the next take."""

from __future__ import annotations

from kvscope.storage.rowqueue import RowQueue


def _queue(n: int) -> RowQueue[int]:
    queue: RowQueue[int] = RowQueue(1000, linger_s=0.0)
    for i in range(n):
        assert queue.put(i, True, 10 + i)
    return queue


def test_take_all_and_part() -> None:
    queue = _queue(6)
    assert queue.take(4) == [0, 1, 2, 3]
    assert queue.memory_bytes == sum(range(10, 16))  # held until `done`
    queue.done(4)
    assert queue.memory_bytes == 14 + 15
    assert queue.take(100) == [4, 5]
    queue.done(2)
    assert queue.memory_bytes == 0
    assert len(queue._rows) == len(queue._sizes) == 0


def test_a_size_ahead_of_its_row_stays() -> None:
    queue = _queue(3)
    queue._put_size(7)  # a put half done: its size in, its row not yet
    assert queue._take_front(3) == ([0, 1, 2], 10 + 11 + 12)
    assert list(queue._sizes) == [7]
    assert queue._take_front(0) == ([], 0)


def test_sizes_kept_across_wrapping_and_growing() -> None:
    # The sizes are a ring that grows when full: taken in part, put past its end, grown while
    # wrapped, each take still sums its own rows' sizes.
    queue: RowQueue[int] = RowQueue(10_000, linger_s=0.0)
    put = taken = 0
    for puts, takes in [(50, 30), (40, 50), (200, 7), (500, 700), (3, 6)]:
        for _ in range(puts):
            assert queue.put(put, True, 1000 + put)
            put += 1
        rows, total = queue._take_front(takes)
        assert rows == list(range(taken, taken + takes))
        assert total == sum(1000 + r for r in rows)
        taken += takes
    assert queue._sizes == [] and len(queue._rows) == 0


def test_the_sizes_ring_gives_its_room_back_once_a_backlog_is_taken() -> None:
    # A backlog grows the ring to its peak; emptied, it keeps no more than a small one (the old
    # deque gave its blocks back too): the collector's RSS after a backlog is the map's.
    queue: RowQueue[int] = RowQueue(1_000_000, linger_s=0.0)
    for i in range(100_000):
        assert queue.put(i, True, 1)
    assert queue._sizes_room >= 100_000
    rows, total = queue._take_front(100_000)
    assert len(rows) == total == 100_000
    assert queue._sizes_room <= 4096
    assert queue.put(7, True, 3) and queue._take_front(1) == ([7], 3)


def test_the_writers_idle_work_fills_its_waits_but_never_a_whole_takes() -> None:
    """`idle` (the writer's compaction, a step a call) runs while the take would wait: for a
    first row, or lingering for more; not while a whole take is queued, nor once hurried."""
    calls: list[int] = []

    def idle() -> bool:
        calls.append(len(queue._rows))
        if len(calls) == 3:
            queue.put(len(calls), True)  # a row comes in meanwhile
        return len(calls) < 5

    queue: RowQueue[int] = RowQueue(1000, linger_s=0.0)
    assert queue.take(10, idle) == [3]  # waited for a first row: steps meanwhile
    assert calls == [0, 0, 0]
    queue.linger_s = 0.05
    queue.put(7, True)
    assert queue.take(10, idle) == [7]  # lingered for more: steps meanwhile
    assert calls[:5] == [0, 0, 0, 1, 1]
    asked = len(calls)
    for i in range(10):
        queue.put(i, True)
    assert queue.take(10, idle) == list(range(10))  # a whole take: no step
    queue.put(8, True)
    queue.hurry()
    assert queue.take(10, idle) == [8]  # hurried: no step
    assert len(calls) == asked
