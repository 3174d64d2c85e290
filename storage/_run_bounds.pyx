# cython: boundscheck=False, wraparound=False
"""Where storage/log_runs.py cuts a transaction's log rows into chunks, in C: the rows' sizes
summed and their streams and epochs compared without a Python object made per row (the
writer holds the GIL for all of it)."""

from cpython.bytes cimport PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble, PyFloat_CheckExact
from cpython.object cimport PyObject_RichCompareBool, Py_EQ
from cpython.ref cimport PyObject
from libc.stdlib cimport free, malloc


cdef extern from "Python.h":
    PyObject *PyList_GET_ITEM(object list, Py_ssize_t i)


cdef inline bint _same(object a, object b) except -1:
    return a is b or PyObject_RichCompareBool(a, b, Py_EQ)


ctypedef fused _Sorted:
    Py_ssize_t
    double


cdef Py_ssize_t _bisect_right(
    const _Sorted *values, _Sorted x, Py_ssize_t lo, Py_ssize_t hi
) noexcept:
    """`bisect_right(values, x, lo, hi)`, over the rows' sizes before each or their stamps."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef void _within(
    list bounds,
    Py_ssize_t start,
    Py_ssize_t stop,
    const double *stamps,
    const Py_ssize_t *before,
    Py_ssize_t max_batches,
    Py_ssize_t max_bytes,
    double max_span,
) except *:
    """log_runs.py's `_bounds_within`: rows [start, stop) of one stream and epoch."""
    cdef Py_ssize_t i, end, bound
    cdef bint ordered = True
    cdef double low, high
    for i in range(start + 1, stop):
        if stamps[i] < stamps[i - 1]:
            ordered = False
            break
    if ordered:  # the usual case, a chunk at a time: a clock ahead
        while start < stop:
            end = min(stop, start + max_batches)
            bound = _bisect_right(before, before[start] + max_bytes, start, stop + 1) - 1
            end = min(end, bound)
            end = min(end, _bisect_right(stamps, stamps[start] + max_span, start, stop))
            end = max(end, start + 1)
            bounds.append((start, end))
            start = end
        return
    while start < stop:
        low = high = stamps[start]
        end = start + 1
        while end < min(stop, start + max_batches):
            low = min(low, stamps[end])
            high = max(high, stamps[end])
            if before[end + 1] - before[start] > max_bytes or high > low + max_span:
                break
            end += 1
        bounds.append((start, end))
        start = end


def run_bounds(
    list streams,
    list epochs,
    list ts,
    list payloads,
    Py_ssize_t max_batches,
    Py_ssize_t max_bytes,
    double max_span,
):
    """[start, end) of each run of the rows (their fields, a list each): a new one at a stream
    or epoch change, and before one would grow past `max_batches`, `max_bytes` of payloads or
    `max_span` seconds of `ts` (a run holds at least one batch, however large); None where a
    `ts` is NaN (Python's `sorted` and comparisons decide then)."""
    cdef Py_ssize_t n = len(ts), i, start = 0, size
    if len(streams) != n or len(epochs) != n or len(payloads) != n:
        raise ValueError("the rows' fields differ in length")
    cdef double *stamps = <double *>malloc((n + 1) * sizeof(double))
    cdef Py_ssize_t *before = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
    cdef object value
    cdef list bounds = []
    try:
        if stamps == NULL or before == NULL:
            raise MemoryError()
        before[0] = 0
        for i in range(n):
            value = <object>PyList_GET_ITEM(ts, i)
            stamps[i] = PyFloat_AS_DOUBLE(value) if PyFloat_CheckExact(value) else PyFloat_AsDouble(value)
            if stamps[i] != stamps[i]:
                return None
            value = <object>PyList_GET_ITEM(payloads, i)
            size = PyBytes_GET_SIZE(value) if PyBytes_CheckExact(value) else len(value)
            before[i + 1] = before[i] + size
        for i in range(1, n + 1):
            if i == n or not (
                _same(<object>PyList_GET_ITEM(streams, i), <object>PyList_GET_ITEM(streams, start))
                and _same(<object>PyList_GET_ITEM(epochs, i), <object>PyList_GET_ITEM(epochs, start))
            ):
                _within(bounds, start, i, stamps, before, max_batches, max_bytes, max_span)
                start = i
        return bounds
    finally:
        free(stamps)
        free(before)
