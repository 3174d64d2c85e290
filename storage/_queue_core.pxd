"""`QueueCore` (storage/_queue_core.pyx), declared for the store's sink
(storage/_store_sink.pyx), which puts each batch's row in C."""


ctypedef object (*_AppendOne)(object, object)


cdef class SpillState:
    cdef public bint active


cdef class QueueCore:
    cdef public long long droppable_limit
    cdef public long long bytes_limit
    cdef public long long _droppable_in
    cdef public long long _droppable_out
    cdef public long long _bytes_in
    cdef public long long _bytes_out
    # Rows queued but droppable ones in memory: rare rows, and rows spilled.
    cdef public long long _others_in
    cdef public object spill
    cdef readonly object _rows
    # The size of each row in `_rows`, as given to `put`: a ring of C integers (its capacity a
    # power of two, or 0), `_size_count` of them from `_size_head` on.
    cdef long long* _size_ring
    cdef Py_ssize_t _size_capacity
    cdef Py_ssize_t _size_head
    cdef Py_ssize_t _size_count
    cdef object _append_row
    # `_append_row`'s C function (`deque.append` takes one argument: METH_O), called with the
    # deque without the call's checks; NULL where it is no such function.
    cdef _AppendOne _append_c
    # The `_droppable_in` at which a take waiting for rows has all it asked for (-1: none
    # waits; a rare row kept meanwhile lowers it by one), and what the put that reaches it
    # sets to wake it (storage/rowqueue.py).
    cdef public long long _wake_at
    cdef public object _wake

    cdef bint put_row(self, object row, long long nbytes) except -1
    cdef int _push_size(self, long long nbytes) except -1
    cdef long long _pop_sizes(self, Py_ssize_t n)
    cpdef bint put_batch(self, object row, long long nbytes) except -1
