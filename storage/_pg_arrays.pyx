# cython: boundscheck=False, wraparound=False
"""A table's columns of many rows, each as one PostgreSQL array in its binary form (what the
server's `array_recv` reads): storage/bulk_sql.py's `unnest` statements send them as they are,
with no number formatted as text and no element dumped one by one by the driver.

The binary form: the dimensions (1, or 0 for an empty array), whether any element is NULL, the
element type's oid, the length and lower bound (1), then each element as its length (-1: NULL)
and its bytes, every integer big-endian. Integers go as int4 or int8, floats as float8 (their
8 bytes: exactly the double), bytes as bytea, strings as text in UTF-8."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble, PyFloat_CheckExact
from cpython.long cimport PyLong_AsLongLong
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL
    bint PyUnicode_Check(object o)
    PyObject *PyErr_Occurred()


cdef enum:
    # C constants, not module globals: each element's kind is tested in its loop.
    _INT4 = 105  # "i"
    _INT8 = 113  # "q"
    _FLOAT8 = 100  # "d"
    _BYTEA = 98  # "b"
    _TEXT = 116  # "t"

INT4 = _INT4
INT8 = _INT8
FLOAT8 = _FLOAT8
BYTEA = _BYTEA
TEXT = _TEXT
ARRAY_OIDS = {INT4: 1007, INT8: 1016, FLOAT8: 1022, BYTEA: 1001, TEXT: 1009}
"""Each kind's array type: what the driver must say the parameter is."""


cdef inline void _put32(unsigned char *at, uint32_t n) noexcept nogil:
    at[0] = <unsigned char>(n >> 24)
    at[1] = <unsigned char>(n >> 16)
    at[2] = <unsigned char>(n >> 8)
    at[3] = <unsigned char>n


cdef inline void _put64(unsigned char *at, uint64_t n) noexcept nogil:
    _put32(at, <uint32_t>(n >> 32))
    _put32(at + 4, <uint32_t>n)


cdef union _Double:
    double d
    uint64_t u


cdef Py_ssize_t _width(int kind) except -1:
    if kind == _INT4:
        return 4
    if kind == _INT8 or kind == _FLOAT8:
        return 8
    if kind == _BYTEA or kind == _TEXT:
        return 0
    raise ValueError(f"unknown array kind {kind!r}")


cdef uint32_t _oid(int kind) noexcept:
    if kind == _INT4:
        return 23
    if kind == _INT8:
        return 20
    if kind == _FLOAT8:
        return 701
    if kind == _BYTEA:
        return 17
    return 25


cdef inline object _value(tuple rows, Py_ssize_t i, Py_ssize_t c, list mapped):
    if mapped is not None:
        return mapped[i]
    return <object>PyTuple_GET_ITEM(rows[i], c)


cdef list _ids_of(tuple rows, dict ids, object stream_id):
    """Each row's first value as its id in `ids`; one missing there is `stream_id(value)`,
    kept in `ids` (asked in the order the rows first name them)."""
    cdef Py_ssize_t n = len(rows), i
    cdef list out = [None] * n
    cdef PyObject *found
    for i in range(n):
        value = <object>PyTuple_GET_ITEM(rows[i], 0)
        found = PyDict_GetItemWithError(ids, value)
        if found is NULL:
            if stream_id is None:
                raise KeyError(value)
            made = stream_id(value)
            ids[value] = made
            out[i] = made
        else:
            out[i] = <object>found
    return out


