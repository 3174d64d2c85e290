"""A rare row hurries the writer's queue as far as itself (storage/rowqueue.py): the take that
reaches it goes without lingering, and the takes after it linger again, though the queue (a
fleet's, never found empty) still holds rows; a hurry past a take's rows stays."""

from __future__ import annotations

from kvscope.storage.rowqueue import RowQueue


def _queue() -> RowQueue[int]:
    # Hurried takes return at once: the linger is never waited here.
    return RowQueue(1000, linger_s=3600.0)


def test_a_hurry_ends_with_the_take_that_reaches_its_row() -> None:
    queue = _queue()
    for n in range(3):
        queue.put(n, True)
    queue.put(3, False)
    queue.hurry()  # the rare row 3 wants out now
    queue.put(4, True)
    assert queue.take(100) == [0, 1, 2, 3, 4]
    queue.done(4)
    queue.put(5, True)
    # Rows still come: the next take may linger for more (a larger transaction).
    assert not queue._hurry.is_set()


def test_a_hurry_lasts_until_its_row_is_taken() -> None:
    queue = _queue()
    for n in range(4):
        queue.put(n, True)
    queue.hurry()
    assert queue.take(2) == [0, 1]
    queue.done(2)
    assert queue._hurry.is_set()  # row 3 is not out yet
    assert queue.take(100) == [2, 3]
    queue.done(2)
    queue.put(4, True)
    assert not queue._hurry.is_set()


def test_a_closed_queue_never_lingers() -> None:
    queue = _queue()
    queue.put(0, True)
    queue.close()
    assert queue.take(100) == [0]
    queue.done(1)
    queue.put(1, True)
    assert queue.take(100) == [1]
    queue.done(1)
    assert queue.take(100) is None
