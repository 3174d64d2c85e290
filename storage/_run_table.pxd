# A set of byte strings (a stream's token runs, storage/_token_granules.pyx), each with when it
# was last seen and its place among insertions: all in C, so that noting runs needs no GIL. The
# bytes lie end to end in one buffer, the entries in an array, and an open-addressed index
# (linear probing, at most half full) maps a run's hash to its entry. Entries are only ever
# dropped all at once (`table_keep_sorted`), which rebuilds the buffer and the index: no
# tombstones. All inline: compiled into the module that cimports it.
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, qsort, realloc
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
    Py_ssize_t cap  # the bytes it is meant to hold (0: none): past it, the buffer grows less
    Py_ssize_t fail_after  # a test's: allocations left before one fails (-1: none fails)


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


cdef inline void* table_alloc(Table* t, void* p, size_t size) noexcept nogil:
    """`realloc` (`malloc` where `p` is NULL), or NULL where a test made it fail."""
    if t.fail_after == 0:
        return NULL
    if t.fail_after > 0:
        t.fail_after -= 1
    return realloc(p, size)


cdef inline int table_init(Table* t, uint64_t seed, Py_ssize_t cap) noexcept nogil:
    cdef Py_ssize_t i
    t.seed = seed
    t.cap = cap
    t.fail_after = -1
    t.bytes = NULL
    t.used = t.room = 0
    t.entries = NULL
    t.count = t.capacity = 0
    t.inserted = 0
    t.mask = 63
    t.index = <Py_ssize_t*>table_alloc(t, NULL, 64 * sizeof(Py_ssize_t))
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


cdef inline void table_fill_index(Table* t, Py_ssize_t* index, Py_ssize_t slots) noexcept nogil:
    """`index` (`slots` of them, a power of two over twice the entries) made for the entries."""
    cdef Py_ssize_t i, s
    for i in range(slots):
        index[i] = -1
    for i in range(t.count):
        s = <Py_ssize_t>(t.entries[i].hash & <uint64_t>(slots - 1))
        while index[s] >= 0:
            s = (s + 1) & (slots - 1)
        index[s] = i


cdef inline int table_reindex(Table* t, Py_ssize_t slots) noexcept nogil:
    """The index made again with `slots` (a power of two over twice the entries)."""
    cdef Py_ssize_t* index = <Py_ssize_t*>table_alloc(t, NULL, slots * sizeof(Py_ssize_t))
    if index == NULL:
        return -1
    table_fill_index(t, index, slots)
    free(t.index)
    t.index = index
    t.mask = slots - 1
    return 0


cdef inline Py_ssize_t table_room(Table* t, Py_ssize_t need) noexcept nogil:
    """The buffer's room for `need` bytes: doubled up to the cap, an eighth more past it."""
    cdef Py_ssize_t room = 2 * t.room if 2 * t.room >= need else need + 4096
    if t.cap and room > t.cap:
        room = max(t.cap, need + need // 8)
    return room


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
    if 2 * (t.count + 1) > t.mask:
        # The index grows before a run is added, not after: one that could not grow holds
        # nothing more, and stays at most half full (a probe always ends).
        if table_reindex(t, 2 * (t.mask + 1)) < 0:
            return -1
        s = <Py_ssize_t>(h & <uint64_t>t.mask)
        while t.index[s] >= 0:
            s = (s + 1) & t.mask
    if t.used + n > t.room:
        room = table_room(t, t.used + n)
        grown = table_alloc(t, t.bytes, room)
        if grown == NULL:
            return -1
        t.bytes = <unsigned char*>grown
        t.room = room
    if t.count == t.capacity:
        room = 2 * t.capacity if t.capacity else 256
        grown = table_alloc(t, t.entries, room * sizeof(Entry))
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
    in their order (in no more room than the cap, where they fit), and the index made again.
    Out of memory: -1, nothing dropped, the index made again in place."""
    cdef Py_ssize_t i, used = 0, slots = 64, room = t.room
    cdef unsigned char* laid
    cdef Py_ssize_t* index
    for i in range(drop, t.count):
        used += t.entries[i].length
    while slots <= 2 * (t.count - drop):
        slots *= 2
    if t.cap and room > t.cap:
        room = max(t.cap, used)  # what grew past the cap is handed back
    laid = <unsigned char*>table_alloc(t, NULL, room if room else 1)
    index = <Py_ssize_t*>table_alloc(t, NULL, slots * sizeof(Py_ssize_t))
    if laid == NULL or index == NULL:
        free(laid)
        free(index)
        table_fill_index(t, t.index, t.mask + 1)  # the entries were sorted
        return -1
    used = 0
    for i in range(drop, t.count):
        memcpy(laid + used, t.bytes + t.entries[i].offset, t.entries[i].length)
        t.entries[i - drop] = t.entries[i]
        t.entries[i - drop].offset = used
        used += t.entries[i].length
    free(t.bytes)
    t.bytes = laid
    t.used = used
    t.room = room
    t.count -= drop
    table_fill_index(t, index, slots)
    free(t.index)
    t.index = index
    t.mask = slots - 1
    return 0
