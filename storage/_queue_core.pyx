# The row queue's counts (storage/rowqueue.py), and the put that the ingest thread makes for
# each batch, in C.
#
# A put is a few comparisons, an append and a size kept, but in Python each counter read, each sum and each
# attribute write costs an object's worth of work (the byte counts are past the small ints
# Python keeps), on the ingest thread, for every batch. Here the counts are C integers; each is
# written by one thread only (`_in`: the producer, `_out`: the consumer), and every step below
# runs holding the GIL, so none is seen half done.

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject

cdef extern from "Python.h":
    bint PyCFunction_Check(object)
    int PyCFunction_GET_FLAGS(object)
    void* PyCFunction_GET_FUNCTION(object)
    # A borrowed reference (NULL for a static method): a pointer, so that Cython gives back
    # no reference it was never given.
    PyObject* PyCFunction_GET_SELF(object)
    int METH_O

from collections import deque

# The size ring's first capacity (a power of two); it doubles when full. Emptied at a capacity
# above `_KEPT_SIZES` it is freed: a backlog's peak is not held for good.
cdef enum:
    _FIRST_SIZES = 64
    _KEPT_SIZES = 4096


cdef class SpillState:
    """The base of storage/spill.py's `Spill`: whether rows wait there (`active`), a C field,
    which the put reads for every batch (a Python attribute cost a lookup in the type and the
    instance's dict each time)."""

    # (its field: storage/_queue_core.pxd)


cdef class QueueCore:
    # (its fields: storage/_queue_core.pxd)

    def __cinit__(self, *args, **kwargs):
        self._rows = deque()
        self._append_row = self._rows.append
        self._append_c = NULL
        if (
            PyCFunction_Check(self._append_row)
            and PyCFunction_GET_FLAGS(self._append_row) == METH_O
            and PyCFunction_GET_SELF(self._append_row) == <PyObject*>self._rows
        ):
            self._append_c = <_AppendOne>PyCFunction_GET_FUNCTION(self._append_row)
        self._size_ring = NULL
        self._size_capacity = self._size_head = self._size_count = 0
        self.droppable_limit = self.bytes_limit = 0
        self._droppable_in = self._droppable_out = self._bytes_in = self._bytes_out = 0
        self._others_in = 0
        self.spill = None
        self._wake_at = -1
        self._wake = None

    def __dealloc__(self):
        PyMem_Free(self._size_ring)

    cdef int _push_size(self, long long nbytes) except -1:
        """A row's size, kept after those before it (no Python integer made)."""
        cdef Py_ssize_t i, capacity = self._size_capacity, head = self._size_head
        cdef Py_ssize_t count = self._size_count
        cdef long long* ring
        if count == capacity:
            ring = <long long*>PyMem_Malloc(
                (2 * capacity if capacity else _FIRST_SIZES) * sizeof(long long)
            )
            if ring is NULL:
                raise MemoryError()
            for i in range(count):
                ring[i] = self._size_ring[(head + i) & (capacity - 1)]
            PyMem_Free(self._size_ring)
            self._size_ring = ring
            capacity = self._size_capacity = 2 * capacity if capacity else _FIRST_SIZES
            head = self._size_head = 0
        self._size_ring[(head + count) & (capacity - 1)] = nbytes
        self._size_count = count + 1
        return 0

    cdef long long _pop_sizes(self, Py_ssize_t n):
        """The sum of the first `n` sizes kept (`n` at most `_size_count`), popped."""
        cdef long long total = 0
        cdef Py_ssize_t i, mask = self._size_capacity - 1, head = self._size_head
        for i in range(n):
            total += self._size_ring[(head + i) & mask]
        if n:
            self._size_head = (head + n) & mask
            self._size_count -= n
        if self._size_count == 0 and self._size_capacity > _KEPT_SIZES:
            PyMem_Free(self._size_ring)
            self._size_ring = NULL
            self._size_capacity = self._size_head = 0
        return total

    @property
    def _sizes(self):
        """The sizes kept, oldest first (a copy)."""
        cdef Py_ssize_t i, mask = self._size_capacity - 1
        return [self._size_ring[(self._size_head + i) & mask] for i in range(self._size_count)]

    @property
    def _sizes_room(self):
        """How many sizes the ring holds before it grows."""
        return self._size_capacity

    def _put_size(self, long long nbytes):
        """Half a put: the size kept, its row not yet (as a put that another thread interrupted
        between the two would leave it)."""
        self._push_size(nbytes)

    def _take_sizes(self, Py_ssize_t n):
        """The sum of the first `n` sizes, popped (`n` at most those kept)."""
        if not 0 <= n <= self._size_count:
            raise ValueError(f"{n} sizes asked for, {self._size_count} kept")
        return self._pop_sizes(n)

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
            self._push_size(nbytes)
            self._bytes_in += nbytes
            if self._append_c is not NULL:
                self._append_c(self._rows, row)
            else:
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
        cdef list taken
        cdef Py_ssize_t i
        if not 0 <= n <= len(rows):
            raise ValueError(f"{n} rows asked for, {len(rows)} queued")
        if n == len(rows):
            taken = list(rows)
            rows.clear()
        else:
            taken = [rows.popleft() for i in range(n)]
        # Sizes go in before their rows: a put between the two left one more size.
        return taken, self._pop_sizes(n)

    def _arm_wake(self, Py_ssize_t max_rows):
        """The wake set for the put that brings the rows queued to `max_rows`; False, none set,
        where they are queued already. One step holding the GIL: a put between reading the
        counts and setting the mark would leave a mark no later put reaches."""
        cdef Py_ssize_t missing = max_rows - len(self._rows)
        if missing <= 0:
            return False
        self._wake_at = self._droppable_in + missing
        return True

    def _keep(self, object row, long long nbytes):
        # Its size first: the consumer pops as many sizes as it finds rows.
        self._push_size(nbytes)
        self._bytes_in += nbytes
        self._append_row(row)
        if self._wake_at >= 0:
            # The mark counts droppable puts: a rare row is one of the take's rows too.
            self._wake_at -= 1
            if self._droppable_in >= self._wake_at:
                self._wake_at = -1
                self._wake.set()
