# The block table's removal write (`TableCore._remove`, collector/_table_core.pyx), inline: one
# `BlockRemoved`'s hashes on C values, as the live apply and the fused replay hand them over.
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t

from kvscope.collector._slot_map cimport SlotMap
from kvscope.collector._table_core cimport (
    HAS_PARENT,
    HAS_TOKENS,
    HITTABLE,
    NO_SLOT,
    Columns,
    TableCore,
    _unlink,
    push_free,
    take_columns,
)


cdef inline int remove_hashes(TableCore table, const uint64_t* hashes, Py_ssize_t n) except -1:
    """One copy of each of `hashes` is gone: leaves under a cached parent and childless roots
    are dropped here; an inner block or an orphan goes through `table._drop_block` (Python)."""
    cdef SlotMap slot_of = table._slot_of
    cdef Columns c
    take_columns(table, &c)
    cdef Py_ssize_t unknown = 0, copies_gone = 0, hittable_gone = 0, found, parent_found, i
    cdef int32_t slot, parent_slot
    cdef uint32_t left
    cdef uint8_t slot_flags
    cdef uint64_t block_hash
    for i in range(n):
        slot_of._prefetch(hashes[i])
    for i in range(n):
        block_hash = hashes[i]
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
            if table._raw:
                table._raw.pop(block_hash, None)
            push_free(table, slot)
        elif (
            not slot_flags & HAS_PARENT
            and c.first_child[slot] == NO_SLOT
            and slot_flags == HITTABLE | HAS_TOKENS
        ):
            # A childless root: every request's first block ends so.
            slot_of._delete_at(found)
            table._unroot(table._token_column.block_bytes(slot), slot)
            hittable_gone += 1
            c.flags[slot] = 0
            if table._raw:
                table._raw.pop(block_hash, None)
            push_free(table, slot)
        else:
            # An inner block, or an orphan: Python relinks what hangs from it (rare).
            table.hittable_count -= hittable_gone
            hittable_gone = 0
            table._drop_block(block_hash, slot, parent_slot)
            take_columns(table, &c)
    table.unknown_removals += unknown
    table.copies -= copies_gone
    table.hittable_count -= hittable_gone
    return 0
