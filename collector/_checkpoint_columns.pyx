# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Two exact rewrites of a table's columns that make checkpoints (snapshot format 3) smaller.

- A block's parent hash is, whenever the parent is cached, the hash of the slot whose child list
  holds the block: XORed with that hash it is 0, so the column stores only what the tree does
  not already say (roots' 0, orphans' missing parents). The rewrite is its own inverse.
- The tokens column is cut into blocks of `record` bytes, stored once each (`intern_records`)
  with each block's number among them: prompts share blocks, zstd's window misses far repeats.

Both read and write the columns as bytes, whatever they hold (a free slot's stale tokens too),
so a decoded table equals the encoded one byte for byte. Malformed input raises ValueError.
"""

import array

cimport cython
from cpython cimport array as carray
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

cdef extern from *:
    """
    #ifdef __linux__
    #include <sys/mman.h>
    #endif
    static void kvscope_huge_pages(void* start, size_t size) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        const size_t huge = (size_t)2 << 20;
        size_t begin = ((size_t)start + huge - 1) & ~(huge - 1);
        size_t end = ((size_t)start + size) & ~(huge - 1);
        if (end > begin) madvise((void*)begin, end - begin, MADV_HUGEPAGE);  /* advice only */
    #endif
    }
    """
    void huge_pages "kvscope_huge_pages"(void* start, size_t size) noexcept nogil

cdef carray.array _UINT32 = array.array("I")
cdef carray.array _UINT64 = array.array("Q")
cdef carray.array _BYTES = array.array("B")
cdef carray.array _INT32 = array.array("i")


def xor_linked_parents(
    const unsigned char[::1] parents,
    const uint64_t[::1] hashes,
    const int32_t[::1] slots,
    const int32_t[::1] first_child,
    const int32_t[::1] next_sibling,
):
    """`parents` (uint64 per slot) with each linked child's item XORed with its parent's hash
    (`hashes[i]` is cached at `slots[i]`): encodes, and decodes what it encoded."""
    if parents.shape[0] % 8:
        raise ValueError("the parent column is not whole uint64s")
    cdef Py_ssize_t n_slots = parents.shape[0] // 8, i, steps = 0
    if hashes.shape[0] != slots.shape[0]:
        raise ValueError("as many hashes as slots, please")
    if first_child.shape[0] < n_slots or next_sibling.shape[0] < n_slots:
        raise ValueError("the child columns are shorter than the parent column")
    out = carray.clone(_UINT64, n_slots, False)
    cdef uint64_t* dst = (<carray.array>out).data.as_ulonglongs
    if n_slots:
        memcpy(dst, &parents[0], n_slots * 8)
    cdef int32_t slot, child
    cdef uint64_t parent_hash
    for i in range(hashes.shape[0]):
        slot, parent_hash = slots[i], hashes[i]
        if slot < 0 or slot >= n_slots:
            raise ValueError(f"slot {slot} is outside the columns")
        child = first_child[slot]
        while child != -1:
            # Every slot has one parent at most: more steps than slots is a cycle.
            if child < 0 or child >= n_slots or steps == n_slots:
                raise ValueError("the child lists are not a forest of the columns' slots")
            dst[child] ^= parent_hash
            steps += 1
            child = next_sibling[child]
    return out


cdef inline uint64_t _hash_record(const unsigned char* p, Py_ssize_t size) noexcept nogil:
    cdef uint64_t h = 0x9E3779B97F4A7C15ULL ^ <uint64_t>size, word
    cdef Py_ssize_t i = 0
    while i + 8 <= size:
        memcpy(&word, p + i, 8)
        h = (h ^ word) * 0xFF51AFD7ED558CCDULL
        h ^= h >> 29
        i += 8
    while i < size:
        h = (h ^ p[i]) * 0x100000001B3ULL
        i += 1
    return h ^ (h >> 32)


cdef uint32_t _EMPTY = 0xFFFFFFFF


@cython.final
cdef class _Interned:
    """A hash table of distinct records, numbered in order of first sight: those of `known`
    first (`add_known`), then those `data` adds (`number_all`)."""
    cdef Py_ssize_t record, n_known, distinct
    cdef size_t mask
    # uint32s, as the numbers are: the table is read at random, half as large is missed less.
    cdef uint32_t* table  # each slot: a distinct record's number, or _EMPTY
    cdef uint32_t* first  # each distinct record's first position: in `known`, then in `data`
    cdef const unsigned char* known
    cdef const unsigned char* data

    def __cinit__(self, Py_ssize_t record, Py_ssize_t n):
        cdef size_t cap = 8
        while cap < <size_t>(2 * n):
            cap <<= 1
        self.record, self.mask = record, cap - 1
        if n >= _EMPTY:
            raise ValueError(f"{n} records are more than numbers hold")
        self.table = <uint32_t*>PyMem_Malloc(cap * sizeof(uint32_t))
        self.first = <uint32_t*>PyMem_Malloc((n + 1) * sizeof(uint32_t))
        if self.table == NULL or self.first == NULL:
            raise MemoryError()
        memset(self.table, 0xFF, cap * sizeof(uint32_t))

    def __dealloc__(self):
        PyMem_Free(self.table)
        PyMem_Free(self.first)

    cdef inline const unsigned char* at(self, uint32_t j) noexcept nogil:
        if j < self.n_known:
            return self.known + self.first[j] * self.record
        return self.data + self.first[j] * self.record

    cdef inline Py_ssize_t number(self, const unsigned char* rec, Py_ssize_t i) noexcept nogil:
        """`rec`'s number, a new one (first seen at `i`) if none was given yet."""
        cdef size_t at = _hash_record(rec, self.record) & self.mask
        cdef uint32_t j
        while True:
            j = self.table[at]
            if j == _EMPTY:
                self.table[at] = <uint32_t>self.distinct
                self.first[self.distinct] = <uint32_t>i
                self.distinct += 1
                return self.distinct - 1
            if memcmp(self.at(j), rec, self.record) == 0:
                return j
            at = (at + 1) & self.mask

    cdef int add_known(self, const unsigned char* known, Py_ssize_t n) except -1:
        self.known = known
        cdef Py_ssize_t i
        for i in range(n):
            self.n_known = i + 1  # (what `at` reads from `known`: those seen so far)
            if self.number(known + i * self.record, i) != i:
                raise ValueError(f"known record {i} repeats an earlier one")
        return 0

    cdef void number_all(self, const unsigned char* data, Py_ssize_t n, uint32_t* out) noexcept nogil:
        self.data = data
        cdef Py_ssize_t i
        for i in range(n):
            out[i] = <uint32_t>self.number(data + i * self.record, i)


