# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A checkpoint as the rows it changed since its key (snapshot format 4, collector/snapshot_delta.py).

Columns are bytes of fixed-width rows (one per slot); a bitmap marks the rows changed. A
column longer than its key's has every row past the key's end changed. Malformed input raises
ValueError.
"""

from libc.string cimport memcmp, memcpy, memset


def mark_changed(
    const unsigned char[::1] key, const unsigned char[::1] now, Py_ssize_t width, bytearray bits
):
    """Set in `bits` each row of `now` that differs from the same row of `key` (or lies past
    its end); `bits` covers `now`'s rows."""
    if width < 1 or key.shape[0] % width or now.shape[0] % width:
        raise ValueError(f"columns are not rows of {width} bytes")
    cdef Py_ssize_t rows = now.shape[0] // width, shared = min(key.shape[0], now.shape[0]) // width
    if len(bits) < (rows + 7) // 8:
        raise ValueError("the bitmap does not cover the rows")
    cdef unsigned char* b = bits
    cdef const unsigned char* k = &key[0] if key.shape[0] else NULL
    cdef const unsigned char* n = &now[0] if rows else NULL
    cdef Py_ssize_t i
    with nogil:
        for i in range(shared):
            if memcmp(k + i * width, n + i * width, width):
                b[i >> 3] |= 1 << (i & 7)
        for i in range(shared, rows):
            b[i >> 3] |= 1 << (i & 7)


def gather(const unsigned char[::1] column, const unsigned char[::1] bits, Py_ssize_t width):
    """The rows of `column` that `bits` marks, in order, as bytes."""
    if width < 1 or column.shape[0] % width:
        raise ValueError(f"a column of rows of {width} bytes, please")
    cdef Py_ssize_t rows = column.shape[0] // width, i, n = 0
    if bits.shape[0] < (rows + 7) // 8:
        raise ValueError("the bitmap does not cover the rows")
    for i in range(rows):
        n += (bits[i >> 3] >> (i & 7)) & 1
    out = bytearray(n * width)
    cdef unsigned char* dst = out
    cdef const unsigned char* src = &column[0] if rows else NULL
    n = 0
    with nogil:
        for i in range(rows):
            if (bits[i >> 3] >> (i & 7)) & 1:
                memcpy(dst + n * width, src + i * width, width)
                n += 1
    return bytes(out)


def scatter(
    const unsigned char[::1] key,
    const unsigned char[::1] changed,
    const unsigned char[::1] bits,
    Py_ssize_t width,
    Py_ssize_t rows,
):
    """The inverse of `gather` over `key`: `rows` rows, each the next of `changed` where `bits`
    marks it, else `key`'s (zeros past its end, which `bits` must mark)."""
    if width < 1 or key.shape[0] % width or changed.shape[0] % width or rows < 0:
        raise ValueError(f"columns of rows of {width} bytes, please")
    if bits.shape[0] != (rows + 7) // 8:
        raise ValueError("the bitmap does not cover the rows")
    cdef Py_ssize_t key_rows = key.shape[0] // width, n_changed = changed.shape[0] // width
    cdef Py_ssize_t i, n = 0
    out = bytearray(rows * width)
    cdef unsigned char* dst = out
    cdef const unsigned char* k = &key[0] if key_rows else NULL
    cdef const unsigned char* c = &changed[0] if n_changed else NULL
    cdef Py_ssize_t shared = min(key_rows, rows)
    if shared:
        memcpy(dst, k, shared * width)
    for i in range(rows):
        if (bits[i >> 3] >> (i & 7)) & 1:
            if n == n_changed:
                raise ValueError("fewer changed rows than the bitmap marks")
            memcpy(dst + i * width, c + n * width, width)
            n += 1
        elif i >= key_rows:
            raise ValueError(f"row {i} is past the key's end but not changed")
    if n != n_changed:
        raise ValueError("more changed rows than the bitmap marks")
    return out
