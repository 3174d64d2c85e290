# A set of byte strings (a stream's token runs, storage/_token_granules.pyx), each with when it
# was last seen and its place among insertions: all in C, so that noting runs needs no GIL. The
# bytes lie end to end in one buffer, the entries in an array, and an open-addressed index
# (linear probing, at most half full) maps a run's hash to its entry. Entries are only ever
# dropped all at once (`table_keep_sorted`), which rebuilds the buffer and the index: no
# tombstones. All inline: compiled into the module that cimports it.
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memcmp, memcpy


cdef struct Entry:
    uint64_t hash
    uint64_t when
    uint64_t order  # its insertion's number: of runs seen together, the first inserted first
    Py_ssize_t offset
    Py_ssize_t length


cdef struct Table:
    unsigned char* bytes
    Py_ssize_t used
    Py_ssize_t room
    Entry* entries
    Py_ssize_t count
    Py_ssize_t capacity
    Py_ssize_t* index  # entry numbers, -1 where empty
    Py_ssize_t mask
    uint64_t inserted
    uint64_t seed  # each table's own: runs chosen to collide in one table do not in another


cdef inline uint64_t run_hash(const unsigned char* p, Py_ssize_t n, uint64_t seed) noexcept nogil:
    cdef uint64_t h = (0x9E3779B97F4A7C15ULL ^ seed ^ <uint64_t>n) * 0xC4CEB9FE1A85EC53ULL, w
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL
        h ^= h >> 29
        i += 8
    w = 0
    if i < n:
        memcpy(&w, p + i, n - i)
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL
    h ^= h >> 32
    h *= 0xFF51AFD7ED558CCDULL
    return h ^ (h >> 29)


cdef inline int table_init(Table* t, uint64_t seed) noexcept nogil:
    cdef Py_ssize_t i
    t.seed = seed
    t.bytes = NULL
    t.used = t.room = 0
    t.entries = NULL
    t.count = t.capacity = 0
    t.inserted = 0
    t.mask = 63
    t.index = <Py_ssize_t*>malloc(64 * sizeof(Py_ssize_t))
    if t.index == NULL:
        return -1
    for i in range(64):
        t.index[i] = -1
    return 0


cdef inline void table_clear(Table* t) noexcept nogil:
    free(t.bytes)
    free(t.entries)
    free(t.index)
    t.bytes = NULL
    t.entries = NULL
    t.index = NULL
    t.count = t.used = 0


cdef inline int table_reindex(Table* t, Py_ssize_t slots) noexcept nogil:
    """The index made again with `slots` (a power of two over twice the entries)."""
    cdef Py_ssize_t* index = <Py_ssize_t*>malloc(slots * sizeof(Py_ssize_t))
    cdef Py_ssize_t i, s
    if index == NULL:
        return -1
    for i in range(slots):
        index[i] = -1
    for i in range(t.count):
        s = <Py_ssize_t>(t.entries[i].hash & <uint64_t>(slots - 1))
        while index[s] >= 0:
            s = (s + 1) & (slots - 1)
        index[s] = i
    free(t.index)
    t.index = index
    t.mask = slots - 1
    return 0


cdef inline int table_note(Table* t, const unsigned char* p, Py_ssize_t n,
                           uint64_t when) noexcept nogil:
    """The run seen `when`: 1 if it was held, 0 if new (now held), -1 out of memory."""
    cdef uint64_t h = run_hash(p, n, t.seed)
    cdef Py_ssize_t s = <Py_ssize_t>(h & <uint64_t>t.mask), room
    cdef void* grown
    cdef Entry* e
    while t.index[s] >= 0:
        e = &t.entries[t.index[s]]
        if e.hash == h and e.length == n and memcmp(t.bytes + e.offset, p, n) == 0:
            e.when = when
            return 1
        s = (s + 1) & t.mask
    if t.used + n > t.room:
        room = 2 * t.room if 2 * t.room >= t.used + n else t.used + n + 4096
        grown = realloc(t.bytes, room)
        if grown == NULL:
            return -1
        t.bytes = <unsigned char*>grown
        t.room = room
    if t.count == t.capacity:
        room = 2 * t.capacity if t.capacity else 256
        grown = realloc(t.entries, room * sizeof(Entry))
        if grown == NULL:
            return -1
        t.entries = <Entry*>grown
        t.capacity = room
    e = &t.entries[t.count]
    e.hash = h
    e.when = when
    e.order = t.inserted
    e.offset = t.used
    e.length = n
    memcpy(t.bytes + t.used, p, n)
    t.used += n
    t.inserted += 1
    t.index[s] = t.count
    t.count += 1
    if 2 * t.count > t.mask and table_reindex(t, 2 * (t.mask + 1)) < 0:
        return -1  # held, but the index could not grow: the next note fails too
    return 0


cdef inline int by_seen(const void* a, const void* b) noexcept nogil:
    cdef const Entry* x = <const Entry*>a
    cdef const Entry* y = <const Entry*>b
    if x.when != y.when:
        return -1 if x.when < y.when else 1
    return -1 if x.order < y.order else (1 if x.order > y.order else 0)


cdef inline void table_sort(Table* t) noexcept nogil:
    """The entries least recently seen first (the index is stale until `table_keep_sorted`)."""
    if t.count:
        qsort(t.entries, t.count, sizeof(Entry), by_seen)


cdef inline int table_keep_sorted(Table* t, Py_ssize_t drop) noexcept nogil:
    """After `table_sort`: the first `drop` entries dropped, the bytes of the others laid out
    in their order, and the index made again."""
    cdef unsigned char* laid = <unsigned char*>malloc(t.room if t.room else 1)
    cdef Py_ssize_t i, used = 0, slots = 64
    if laid == NULL:
        return -1
    for i in range(drop, t.count):
        memcpy(laid + used, t.bytes + t.entries[i].offset, t.entries[i].length)
        t.entries[i - drop] = t.entries[i]
        t.entries[i - drop].offset = used
        used += t.entries[i].length
    free(t.bytes)
    t.bytes = laid
    t.used = used
    t.count -= drop
    while slots <= 2 * t.count:
        slots *= 2
    return table_reindex(t, slots)