def intern_records(const unsigned char[::1] data, Py_ssize_t record, const unsigned char[::1] known=None):
    """(numbers, records): `data` cut into records of `record` bytes, as each record's number
    (array("I")) among the distinct ones, which `records` holds in order of first sight. The
    distinct records of `known` (ValueError if one repeats) come first in that order and are
    not in `records`: as `data` after them, without the two joined."""
    if record < 1 or data.shape[0] % record:
        raise ValueError(f"{data.shape[0]} bytes are not records of {record} bytes")
    cdef Py_ssize_t n_known = 0 if known is None else known.shape[0] // record
    if known is not None and known.shape[0] % record:
        raise ValueError(f"{known.shape[0]} known bytes are not records of {record} bytes")
    cdef Py_ssize_t n = data.shape[0] // record, j
    cdef _Interned interned = _Interned(record, n_known + n)
    if n_known:
        interned.add_known(&known[0], n_known)
    numbers = carray.clone(_UINT32, n, False)
    cdef uint32_t* number = (<carray.array>numbers).data.as_uints
    cdef const unsigned char* src = &data[0] if n else NULL
    with nogil:
        interned.number_all(src, n, number)
    records = carray.clone(_BYTES, (interned.distinct - n_known) * record, False)
    for j in range(n_known, interned.distinct):
        memcpy(
            (<carray.array>records).data.as_uchars + (j - n_known) * record,
            src + interned.first[j] * record,
            record,
        )
    return numbers, records


