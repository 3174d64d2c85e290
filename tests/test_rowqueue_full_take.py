"""A take waiting for rows is woken by the put that fills it (storage/rowqueue.py), not at its
next poll: a writer behind, idle meanwhile, starts the moment a whole transaction's rows are
queued. Shown with polls and lingers of an hour: only the wake can end the wait."""

from __future__ import annotations

import threading

from kvscope.storage.rowqueue import RowQueue

HOUR = 3600.0


def _taking(queue: RowQueue[int], max_rows: int) -> tuple[threading.Thread, list[list[int]]]:
    taken: list[list[int]] = []

    def take() -> None:
        rows = queue.take(max_rows)
        assert rows is not None
        taken.append(rows)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, taken


def _wait_until_waiting(queue: RowQueue[int]) -> None:
    """Until the taker waits for a full take (it says at which put)."""
    for _ in range(100_000):
        if queue._wake_at >= 0:
            return
        threading.Event().wait(0.001)
    raise AssertionError("the take never waited")


def _taken_after_puts(max_rows: int, droppable: list[bool]) -> list[list[int]]:
    """What a take of `max_rows` that waits on an empty queue returns once rows 0, 1, ... are
    put (each droppable or not) while it waits; [] if it still waits."""
    queue: RowQueue[int] = RowQueue(1000, poll_s=HOUR, linger_s=HOUR)
    thread, taken = _taking(queue, max_rows)
    _wait_until_waiting(queue)
    for i, each in enumerate(droppable):
        assert queue.put(i, each)
    thread.join(60)
    try:
        assert queue._wake_at < 0 or not taken
        # A copy, made before the close: the close wakes a take still waiting, which then
        # takes the rows, and the list it fills would no longer say that it waited.
        return list(taken)
    finally:
        queue.close()


def test_an_empty_queue_s_take_is_woken_by_the_put_that_fills_it() -> None:
    assert _taken_after_puts(3, [True, True, True]) == [[0, 1, 2]]


def test_a_lingering_take_is_woken_by_the_put_that_fills_it() -> None:
    queue: RowQueue[int] = RowQueue(1000, poll_s=HOUR, linger_s=HOUR)
    assert queue.put(0, True)
    thread, taken = _taking(queue, 3)
    _wait_until_waiting(queue)
    assert queue.put(1, True)
    assert queue.put(2, True)
    thread.join(60)
    try:
        assert taken == [[0, 1, 2]]
    finally:
        queue.close()


def test_a_wake_leaves_the_next_take_free_to_linger() -> None:
    queue: RowQueue[int] = RowQueue(1000, poll_s=HOUR, linger_s=0.05)
    thread, taken = _taking(queue, 2)
    _wait_until_waiting(queue)
    for i in range(3):
        assert queue.put(i, True)
    thread.join(60)
    assert taken == [[0, 1]]
    assert not queue._hurry.is_set()  # the next take, of fewer rows, may linger for more
    assert queue.take(2) == [2]


class _WaitsSeen(threading.Event):
    """An event whose waits are counted, not made (each returns at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_rows_queued_before_the_wake_is_set_are_not_waited_for() -> None:
    """The rows a take wants came after it looked, before it set its wake (the ingest thread
    ran between): no later put reaches the mark, so a wait would last its whole poll."""
    queue: RowQueue[int] = RowQueue(1000, poll_s=HOUR, linger_s=HOUR)
    seen = queue._hurry = queue._wake = _WaitsSeen()
    for i in range(3):
        assert queue.put(i, True)
    queue._wait_for(3, HOUR)
    assert seen.waits == []
    assert queue._wake_at < 0


def test_a_rare_row_put_during_the_wait_counts_toward_the_take() -> None:
    """A rare row (a reset, a recovery: not droppable) put while the take waits is one of the
    rows it wants: the droppable put that fills the take wakes it, not one more."""
    assert _taken_after_puts(3, [True, False, True]) == [[0, 1, 2]]


def test_rare_rows_alone_fill_a_waiting_take() -> None:
    assert _taken_after_puts(2, [False, False]) == [[0, 1]]
