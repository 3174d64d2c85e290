# The row queue's counts (storage/rowqueue.py), and the put that the ingest thread makes for
# each batch, in C.
#
# A put is a few comparisons and two appends, but in Python each counter read, each sum and each
# attribute write costs an object's worth of work (the byte counts are past the small ints
# Python keeps), on the ingest thread, for every batch. Here the counts are C integers; each is
# written by one thread only (`_in`: the producer, `_out`: the consumer), and every step below
# runs holding the GIL, so none is seen half done.

from collections import deque


cdef class SpillState:
    """The base of storage/spill.py's `Spill`: whether rows wait there (`active`), a C field,
    which the put reads for every batch (a Python attribute cost a lookup in the type and the
    instance's dict each time)."""

    # (its field: storage/_queue_core.pxd)


cdef class QueueCore:
    # (its fields: storage/_queue_core.pxd)

    def __cinit__(self, *args, **kwargs):
        self._rows = deque()
        self._sizes = deque()
        self._append_row = self._rows.append
        self._append_size = self._sizes.append
        self.droppable_limit = self.bytes_limit = 0
        self._droppable_in = self._droppable_out = self._bytes_in = self._bytes_out = 0
        self._others_in = 0
        self.spill = None
        self._wake_at = -1
        self._wake = None

    cpdef bint put_batch(self, object row, long long nbytes) except -1:
        """`put(row, True, nbytes)`, called directly for each batch by the ingest thread: the
        common case (room in memory, no spill being drained) in as few steps as it takes."""
        return self.put_row(row, nbytes)

    cdef bint put_row(self, object row, long long nbytes) except -1:
        """`put_batch` without a cpdef's look for an override (the store's sink calls this when
        its queue's class has none)."""
        cdef long long held = self._bytes_in - self._bytes_out
        spill = self.spill
        if (
            self._droppable_in - self._droppable_out < self.droppable_limit
            and (held + nbytes <= self.bytes_limit or not held)
            and (
                spill is None
                or not (
                    (<SpillState>spill).active if isinstance(spill, SpillState) else spill.active
                )
            )
        ):
            self._droppable_in += 1
            # `_keep`: its size first (the consumer pops as many sizes as it finds rows).
            self._append_size(nbytes)
            self._bytes_in += nbytes
            self._append_row(row)
            if self._droppable_in == self._wake_at:
                self._wake_at = -1
                self._wake.set()  # the waiting take has all it asked for
            return True
        if spill is None or not spill.put(row):
            return False
        self._others_in += 1
        return True

    def _take_front(self, Py_ssize_t n):
        """The first `n` rows (`n` at most those queued), popped, and the sum of their sizes.
        All of them (the usual take, after a linger) in one copy rather than a pop each: from
        the copy to the clear nothing lets another thread run (the GIL is held throughout)."""
        rows = self._rows
        sizes = self._sizes
        cdef list taken
        cdef Py_ssize_t i
        cdef long long total = 0
        if n == len(rows):
            taken = list(rows)
            rows.clear()
        else:
            taken = [rows.popleft() for i in range(n)]
        # Sizes go in before their rows: a put between its two appends left one more size.
        if len(sizes) == n:
            for size in sizes:
                total += <long long>size
            sizes.clear()
        else:
            for i in range(n):
                total += <long long>sizes.popleft()
        return taken, total

    def _keep(self, object row, long long nbytes):
        # Its size first: the consumer pops as many sizes as it finds rows.
        self._append_size(nbytes)
        self._bytes_in += nbytes
        self._append_row(row)
