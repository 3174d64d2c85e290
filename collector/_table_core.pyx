# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled core of `BlockTable` (collector/block_table.py): its slot map, its two writes
and its lookup by tokens.

`SlotMap` maps 64-bit block hashes to table slots in two flat C arrays. A Python
`dict[int, int]` costs about 100 bytes an entry once its int objects are counted; a million
cached blocks made it the largest part of a map. Here an entry is a uint64 key and an int32
value in an open-addressed table (linear probing, deletion by backward shift, so there are no
tombstones): about 12 bytes over a load of 0.375 to 0.75. It offers the part of dict's
interface `BlockTable` uses.

`TableCore` is `BlockTable`'s state as C fields, with the ingest hot path: `store_chain` and
`remove`, every BlockStored and BlockRemoved. They work on the table's `array` columns through
their buffers and do the common cases (a new block under a cached parent; dropping a leaf) in
C; the rare ones (orphans rejoining, dropping an inner block, LoRA and extra keys, bytes
hashes) call back into `BlockTable`'s Python methods.
"""

import array

from cpython cimport array as carray
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.math cimport NAN, floor
from libc.string cimport memcmp, memcpy, memset
from cpython.object cimport Py_SIZE

cdef int32_t EMPTY = -1
cdef size_t MIN_CAPACITY = 8
cdef double MS_MAX = 4294967295.0


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    # murmur3's finaliser: tests and bytes-derived hashes are not uniformly spread.
    x ^= x >> 33
    x *= <uint64_t>0xFF51AFD7ED558CCDULL
    x ^= x >> 33
    x *= <uint64_t>0xC4CEB9FE1A85EC53ULL
    x ^= x >> 33
    return x


def _as_uint64(values):
    return values if isinstance(values, array.array) and values.typecode == "Q" else array.array("Q", values)


def _as_int32(values):
    return values if isinstance(values, array.array) and values.typecode == "i" else array.array("i", values)


cdef class SlotMap:
    cdef uint64_t* _keys
    cdef int32_t* _vals
    cdef size_t _mask
    cdef Py_ssize_t _size
    cdef size_t _changes
    """Bumped whenever an entry is added or removed: iterators check it, as dict's do."""

    def __cinit__(self, Py_ssize_t capacity=0):
        cdef size_t cap = MIN_CAPACITY
        while cap * 3 < <size_t>capacity * 4:
            cap <<= 1
        self._allocate(cap)

    def __dealloc__(self):
        PyMem_Free(self._keys)
        PyMem_Free(self._vals)

    cdef int _allocate(self, size_t cap) except -1:
        keys = <uint64_t*>PyMem_Malloc(cap * sizeof(uint64_t))
        vals = <int32_t*>PyMem_Malloc(cap * sizeof(int32_t))
        if keys == NULL or vals == NULL:
            PyMem_Free(keys)
            PyMem_Free(vals)
            raise MemoryError()
        memset(vals, 0xFF, cap * sizeof(int32_t))  # every value EMPTY
        self._keys, self._vals, self._mask, self._size = keys, vals, cap - 1, 0
        return 0

    @classmethod
    def from_arrays(cls, hashes, slots):
        """A map of `hashes[i] -> slots[i]` (the columns a checkpoint keeps)."""
        cdef const uint64_t[:] keys = _as_uint64(hashes)
        cdef const int32_t[:] values = _as_int32(slots)
        if keys.shape[0] != values.shape[0]:
            raise ValueError("as many hashes as slots, please")
        cdef SlotMap made = cls(keys.shape[0])
        cdef Py_ssize_t i
        for i in range(keys.shape[0]):
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
        for i in range(self._mask + 1):
            if self._vals[i] != EMPTY:
                key_view[k] = self._keys[i]
                value_view[k] = self._vals[i]
                k += 1
        return keys, values

    # --- the table ----------------------------------------------------------------------------
    cdef inline Py_ssize_t _find(self, uint64_t key) noexcept:
        cdef size_t i = _mix(key) & self._mask
        while self._vals[i] != EMPTY:
            if self._keys[i] == key:
                return <Py_ssize_t>i
            i = (i + 1) & self._mask
        return -1

    cdef int _put(self, uint64_t key, int32_t value) except -1:
        if value < 0:
            raise ValueError("slots are non-negative")
        cdef size_t i = _mix(key) & self._mask
        while self._vals[i] != EMPTY:
            if self._keys[i] == key:
                self._vals[i] = value
                return 0
            i = (i + 1) & self._mask
        self._keys[i] = key
        self._vals[i] = value
        self._size += 1
        self._changes += 1
        if <size_t>self._size * 4 > (self._mask + 1) * 3:
            self._resize((self._mask + 1) * 2)
        return 0

    cdef int _resize(self, size_t cap) except -1:
        cdef uint64_t* old_keys = self._keys
        cdef int32_t* old_vals = self._vals
        cdef size_t old_cap = self._mask + 1, i, j
        self._allocate(cap)
        for i in range(old_cap):
            if old_vals[i] != EMPTY:
                j = _mix(old_keys[i]) & self._mask
                while self._vals[j] != EMPTY:
                    j = (j + 1) & self._mask
                self._keys[j] = old_keys[i]
                self._vals[j] = old_vals[i]
                self._size += 1
        PyMem_Free(old_keys)
        PyMem_Free(old_vals)
        return 0

    cdef void _remove_at(self, size_t i) noexcept:
        # Backward shift: pull later entries of the probe run into the hole, so that every
        # entry stays reachable from its home without tombstones.
        cdef size_t j = i, home
        while True:
            j = (j + 1) & self._mask
            if self._vals[j] == EMPTY:
                break
            home = _mix(self._keys[j]) & self._mask
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
        if self._mask + 1 > MIN_CAPACITY and <size_t>self._size * 8 < self._mask + 1:
            self._resize((self._mask + 1) // 2)  # give memory back after a clear-like drain
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
        for i in range(self._mask + 1):
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
        return (self._mask + 1) * (sizeof(uint64_t) + sizeof(int32_t))


# --- BlockTable's hot writes ------------------------------------------------------------------
# These mirror block_table.py's constants and columns; tests/test_prefix_map.py checks the
# table against a reference model through them.
cdef int32_t NO_SLOT = -1
cdef uint8_t HITTABLE = 1
cdef uint8_t HAS_PARENT = 2
cdef uint8_t HAS_TOKENS = 4
cdef uint8_t FOREIGN_EXTRA = 8


cdef struct Columns:
    # Raw pointers into a table's columns: taken again whenever they may have been resized.
    uint16_t* count
    uint64_t* parent
    int32_t* first_child
    int32_t* next_sibling
    int32_t* prev_sibling
    uint8_t* flags
    uint32_t* first_ms
    uint32_t* last_ms
    uint32_t* tokens
    Py_ssize_t slots


cdef inline void _link(Columns* c, int32_t parent_slot, int32_t child) noexcept:
    """Make `child` the first of `parent_slot`'s children."""
    cdef int32_t head = c.first_child[parent_slot]
    c.next_sibling[child] = head
    c.prev_sibling[child] = NO_SLOT
    if head != NO_SLOT:
        c.prev_sibling[head] = child
    c.first_child[parent_slot] = child


cdef inline void _unlink(Columns* c, int32_t parent_slot, int32_t child) noexcept:
    cdef int32_t prev = c.prev_sibling[child], following = c.next_sibling[child]
    if prev == NO_SLOT:
        c.first_child[parent_slot] = following
    else:
        c.next_sibling[prev] = following
    if following != NO_SLOT:
        c.prev_sibling[following] = prev


cdef inline bint _is_uint32_array(object values) noexcept:
    # What the wire's fast decoder hands over; checked in C, not by reading `.typecode`.
    return isinstance(values, carray.array) and (<carray.array>values).ob_descr.typecode == b"I"


cdef inline void* _buffer(carray.array column) noexcept:
    return column.data.as_voidptr


cdef class TableCore:
    """The state of a `BlockTable` (collector/block_table.py, its subclass) and its hot writes.

    The fields are C fields, not instance attributes: the writes below read and update a dozen
    of them per event, and as attributes of a Python object that lookup cost more than the
    write itself (about 0.8 us per BlockStored). Python code reads and sets them by name all
    the same; what is rare (orphans rejoining, dropping an inner block, checkpoints) stays in
    `BlockTable`'s Python methods.
    """

    cdef public object key
    cdef public double base_ts
    """Timestamps are kept as milliseconds since this instant."""
    cdef public Py_ssize_t block_size
    """Tokens per block, learnt from the first store that carries tokens."""
    cdef public Py_ssize_t hittable_count, orphan_count, copies, unknown_removals
    cdef public SlotMap _slot_of
    cdef public carray.array _count, _parent, _first_child, _next_sibling, _prev_sibling
    cdef public carray.array _flags, _first_ms, _last_ms, _tokens
    cdef public list _free
    """Slots freed by removals, reused first (last freed, first reused)."""
    cdef public Py_ssize_t _high
    """Slots below this have been handed out; those from it to the columns' end never."""
    cdef double _ms_ts
    cdef uint32_t _ms_value
    """`_ms` of `_ms_ts`: the stores of a batch share its ts."""
    cdef public dict _waiting
    """Missing parent hash -> the orphan slots that name it."""
    cdef public dict _roots
    """First-block token bytes -> root slots (parent None), for lookups by tokens. The slots are
    a dict's keys (an ordered set): roots sharing their first tokens (cache salts, LoRAs) may be
    many, and a list made each removal a scan."""
    cdef public dict _odd_tokens
    """Tokens of blocks whose size differs from the table's (partial or placeholder)."""
    cdef public dict _extras
    """slot -> (lora_name, extra_keys) for the rare blocks that have them."""
    cdef public dict _raw
    """hash -> the bytes it travelled as, for publishers that send bytes hashes."""
    cdef public dict _raw_parent
    """slot -> its parent's bytes, for chain heads of publishers that send bytes hashes."""

    def __init__(self, key, double base_ts):
        self.key = key
        self.base_ts = base_ts
        self.block_size = self.hittable_count = self.orphan_count = 0
        self.copies = self.unknown_removals = self._high = 0
        self._slot_of = SlotMap()
        self._count = array.array("H")
        self._parent = array.array("Q")
        self._first_child = array.array("i")
        self._next_sibling = array.array("i")
        self._prev_sibling = array.array("i")
        self._flags = array.array("B")
        self._first_ms = array.array("I")
        self._last_ms = array.array("I")
        self._tokens = array.array("I")
        self._free = []
        self._ms_ts = NAN
        self._ms_value = 0
        self._waiting = {}
        self._roots = {}
        self._odd_tokens = {}
        self._extras = {}
        self._raw = {}
        self._raw_parent = {}

    cdef inline void _take(self, Columns* c) noexcept:
        c.slots = Py_SIZE(self._count)
        c.count = <uint16_t*>_buffer(self._count)
        c.parent = <uint64_t*>_buffer(self._parent)
        c.first_child = <int32_t*>_buffer(self._first_child)
        c.next_sibling = <int32_t*>_buffer(self._next_sibling)
        c.prev_sibling = <int32_t*>_buffer(self._prev_sibling)
        c.flags = <uint8_t*>_buffer(self._flags)
        c.first_ms = <uint32_t*>_buffer(self._first_ms)
        c.last_ms = <uint32_t*>_buffer(self._last_ms)
        c.tokens = <uint32_t*>_buffer(self._tokens)

    cdef uint32_t _ms(self, double ts) noexcept:
        """`ts` in milliseconds since `base_ts`, clamped to what a uint32 column holds."""
        if ts == self._ms_ts:
            return self._ms_value
        cdef double ms = floor((ts - self.base_ts) * 1000)
        if not ms > 0:  # NaN too
            ms = 0
        elif ms > MS_MAX:
            ms = MS_MAX
        self._ms_ts, self._ms_value = ts, <uint32_t>ms
        return self._ms_value

    def _forget_root(self, int32_t slot):
        """Take root `slot` out of `_roots`, before its tokens are gone."""
        cdef Columns c
        odd = self._odd_tokens.get(slot)
        if odd is not None:
            self._unroot(array.array("I", odd).tobytes(), slot)
        elif (<uint8_t*>_buffer(self._flags))[slot] & HAS_TOKENS:
            self._take(&c)
            self._unroot(self._root_key(&c, slot), slot)

    cdef inline bytes _root_key(self, Columns* c, int32_t slot):
        return (<const char*>&c.tokens[slot * self.block_size])[: self.block_size * 4]

    cdef int _unroot(self, bytes key, int32_t slot) except -1:
        roots = self._roots.get(key)
        if roots is not None and slot in roots:
            del roots[slot]
            if not roots:
                del self._roots[key]
        return 0

    def _link(self, int32_t parent_slot, int32_t child):
        """Make `child` the first of `parent_slot`'s children."""
        cdef Columns c
        self._take(&c)
        _link(&c, parent_slot, child)

    def _unlink(self, int32_t parent_slot, int32_t child):
        """Take `child` out of `parent_slot`'s children."""
        cdef Columns c
        self._take(&c)
        _unlink(&c, parent_slot, child)

    def store_chain(
        self,
        list hashes,
        parent,
        token_ids,
        Py_ssize_t block_size,
        double ts,
        lora_name=None,
        extra_keys=None,
        raw_hashes=None,
        raw_parent=None,
    ):
        """Apply one `BlockStored`: block i's parent is block i-1, block 0's is `parent`."""
        cdef Py_ssize_t n = len(hashes), i, bs
        cdef uint32_t ms = self._ms(ts)
        if self.block_size == 0 and block_size > 0:
            self._set_block_size(block_size)
        tokens = None
        if block_size and len(token_ids) == n * block_size:
            try:
                tokens = token_ids if _is_uint32_array(token_ids) else array.array("I", token_ids)
            except (OverflowError, TypeError):
                tokens = None
        cdef bint same_size = tokens is not None and block_size == self.block_size
        cdef uint8_t has_tokens = HAS_TOKENS if same_size else 0
        cdef uint32_t* chunk_tokens = NULL
        cdef carray.array tokens_array
        if tokens is not None:
            tokens_array = tokens
            chunk_tokens = tokens_array.data.as_uints
        bs = self.block_size
        cdef SlotMap slot_of = self._slot_of
        cdef Columns c
        self._take(&c)
        cdef list free = self._free
        cdef dict waiting = self._waiting
        cdef bint has_parent = parent is not None
        cdef uint64_t parent_hash = parent if has_parent else 0
        cdef int32_t parent_slot = NO_SLOT
        cdef Py_ssize_t found
        if has_parent:
            found = slot_of._find(parent_hash)
            if found >= 0:
                parent_slot = slot_of._vals[found]
        cdef Py_ssize_t hittable_added = 0, orphans_added = 0
        cdef int32_t slot
        cdef uint64_t block_hash
        cdef uint8_t hittable
        cdef bint extras = lora_name is not None or extra_keys is not None
        for i in range(n):
            block_hash = hashes[i]
            found = slot_of._find(block_hash)
            if found >= 0:
                # Another physical copy of a cached hash.
                slot = slot_of._vals[found]
                c.count[slot] += 1
                c.last_ms[slot] = ms
                has_parent, parent_hash, parent_slot = True, block_hash, slot
                continue
            if free:
                slot = free.pop()
            else:
                slot = self._high
                if slot == c.slots:
                    self._grow()
                    self._take(&c)
                self._high = slot + 1
            slot_of._put(block_hash, slot)
            c.count[slot] = 1
            c.first_ms[slot] = c.last_ms[slot] = ms
            c.first_child[slot] = NO_SLOT
            if parent_slot != NO_SLOT:
                # Under a cached parent: the common case.
                c.parent[slot] = parent_hash
                hittable = c.flags[parent_slot] & HITTABLE
                c.flags[slot] = HAS_PARENT | hittable | has_tokens
                hittable_added += hittable
                _link(&c, parent_slot, slot)
            elif not has_parent:
                c.parent[slot] = 0
                c.flags[slot] = HITTABLE | has_tokens
                hittable_added += 1
                c.next_sibling[slot] = c.prev_sibling[slot] = NO_SLOT
            else:
                c.parent[slot] = parent_hash
                c.flags[slot] = HAS_PARENT | has_tokens
                c.next_sibling[slot] = c.prev_sibling[slot] = NO_SLOT
                waiting.setdefault(parent_hash, []).append(slot)
                orphans_added += 1
            if chunk_tokens != NULL:
                if same_size:
                    memcpy(&c.tokens[slot * bs], &chunk_tokens[i * block_size], block_size * 4)
                else:
                    self._odd_tokens[slot] = tuple(tokens[i * block_size : (i + 1) * block_size])
                if not has_parent:
                    self._roots.setdefault(
                        (<char*>&chunk_tokens[i * block_size])[: block_size * 4], {}
                    )[slot] = None
            if extras:
                extra = extra_keys[i] if extra_keys and i < len(extra_keys) else None
                if lora_name is not None or extra is not None:
                    self._set_extras(slot, lora_name, extra)
            if raw_hashes is not None:
                self._raw[hashes[i]] = raw_hashes[i]
                if i == 0 and raw_parent is not None:
                    self._raw_parent[slot] = raw_parent
            if waiting and hashes[i] in waiting:
                # Earlier orphans named this block as parent: Python rejoins them (rare).
                self.hittable_count += hittable_added
                self.orphan_count += orphans_added
                hittable_added = orphans_added = 0
                self._adopt(hashes[i], slot)
            has_parent, parent_hash, parent_slot = True, block_hash, slot
        self.copies += n
        self.hittable_count += hittable_added
        self.orphan_count += orphans_added

    def remove(self, list block_hashes):
        """Apply one `BlockRemoved`: one copy of each hash is gone."""
        cdef SlotMap slot_of = self._slot_of
        cdef Columns c
        self._take(&c)
        cdef list free = self._free
        cdef Py_ssize_t unknown = 0, copies_gone = 0, hittable_gone = 0, found, parent_found
        cdef int32_t slot, parent_slot
        cdef uint16_t left
        cdef uint8_t slot_flags
        cdef uint64_t block_hash
        for key in block_hashes:
            block_hash = key
            found = slot_of._find(block_hash)
            if found < 0:
                unknown += 1
                continue
            slot = slot_of._vals[found]
            copies_gone += 1
            left = c.count[slot] - 1
            if left:
                c.count[slot] = left
                continue
            slot_flags = c.flags[slot]
            parent_slot = NO_SLOT
            if slot_flags & HAS_PARENT:
                parent_found = slot_of._find(c.parent[slot])
                if parent_found >= 0:
                    parent_slot = slot_of._vals[parent_found]
            if (
                parent_slot != NO_SLOT
                and parent_slot != slot
                and c.first_child[slot] == NO_SLOT
                and not slot_flags & ~(HAS_PARENT | HITTABLE | HAS_TOKENS)
            ):
                # A leaf under a cached parent: the common case (vLLM evicts tails first).
                slot_of._delete_at(found)
                _unlink(&c, parent_slot, slot)
                if slot_flags & HITTABLE:
                    hittable_gone += 1
                c.flags[slot] = 0
                if self._raw:
                    self._raw.pop(key, None)
                free.append(slot)
            elif (
                not slot_flags & HAS_PARENT
                and c.first_child[slot] == NO_SLOT
                and slot_flags == HITTABLE | HAS_TOKENS
            ):
                # A childless root: every request's first block ends so.
                slot_of._delete_at(found)
                self._unroot(self._root_key(&c, slot), slot)
                hittable_gone += 1
                c.flags[slot] = 0
                if self._raw:
                    self._raw.pop(key, None)
                free.append(slot)
            else:
                # An inner block, or an orphan: Python relinks what hangs from it (rare).
                self.hittable_count -= hittable_gone
                hittable_gone = 0
                self._drop_block(key, slot, parent_slot)
                self._take(&c)
        self.unknown_removals += unknown
        self.copies -= copies_gone
        self.hittable_count -= hittable_gone


# --- lookup by tokens -------------------------------------------------------------------------
# The API's POST /lookup runs this against every table of every replica (100 replicas: 100
# walks a request). In Python one level of the walk (slice a block's tokens, compare, next
# sibling) cost about 0.7 us, a 30-block prompt over 100 replicas 2.2 ms; here a level is a
# memcmp. It only reads the table's columns.
cdef inline bint _fits(
    int32_t slot, const uint32_t* want, const uint32_t* tokens, const uint8_t* flags,
    Py_ssize_t bs, dict extras, object lora_name,
):
    """Whether cached block `slot` holds the tokens `want` (and the query's LoRA, if any)."""
    cdef uint8_t f = flags[slot]
    if not f & HAS_TOKENS or want[0] != tokens[slot * bs]:
        return False
    if memcmp(&tokens[slot * bs], want, bs * sizeof(uint32_t)) != 0:
        return False
    if extras is None:
        return True  # no LoRA or extra keys anywhere in the table, none asked for
    return not f & FOREIGN_EXTRA and extras.get(slot, (None, None))[0] == lora_name


def longest_prefix(TableCore table, query, lora_name=None):
    """`BlockTable.longest_prefix`: how many leading full blocks of `query` (a `TokenQuery`)
    are cached in `table`, chained from block 0: the first among the roots, each next one
    among the children of the one before."""
    cdef Py_ssize_t bs = table.block_size
    if bs == 0:
        return 0
    cdef carray.array tokens_of_query = query.tokens
    cdef Py_ssize_t blocks = len(tokens_of_query) // bs
    if blocks == 0:
        return 0
    roots = table._roots.get(query.first_block(bs))
    if not roots:
        return 0
    cdef dict extras = table._extras
    if lora_name is None and not extras:
        extras = None
    cdef const uint32_t* tokens = <const uint32_t*>_buffer(table._tokens)
    cdef const uint8_t* flags = <const uint8_t*>_buffer(table._flags)
    cdef const int32_t* first_child = <const int32_t*>_buffer(table._first_child)
    cdef const int32_t* next_sibling = <const int32_t*>_buffer(table._next_sibling)
    cdef const uint32_t* want = <const uint32_t*>_buffer(tokens_of_query)
    cdef int32_t found = NO_SLOT, child
    for root in roots:
        if _fits(root, want, tokens, flags, bs, extras, lora_name):
            found = root
            break
    cdef Py_ssize_t matched = 0
    while found != NO_SLOT:
        matched += 1
        if matched == blocks:
            break
        want += bs
        child = first_child[found]
        found = NO_SLOT
        while child != NO_SLOT:
            if _fits(child, want, tokens, flags, bs, extras, lora_name):
                found = child
                break
            child = next_sibling[child]
    return matched
