# The hash -> slot map's C layout, cimported by the block table's core (collector/_table_core.pyx),
# whose hot writes probe it inline.
from libc.stdint cimport int32_t, uint64_t


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define KVSCOPE_PREFETCH(p) __builtin_prefetch(p)
    #else
    #define KVSCOPE_PREFETCH(p) ((void)(p))
    #endif
    /* An index in [0, cap) from a mixed hash's high bits (Lemire's multiply-shift): a
       table's capacity need not be a power of two. */
    static inline size_t kvscope_reduce(uint64_t h, size_t cap) {
        return (size_t)(((unsigned __int128)h * (uint64_t)cap) >> 64);
    }
    """
    void prefetch "KVSCOPE_PREFETCH"(const void* p) noexcept nogil
    size_t reduce "kvscope_reduce"(uint64_t h, size_t cap) noexcept nogil


cdef enum:
    EMPTY = -1  # the value of a free entry: slots are non-negative
    QUARTER_GROWTH = 1 << 16  # a table this large grows by a quarter, a smaller one doubles


cdef inline uint64_t mix(uint64_t x) noexcept nogil:
    # murmur3's finaliser: tests and bytes-derived hashes are not uniformly spread.
    x ^= x >> 33
    x *= <uint64_t>0xFF51AFD7ED558CCDULL
    x ^= x >> 33
    x *= <uint64_t>0xC4CEB9FE1A85EC53ULL
    x ^= x >> 33
    return x


cdef class SlotMap:
    cdef uint64_t* _keys
    cdef int32_t* _vals
    cdef size_t _cap  # entries in each array: any number from MIN_CAPACITY on
    cdef Py_ssize_t _size
    cdef size_t _changes  # bumped when an entry comes or goes: iterators check it, as dict's do

    cdef int _allocate(self, size_t cap) except -1
    cdef int _put(self, uint64_t key, int32_t value) except -1
    cdef int _resize(self, size_t cap) except -1
    cdef void _remove_at(self, size_t i) noexcept
    cdef int _delete_at(self, size_t i) except -1
    cdef Py_ssize_t _index_of(self, key) noexcept

    cdef inline size_t _home(self, uint64_t key) noexcept:
        # Where `key`'s probe starts.
        return reduce(mix(key), self._cap)

    cdef inline size_t _next(self, size_t i) noexcept:
        i += 1
        return 0 if i == self._cap else i

    cdef inline void _prefetch(self, uint64_t key) noexcept:
        # Ask for where `key` goes ahead of its probe: the table is larger than the caches,
        # and misses asked for together are served together.
        cdef size_t i = self._home(key)
        prefetch(&self._keys[i])
        prefetch(&self._vals[i])

    cdef inline size_t _locate(self, uint64_t key) noexcept:
        # Where `key` is, or the free entry where `_put_at` would put it: one probe for a store
        # that finds a hash absent and adds it.
        cdef size_t i = self._home(key)
        while self._vals[i] != EMPTY and self._keys[i] != key:
            i = self._next(i)
        return i

    cdef inline int _put_at(self, size_t i, uint64_t key, int32_t value) except -1:
        # Add `key` (absent) at `i`, the free entry `_locate` gave, nothing changed since.
        self._keys[i] = key
        self._vals[i] = value
        self._size += 1
        self._changes += 1
        if <size_t>self._size * 4 > self._cap * 3:
            # Small tables double (fewer rehashes); large ones grow by a quarter (less room).
            self._resize(self._cap * 2 if self._cap < QUARTER_GROWTH else self._cap + self._cap // 4)
        return 0

    cdef inline Py_ssize_t _find(self, uint64_t key) noexcept:
        # Where `key` is (its slot is `_vals` there), or -1.
        cdef size_t i = self._locate(key)
        return <Py_ssize_t>i if self._vals[i] != EMPTY else -1
