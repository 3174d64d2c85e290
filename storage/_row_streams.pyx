# cython: language_level=3, boundscheck=False, wraparound=False
# The writer's log rows read as columns, each stream's rows together (storage/log_runs.py).
#
# A fleet's transaction interleaves its streams batch by batch; grouping its rows in Python cost
# the writer a dict look-up and an append per row with the GIL held. Here each row is read once:
# a row of the stream just seen is told by identity, others by a dict look-up in C.

from libc.stdlib cimport free, malloc


def fields_by_stream(list rows, Py_ssize_t width):
    """The fields of `rows` (plain tuples of at least `width` items, the first their stream) as
    `width` lists, each stream's rows together in the order they were given, the streams in
    the order they first come; None where a row is no such tuple."""
    cdef Py_ssize_t n = len(rows), i, k, g = 0, groups = 0, pos, total = 0
    cdef list cols = [[None] * n for k in range(width)]
    if n == 0:
        return cols
    cdef Py_ssize_t* group = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    if group == NULL or starts == NULL:
        free(group)
        free(starts)
        raise MemoryError()
    cdef dict index = {}
    cdef object row, stream, last = None, found
    cdef bint seen = False
    cdef tuple t
    cdef list col
    try:
        for i in range(n):
            row = rows[i]
            if type(row) is not tuple or len(<tuple>row) < width or width < 1:
                return None
            stream = (<tuple>row)[0]
            if not (seen and stream is last):
                found = index.get(stream)
                if found is None:
                    g = groups
                    index[stream] = g
                    starts[g] = 0
                    groups += 1
                else:
                    g = <Py_ssize_t>found
                last = stream
                seen = True
            group[i] = g
            starts[g] += 1
        for g in range(groups):  # counts -> where each group begins
            pos = starts[g]
            starts[g] = total
            total += pos
        for i in range(n):
            t = <tuple>rows[i]
            pos = starts[group[i]]
            starts[group[i]] = pos + 1
            for k in range(width):
                col = <list>cols[k]
                col[pos] = t[k]
        return cols
    finally:
        free(group)
        free(starts)
