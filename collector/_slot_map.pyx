# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A map of 64-bit block hashes to table slots in two flat C arrays: the block table's index.

A Python `dict[int, int]` costs about 100 bytes an entry once its int objects are counted; a
million cached blocks made it the largest part of a map. Here an entry is a uint64 key and an
int32 value in an open-addressed table (linear probing, deletion by backward shift, so there
are no tombstones): 12 bytes over a load of 0.6 to 0.75 once it is large. A large table grows by
a quarter, not by doubling (a doubled table sat at half its load, 24 bytes an entry, at some
sizes), so its capacity is any number and a hash's home is taken from its high bits by a
multiply, not masked; the load never passes 0.75, as before. A small one still doubles: its
room costs little, and growing by a quarter rehashes each entry four times, not once. It
offers the part of dict's
interface `BlockTable` uses; its C layout and the inline probe are in _slot_map.pxd, which the
table's core (collector/_table_core.pyx) cimports.

Large arrays are mapped from the OS (mmap), not taken from the heap: the C library serves blocks
below its (adaptive) mmap threshold from the heap, where the arrays a resize outgrows would stay
resident as free heap; unmapped, they go back to the OS.
"""

import array

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, uint64_t
from libc.string cimport memset
from posix.mman cimport MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE, mmap, munmap

cdef size_t MIN_CAPACITY = 8
cdef Py_ssize_t PREFETCH_AHEAD = 16
cdef size_t MAPPED_BYTES = 256 << 10  # arrays this large are mapped, not taken from the heap


cdef void* _take(size_t size) noexcept:
    if size < MAPPED_BYTES:
        return PyMem_Malloc(size)
    cdef void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    return NULL if p == MAP_FAILED else p


cdef void _give_back(void* p, size_t size) noexcept:
    if size < MAPPED_BYTES:
        PyMem_Free(p)
    elif p != NULL:
        munmap(p, size)


cdef size_t _room_for(Py_ssize_t entries) noexcept:
    """The capacity that holds `entries` at a load of at most 0.75."""
    return max(MIN_CAPACITY, (<size_t>max(entries, 0) * 4 + 2) // 3)


def _as_uint64(values):
    return values if isinstance(values, array.array) and values.typecode == "Q" else array.array("Q", values)


def _as_int32(values):
    return values if isinstance(values, array.array) and values.typecode == "i" else array.array("i", values)


cdef class SlotMap:
    """hash -> slot, for `BlockTable` (dict's interface, in part)."""

    def __cinit__(self, Py_ssize_t capacity=0):
        self._allocate(_room_for(capacity))

    def __dealloc__(self):
        cdef size_t cap = self._cap
        _give_back(self._keys, cap * sizeof(uint64_t))
        _give_back(self._vals, cap * sizeof(int32_t))

    cdef int _allocate(self, size_t cap) except -1:
        keys = <uint64_t*>_take(cap * sizeof(uint64_t))
        vals = <int32_t*>_take(cap * sizeof(int32_t))
        if keys == NULL or vals == NULL:
            _give_back(keys, cap * sizeof(uint64_t))
            _give_back(vals, cap * sizeof(int32_t))
            raise MemoryError()
        memset(vals, 0xFF, cap * sizeof(int32_t))  # every value EMPTY
        self._keys, self._vals, self._cap, self._size = keys, vals, cap, 0
        return 0

    @classmethod
    def from_arrays(cls, hashes, slots):
        """A map of `hashes[i] -> slots[i]` (the columns a checkpoint keeps)."""
        cdef const uint64_t[:] keys = _as_uint64(hashes)
        cdef const int32_t[:] values = _as_int32(slots)
        if keys.shape[0] != values.shape[0]:
            raise ValueError("as many hashes as slots, please")
        cdef SlotMap made = cls(keys.shape[0])
        cdef Py_ssize_t i, n = keys.shape[0]
        for i in range(n):
            if i + PREFETCH_AHEAD < n:
                made._prefetch(keys[i + PREFETCH_AHEAD])
            made._put(keys[i], values[i])
        return made

    def to_arrays(self):
        """(hashes, slots) as `array("Q")` and `array("i")`, in one order: a checkpoint's columns."""
        cdef Py_ssize_t n = self._size, k = 0
        cdef size_t i
        keys = array.array("Q", bytes(n * sizeof(uint64_t)))
        values = array.array("i", bytes(n * sizeof(int32_t)))
        cdef uint64_t[:] key_view = keys
        cdef int32_t[:] value_view = values
        for i in range(self._cap):
            if self._vals[i] != EMPTY:
                key_view[k] = self._keys[i]
                value_view[k] = self._vals[i]
                k += 1
        return keys, values

    # --- the table ----------------------------------------------------------------------------
    cdef int _put(self, uint64_t key, int32_t value) except -1:
        if value < 0:
            raise ValueError("slots are non-negative")
        cdef size_t i = self._locate(key)
        if self._vals[i] != EMPTY:
            self._vals[i] = value
            return 0
        return self._put_at(i, key, value)

    cdef int _resize(self, size_t cap) except -1:
        cdef uint64_t* old_keys = self._keys
        cdef int32_t* old_vals = self._vals
        cdef size_t old_cap = self._cap, i, j
        self._allocate(cap)
        for i in range(old_cap):
            if old_vals[i] != EMPTY:
                j = self._home(old_keys[i])
                while self._vals[j] != EMPTY:
                    j = self._next(j)
                self._keys[j] = old_keys[i]
                self._vals[j] = old_vals[i]
                self._size += 1
        _give_back(old_keys, old_cap * sizeof(uint64_t))
        _give_back(old_vals, old_cap * sizeof(int32_t))
        return 0

    cdef void _remove_at(self, size_t i) noexcept:
        # Backward shift: pull later entries of the probe run into the hole, so that every
        # entry stays reachable from its home without tombstones.
        cdef size_t j = i, home
        while True:
            j = self._next(j)
            if self._vals[j] == EMPTY:
                break
            home = self._home(self._keys[j])
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue  # j's home lies after the hole: it stays
            self._keys[i] = self._keys[j]
            self._vals[i] = self._vals[j]
            i = j
        self._vals[i] = EMPTY
        self._size -= 1
        self._changes += 1

    cdef int _delete_at(self, size_t i) except -1:
        self._remove_at(i)
        if self._cap > MIN_CAPACITY and <size_t>self._size * 8 < self._cap:
            # Give memory back after a clear-like drain, leaving the room one growth leaves.
            self._resize(_room_for(self._size + self._size // 4))
        return 0

    # --- dict's interface ---------------------------------------------------------------------
    cdef Py_ssize_t _index_of(self, key) noexcept:
        """Where `key` is, or -1: also for what no uint64 can be (negative, too big, not int)."""
        try:
            return self._find(<uint64_t>key)
        except (OverflowError, TypeError):
            return -1

    def get(self, key, default=None):
        cdef Py_ssize_t i = self._index_of(key)
        return default if i < 0 else self._vals[i]

    def __getitem__(self, key):
        cdef Py_ssize_t i = self._index_of(key)
        if i < 0:
            raise KeyError(key)
        return self._vals[i]

    def __setitem__(self, key, value):
        self._put(key, value)

    def __delitem__(self, key):
        cdef Py_ssize_t i = self._index_of(key)
        if i < 0:
            raise KeyError(key)
        self._delete_at(i)

    def __contains__(self, key):
        return self._index_of(key) >= 0

    def __len__(self):
        return self._size

    def __iter__(self):
        return self.keys()

    def keys(self):
        return self._walk(0)

    def values(self):
        return self._walk(1)

    def items(self):
        return self._walk(2)

    def _walk(self, int what):
        cdef size_t i, changes = self._changes
        for i in range(self._cap):
            # Re-read through self each step: a change may have moved the arrays.
            if changes != self._changes:
                raise RuntimeError("SlotMap changed size during iteration")
            if self._vals[i] != EMPTY:
                if what == 0:
                    yield self._keys[i]
                elif what == 1:
                    yield self._vals[i]
                else:
                    yield self._keys[i], self._vals[i]

    def nbytes(self):
        """Bytes held by the two arrays."""
        return self._cap * (sizeof(uint64_t) + sizeof(int32_t))
