# The contract of the block table's compiled core (collector/_table_core.pyx): the per-block flag
# bits (exported to Python as ints: block_table.py imports them from here), the table's state as
# C fields, and the hooks the compiled writes call back for the rare cases, which `BlockTable`
# (collector/block_table.py) overrides in Python.
from cpython cimport array as carray
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t

from kvscope.collector._slot_map cimport SlotMap
from kvscope.collector._token_column cimport TokenColumn


cpdef enum:
    # _flags bits
    HITTABLE = 1
    HAS_PARENT = 2
    HAS_TOKENS = 4
    FOREIGN_EXTRA = 8  # extra keys besides a LoRA name: tokens alone cannot match the block
    ASIDE = 16  # entries in _odd_tokens, _extras or _raw_parent: Python drops the block


cpdef enum:
    NO_SLOT = -1  # no block: the end of a child or sibling list


cdef struct Columns:
    # Raw pointers into a table's columns: taken again whenever they may have been resized.
    uint32_t* count
    uint64_t* parent
    int32_t* first_child
    int32_t* next_sibling
    int32_t* prev_sibling
    uint8_t* flags
    uint32_t* first_ms
    uint32_t* last_ms
    Py_ssize_t slots


# The child lists: a parent's first child, and each child's siblings, doubly linked.
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


cdef inline void* column_data(carray.array column) noexcept:
    return column.data.as_voidptr


cdef class TableCore:
    cdef public object key  # the table's TableKey
    cdef public double base_ts  # timestamps are kept as milliseconds since this instant
    cdef public Py_ssize_t block_size  # tokens per block, from the first store that says
    cdef public Py_ssize_t hittable_count, orphan_count, copies, unknown_removals
    # Stores of a block whose copy count was at its maximum (2**32 - 1), so not counted: from
    # the first, that block's count is below vLLM's.
    cdef public Py_ssize_t saturated_stores
    # About the bytes held in _odd_tokens and in _extras' extra keys (block_table.extras_bytes):
    # counted with the tokens against the stream's limit.
    cdef public Py_ssize_t side_bytes
    cdef public SlotMap _slot_of
    # Per-slot columns (`array`s): copies, parent hash, child and sibling links, flags, first
    # and last store (ms since base_ts); and block_size tokens per slot, packed (its `_tokens`
    # property gives and takes them as uint32s, for checkpoints).
    cdef public carray.array _count, _parent, _first_child, _next_sibling, _prev_sibling
    cdef public carray.array _flags, _first_ms, _last_ms
    cdef readonly TokenColumn _token_column
    # Slots freed by removals, reused first (last freed, first reused): a C stack, so that a
    # removal and a store move no int object through a list; `_free` gives and takes it as a list.
    cdef int32_t* _free_slots
    cdef Py_ssize_t _n_free, _free_cap
    cdef public Py_ssize_t _high  # slots below it were handed out; from it on, never
    cdef double _ms_ts
    cdef uint32_t _ms_value  # `_ms` of `_ms_ts`: the stores of a batch share its ts
    cdef public dict _waiting  # missing parent hash -> the orphan slots that name it
    # First-block token bytes -> root slots (parent None), for lookups by tokens. The slots are
    # a dict's keys (an ordered set): roots sharing their first tokens (cache salts, LoRAs) may
    # be many, and a list made each removal a scan.
    cdef public dict _roots
    cdef public dict _odd_tokens  # slot -> tokens (uint32 bytes) of a block of another size
    cdef public dict _extras  # slot -> (lora_name, extra_keys), for the rare blocks with them
    cdef public dict _raw  # hash -> the bytes it travelled as (publishers sending bytes)
    cdef public dict _raw_parent  # slot -> its parent's bytes, for such chain heads

    cdef uint32_t _ms(self, double ts) noexcept
    cdef int _unroot(self, bytes key, int32_t slot) except -1
    cdef int _grow(self) except -1
    cdef int _reserve_tokens(self, int32_t slot) except -1
    cdef int _grow_free(self, Py_ssize_t need) except -1

    # The writes on C values: `store_chain` and `remove` wrap them, the fused replay
    # (collector/_replay.pyx) calls them straight from a payload's bytes.
    cdef int _store(
        self, const uint64_t* hashes, Py_ssize_t n, bint has_parent, uint64_t parent_hash,
        bint with_tokens, const uint32_t* chunk_tokens, Py_ssize_t block_size, double ts,
        lora_name, extra_keys, raw_hashes, raw_parent,
    ) except -1
    cdef int _remove(self, const uint64_t* hashes, Py_ssize_t n) except -1

    # What the compiled writes call back for the rare cases; BlockTable defines them in Python.
    # Keep a block's LoRA name and extra keys (and flag FOREIGN_EXTRA):
    cpdef _set_extras(self, int32_t slot, lora_name, extra)
    # `block_hash`, just stored at `slot`, is the missing parent of earlier orphans:
    cpdef _adopt(self, block_hash, int32_t slot)
    # The last copy of an inner block or an orphan is gone: relink what hangs from it.
    cpdef _drop_block(self, block_hash, int32_t slot, int32_t parent_slot)


cdef inline int push_free(TableCore table, int32_t slot) except -1:
    """Put `slot` on `table`'s free stack."""
    if table._n_free == table._free_cap:
        table._grow_free(table._n_free + 1)
    table._free_slots[table._n_free] = slot
    table._n_free += 1
    return 0


cdef inline void take_columns(TableCore table, Columns* c) noexcept:
    """Point `c` at `table`'s columns (again after they may have been resized)."""
    c.slots = table._count.ob_size
    c.count = <uint32_t*>column_data(table._count)
    c.parent = <uint64_t*>column_data(table._parent)
    c.first_child = <int32_t*>column_data(table._first_child)
    c.next_sibling = <int32_t*>column_data(table._next_sibling)
    c.prev_sibling = <int32_t*>column_data(table._prev_sibling)
    c.flags = <uint8_t*>column_data(table._flags)
    c.first_ms = <uint32_t*>column_data(table._first_ms)
    c.last_ms = <uint32_t*>column_data(table._last_ms)


cdef inline Py_ssize_t content_bytes(TableCore table) noexcept:
    """What `table` holds of its blocks' contents: the tokens column, counted at 4 bytes a
    token whatever its width (as the limits were set), and `side_bytes`."""
    cdef TokenColumn tokens = table._token_column
    return tokens.slots * tokens.block_size * 4 + table.side_bytes