def expand_records(const uint32_t[::1] numbers, const unsigned char[::1] records, Py_ssize_t record):
    """The inverse of `intern_records`, as an array("I") (a tokens column)."""
    if record < 1 or record % 4 or records.shape[0] % record:
        raise ValueError(f"{records.shape[0]} bytes are not records of {record} bytes")
    cdef Py_ssize_t n = numbers.shape[0], distinct = records.shape[0] // record, i
    out = carray.clone(_UINT32, n * (record // 4), False)
    cdef unsigned char* dst = (<carray.array>out).data.as_uchars
    # The largest column by far, written once from end to end: in huge pages where the kernel
    # offers them on request, it takes a page fault per 2 MiB instead of per 4 KiB.
    huge_pages(dst, n * record)
    cdef uint32_t k
    for i in range(n):
        k = numbers[i]
        if k >= distinct:
            raise ValueError(f"record {k} of {distinct}")
        memcpy(dst + i * record, &records[k * record], record)
    return out


def by_slot(const uint64_t[::1] hashes, const int32_t[::1] slots, Py_ssize_t n_slots):
    """(hash of each slot, bitmap of the slots holding one): the slot map with its slots left
    implicit, as array("Q") and bytes."""
    if hashes.shape[0] != slots.shape[0]:
        raise ValueError("as many hashes as slots, please")
    out = carray.clone(_UINT64, n_slots, True)
    cdef uint64_t* dst = (<carray.array>out).data.as_ulonglongs
    present = bytearray((n_slots + 7) // 8)
    cdef unsigned char* bits = present
    cdef Py_ssize_t i
    cdef int32_t slot
    for i in range(hashes.shape[0]):
        slot = slots[i]
        if slot < 0 or slot >= n_slots or bits[slot >> 3] & (1 << (slot & 7)):
            raise ValueError(f"slot {slot} is outside the columns or held twice")
        bits[slot >> 3] |= 1 << (slot & 7)
        dst[slot] = hashes[i]
    return out, bytes(present)


def from_slots(const uint64_t[::1] hash_of_slot, const unsigned char[::1] present):
    """The inverse of `by_slot`: (hashes, slots) as array("Q") and array("i"), in slot order."""
    cdef Py_ssize_t n_slots = hash_of_slot.shape[0], i, n = 0
    if present.shape[0] != (n_slots + 7) // 8:
        raise ValueError("the bitmap does not cover the slots")
    for i in range(n_slots):
        n += (present[i >> 3] >> (i & 7)) & 1
    hashes = carray.clone(_UINT64, n, False)
    slots = carray.clone(_INT32, n, False)
    cdef uint64_t* h = (<carray.array>hashes).data.as_ulonglongs
    cdef int32_t* s = <int32_t*>(<carray.array>slots).data.as_ints
    n = 0
    for i in range(n_slots):
        if (present[i >> 3] >> (i & 7)) & 1:
            h[n], s[n] = hash_of_slot[i], <int32_t>i
            n += 1
    return hashes, slots


def minus(const uint32_t[::1] a, const uint32_t[::1] b, bint inverse=False):
    """a - b item by item, modulo 2^32 (a + b with `inverse`): a column as its difference from
    another that mostly equals it (last and first store times)."""
    if a.shape[0] != b.shape[0]:
        raise ValueError("columns of different lengths")
    out = carray.clone(_UINT32, a.shape[0], False)
    cdef uint32_t* dst = (<carray.array>out).data.as_uints
    cdef Py_ssize_t i
    for i in range(a.shape[0]):
        dst[i] = a[i] + b[i] if inverse else a[i] - b[i]
    return out


def previous_siblings(const int32_t[::1] next_sibling):
    """The previous-sibling column that `next_sibling` implies (-1 where none points), as an
    array("i"): a table's own is this whenever its lists are whole, so format 5 leaves it out."""
    cdef Py_ssize_t n = next_sibling.shape[0], i
    out = carray.clone(_INT32, n, False)
    cdef int32_t* dst = <int32_t*>(<carray.array>out).data.as_ints
    cdef int32_t nxt
    for i in range(n):
        dst[i] = -1
    for i in range(n):
        nxt = next_sibling[i]
        if nxt != -1:
            if nxt < 0 or nxt >= n:
                raise ValueError(f"next sibling {nxt} is outside the column")
            dst[nxt] = <int32_t>i
    return out



def aligned(data, Py_ssize_t size):
    """`data` (C-contiguous bytes) itself where its first byte lies at a multiple of `size`, else
    a copy (which does): the columns here are read as items in place, which the compiler may
    take to be aligned (a copy's arrays read in place from its msgpack lie anywhere)."""
    cdef const unsigned char[::1] view = data
    if view.shape[0] and <size_t>&view[0] % <size_t>size:
        return bytes(view)
    return data


def same_bytes(const unsigned char[::1] a, const unsigned char[::1] b):
    """Whether `a` and `b` hold the same bytes (a memoryview's `==` compares item by item)."""
    return a.shape[0] == b.shape[0] and (
        a.shape[0] == 0 or memcmp(&a[0], &b[0], a.shape[0]) == 0
    )
