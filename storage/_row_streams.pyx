# cython: language_level=3, boundscheck=False, wraparound=False
# The writer's log rows read as columns, each stream's rows together (storage/log_runs.py).
#
# A fleet's transaction interleaves its streams batch by batch; grouping its rows in Python cost
# the writer a dict look-up and an append per row with the GIL held. Here each row is read once:
# a row of the stream just seen is told by identity, others by a dict look-up in C.

from libc.stdlib cimport free, malloc


cdef Py_ssize_t _group(tuple rows, Py_ssize_t width, Py_ssize_t* group, Py_ssize_t* starts) except -1:
    """Each row's group (by its stream) in `group`, where each group begins in `starts`;
    TypeError where a row is no tuple of at least `width` items."""
    cdef Py_ssize_t n = len(rows), i, g = 0, groups = 0, count, total = 0
    cdef dict index = {}
    cdef object row, stream, last = None, found
    cdef bint seen = False
    for i in range(n):
        row = rows[i]
        if not isinstance(row, tuple) or len(<tuple>row) < width or width < 1:
            raise TypeError(f"a log row is a tuple of {width} items or more, not {row!r}")
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
        count = starts[g]
        starts[g] = total
        total += count
    return 0


def fields_by_stream(list rows, Py_ssize_t width):
    """The fields of `rows` (tuples, `LogRow`s among them, of at least `width` items, the first
    their stream) as `width` lists, each stream's rows together in the order they were given,
    the streams in the order they first come. A tuple's items are read as it holds them."""
    return _by_stream(rows, width, False)


def by_stream(list rows):
    """`rows` (tuples, the first item their stream), each stream's together as in
    `fields_by_stream`."""
    return _by_stream(rows, 1, True)[0]


cdef list _by_stream(list given, Py_ssize_t width, bint whole):
    """`fields_by_stream`'s lists, or (`whole`) one list of the rows themselves."""
    # Read from a tuple: a stream's `__eq__` or `__hash__` (Python code) could change the list
    # under the unchecked reads below.
    cdef tuple rows = tuple(given)
    cdef Py_ssize_t n = len(rows), i, k, pos
    cdef list cols = [[None] * n for k in range(1 if whole else width)]
    if n == 0:
        return cols
    cdef Py_ssize_t* group = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    cdef tuple t
    cdef list col
    if group == NULL or starts == NULL:
        free(group)
        free(starts)
        raise MemoryError()
    try:
        _group(rows, width, group, starts)
        for i in range(n):
            t = <tuple>rows[i]
            pos = starts[group[i]]
            starts[group[i]] = pos + 1
            if whole:
                (<list>cols[0])[pos] = t
                continue
            for k in range(width):
                col = <list>cols[k]
                col[pos] = t[k]
        return cols
    finally:
        free(group)
        free(starts)


def plain_tuples(list rows):
    """The rows that are plain tuples (the log's batches; not a NamedTuple), in order: a
    transaction's rows picked out in C, not in a Python comprehension with the GIL held."""
    return [row for row in rows if type(row) is tuple]