cdef object _array(tuple rows, Py_ssize_t c, int kind, list mapped):
    """Column `c` of `rows` (or its values `mapped`, where given)."""
    cdef Py_ssize_t n = len(rows), i, size = 0, nulls = 0, length
    cdef Py_ssize_t width = _width(kind)
    cdef object value
    cdef const char *text
    cdef list parts = None
    if width == 0:
        parts = [None] * n  # each element's bytes (a str's in UTF-8), kept while copied
        for i in range(n):
            value = _value(rows, i, c, mapped)
            if value is None:
                nulls += 1
                continue
            if kind == _TEXT:
                if not PyUnicode_Check(value):
                    raise TypeError(f"a text array takes str, not {type(value).__name__}")
                PyUnicode_AsUTF8AndSize(value, &length)
            else:
                if not PyBytes_CheckExact(value):
                    value = bytes(value)
                length = PyBytes_GET_SIZE(value)
            parts[i] = value
            size += length
    else:
        for i in range(n):
            if _value(rows, i, c, mapped) is None:
                nulls += 1
        size = (n - nulls) * width
    cdef Py_ssize_t head = 12 + (8 if n else 0)
    out = PyBytes_FromStringAndSize(NULL, head + 4 * n + size)
    cdef unsigned char *at = <unsigned char *>PyBytes_AS_STRING(out)
    _put32(at, 1 if n else 0)
    _put32(at + 4, 1 if nulls else 0)
    _put32(at + 8, _oid(kind))
    if n:
        _put32(at + 12, <uint32_t>n)
        _put32(at + 16, 1)
    at += head
    cdef int64_t whole
    cdef _Double real
    for i in range(n):
        value = _value(rows, i, c, mapped) if parts is None else parts[i]
        if value is None:
            _put32(at, 0xFFFFFFFF)
            at += 4
            continue
        if kind == _INT8:
            whole = PyLong_AsLongLong(value)
            _put32(at, 8)
            _put64(at + 4, <uint64_t>whole)
            at += 12
        elif kind == _INT4:
            whole = PyLong_AsLongLong(value)
            if whole < -2147483648 or whole > 2147483647:
                raise OverflowError(f"{whole} does not fit PostgreSQL's integer")
            _put32(at, 4)
            _put32(at + 4, <uint32_t>whole)
            at += 8
        elif kind == _FLOAT8:
            if PyFloat_CheckExact(value):
                real.d = PyFloat_AS_DOUBLE(value)
            else:
                real.d = PyFloat_AsDouble(value)
                if real.d == -1.0 and PyErr_Occurred():
                    raise TypeError(f"a float array takes numbers, not {type(value).__name__}")
            _put32(at, 8)
            _put64(at + 4, real.u)
            at += 12
        else:
            if kind == _TEXT:
                text = PyUnicode_AsUTF8AndSize(value, &length)
            else:
                text = PyBytes_AS_STRING(value)
                length = PyBytes_GET_SIZE(value)
            _put32(at, <uint32_t>length)
            memcpy(at + 4, text, length)
            at += 4 + length
    return out


def arrays(list rows, bytes kinds, dict ids=None, object stream_id=None):
    """Each column of `rows` (tuples of at least `len(kinds)` values) as the binary form of an
    array of its kind (`kinds`: one of INT4, INT8, FLOAT8, BYTEA, TEXT a column; None is
    NULL); with `ids`, each row's first value put as `ids[value]`, where `stream_id` (given)
    makes the ids `ids` lacks (and adds them to it)."""
    cdef Py_ssize_t width = len(kinds), i, c
    cdef object row
    # Read from a tuple: Python code run below (`stream_id`, an element's `__index__` or
    # `__float__`) could change the list under the unchecked reads.
    cdef tuple snapshot = tuple(rows)
    for i in range(len(snapshot)):
        row = snapshot[i]
        if not PyTuple_Check(row) or PyTuple_GET_SIZE(row) < width:
            raise TypeError(f"row {i} is not a tuple of {width} values at least")
    cdef list mapped = None
    if ids is not None and width:
        mapped = _ids_of(snapshot, ids, stream_id)
    cdef const unsigned char *kind = <const unsigned char *>PyBytes_AS_STRING(kinds)
    return [_array(snapshot, c, kind[c], mapped if c == 0 else None) for c in range(width)]
