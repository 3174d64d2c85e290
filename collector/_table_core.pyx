# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled core of `BlockTable` (collector/block_table.py): its state as C fields and its
two writes.

`TableCore` is `BlockTable`'s state as C fields, with the ingest hot path: `store_chain` and
`remove`, every BlockStored and BlockRemoved (thin wrappers of `_store` and `_remove`, which
take C values: the fused replay, collector/_replay.pyx, calls those straight; `_remove`'s loop is
inline in _table_remove.pxd). They work on the table's `array` columns through their buffers
and do the common cases (a new block under a cached parent; dropping a leaf) in C; the rare ones (orphans rejoining, dropping an inner block, LoRA and extra keys) call back the
hooks that _table_core.pxd declares and `BlockTable` defines. The hash -> slot index is a
`SlotMap` (collector/_slot_map.pyx), probed inline; the lookup by tokens is _lookup.pyx.
"""

import array

from cpython cimport array as carray
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport Py_SIZE
from libc.math cimport NAN, floor
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t

from kvscope.collector._slot_map cimport EMPTY, SlotMap
from kvscope.collector._table_remove cimport remove_hashes
from kvscope.collector._token_column cimport TokenColumn

cdef double MS_MAX = 4294967295.0
cdef uint32_t MAX_COPIES = 0xFFFFFFFFU
"""A block's copy count stops here (the column's width); stores past it are counted instead."""
GROW_MIN = 4096
"""Slots added at least when the columns are full (else 1/16 of the slots there are), once a
table has that many; a new table starts with FIRST_SLOTS and doubles up to it."""
FIRST_SLOTS = 64
TOKENS_STEP_MIN_BYTES = 1 << 20
"""The tokens column grows by at most this much at a time, unless 1/16 of it is more: blocks of a
few thousand tokens must not reserve GROW_MIN blocks' worth of room."""

cdef carray.array _UINT64 = array.array("Q")


cdef carray.array _uint64s(list hashes):
    """`hashes` as C uint64s: OverflowError or TypeError for one that is not."""
    cdef Py_ssize_t n = len(hashes), i
    cdef carray.array out = carray.clone(_UINT64, n, False)
    cdef uint64_t* data = <uint64_t*>out.data.as_voidptr
    for i in range(n):
        data[i] = hashes[i]
    return out


cdef int _extend(carray.array column, Py_ssize_t n, bint ones) except -1:
    """Lengthen `column` by `n` items, all bits 0 (or 1). Through `frombytes`: it refuses (a
    BufferError) while a checkpoint holds a view of the column, where a C realloc would not."""
    cdef Py_ssize_t size = n * column.ob_descr.itemsize
    column.frombytes(b"\xff" * size if ones else bytes(size))
    return 0


cdef class TableCore:
    """The state of a `BlockTable` (collector/block_table.py, its subclass) and its hot writes.

    The fields are C fields, not instance attributes: the writes below read and update a dozen
    of them per event, and as attributes of a Python object that lookup cost more than the
    write itself (about 0.8 us per BlockStored). Python code reads and sets them by name all
    the same; what is rare (orphans rejoining, dropping an inner block, checkpoints) stays in
    `BlockTable`'s Python methods. The fields are declared, with what each holds, in
    _table_core.pxd.
    """

    def __init__(self, key, double base_ts):
        self.key = key
        self.base_ts = base_ts
        self.block_size = self.hittable_count = self.orphan_count = 0
        self.copies = self.unknown_removals = self._high = 0
        self._slot_of = SlotMap()
        self._count = array.array("I")
        self._parent = array.array("Q")
        self._first_child = array.array("i")
        self._next_sibling = array.array("i")
        self._prev_sibling = array.array("i")
        self._flags = array.array("B")
        self._first_ms = array.array("I")
        self._last_ms = array.array("I")
        self._token_column = TokenColumn()
        self.saturated_stores = self.side_bytes = 0
        self._n_free = 0
        self._ms_ts = NAN
        self._ms_value = 0
        self._waiting = {}
        self._roots = {}
        self._odd_tokens = {}
        self._extras = {}
        self._raw = {}
        self._raw_parent = {}

    def __dealloc__(self):
        PyMem_Free(self._free_slots)

    def __len__(self):
        # In C: the store's recovery follower counts the map's blocks after every batch.
        return self._slot_of._size

    def __contains__(self, block_hash):
        # In C: a reset's orphans (storage/reset_orphans.py) ask it of every block a followed
        # batch names, where a Python method's frame was most of the cost.
        return block_hash in self._slot_of

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

    @property
    def _tokens(self):
        """The tokens column as uint32s (a copy): what checkpoints keep, whatever the width."""
        return self._token_column.to_uint32()

    @_tokens.setter
    def _tokens(self, tokens):
        plain = tokens if _is_uint32_array(tokens) else array.array("I", tokens)
        self._token_column.assign(self.block_size, plain)

    def _forget_root(self, int32_t slot):
        """Take root `slot` out of `_roots`, before its tokens are gone."""
        odd = self._odd_tokens.get(slot)
        if odd is not None:
            self._unroot(odd, slot)
        elif (<uint8_t*>column_data(self._flags))[slot] & HAS_TOKENS:
            self._unroot(self._token_column.block_bytes(slot), slot)

    cdef int _unroot(self, bytes key, int32_t slot) except -1:
        roots = self._roots.get(key)
        if roots is not None and slot in roots:
            del roots[slot]
            if not roots:
                del self._roots[key]
        return 0

    # --- storage ------------------------------------------------------------------------------
    cdef int _grow(self) except -1:
        """Lengthen the columns but tokens by a chunk of never-used slots (handed out from
        `_high` on)."""
        cdef Py_ssize_t slots = Py_SIZE(self._count)
        cdef Py_ssize_t n = max(GROW_MIN, slots // 16) if slots >= GROW_MIN else max(FIRST_SLOTS, slots)
        _extend(self._count, n, False)
        _extend(self._parent, n, False)
        _extend(self._first_child, n, True)  # NO_SLOT
        _extend(self._next_sibling, n, True)
        _extend(self._prev_sibling, n, True)
        _extend(self._flags, n, False)
        _extend(self._first_ms, n, False)
        _extend(self._last_ms, n, False)
        return 0

    cdef int _reserve_tokens(self, int32_t slot) except -1:
        """Room in the tokens column for the tokens of `slot`: the column covers the slots that
        hold tokens, not every slot, and grows in steps bounded in bytes (as uint32 tokens)."""
        cdef Py_ssize_t per_slot = self.block_size * 4
        cdef Py_ssize_t have = self._token_column.slots
        cdef Py_ssize_t step = max(have // 16, min(GROW_MIN, max(1, TOKENS_STEP_MIN_BYTES // per_slot)))
        self._token_column.cover(max(slot + 1, have + step))
        return 0

    cdef int _grow_free(self, Py_ssize_t need) except -1:
        """Room for `need` slots on the free stack (grown by doubling)."""
        cdef Py_ssize_t cap = max(need, 2 * self._free_cap, 16)
        cdef void* more = PyMem_Realloc(self._free_slots, cap * sizeof(int32_t))
        if more == NULL:
            raise MemoryError()
        self._free_slots, self._free_cap = <int32_t*>more, cap
        return 0

    @property
    def _free(self):
        """The free slots as a list, the next one to be reused last (a copy)."""
        return [self._free_slots[i] for i in range(self._n_free)]

    @_free.setter
    def _free(self, slots):
        cdef list values = list(slots)
        cdef Py_ssize_t i, n = len(values)
        cdef int32_t slot
        for value in values:  # all checked before any is taken
            slot = value
            if slot < 0:
                raise ValueError(f"a free slot is not negative: {slot}")
        if n > self._free_cap:
            self._grow_free(n)
        for i in range(n):
            self._free_slots[i] = values[i]
        self._n_free = n

    def _release(self, int32_t slot):
        """Put `slot`, emptied, on the free stack (the next store reuses it first)."""
        if slot < 0:
            raise ValueError(f"a free slot is not negative: {slot}")
        push_free(self, slot)

    def token_bytes(self):
        """Bytes held for the blocks' contents: the tokens column, the odd-sized blocks' tokens
        and extra keys (what `IngestLimits.max_token_bytes_per_stream` bounds)."""
        return content_bytes(self)

    # --- the hooks BlockTable defines (see _table_core.pxd) -----------------------------------
    cpdef _set_extras(self, int32_t slot, lora_name, extra):
        raise NotImplementedError("BlockTable._set_extras")

    cpdef _adopt(self, block_hash, int32_t slot):
        raise NotImplementedError("BlockTable._adopt")

    cpdef _drop_block(self, block_hash, int32_t slot, int32_t parent_slot):
        raise NotImplementedError("BlockTable._drop_block")

    # --- the tree -----------------------------------------------------------------------------
    def _link(self, int32_t parent_slot, int32_t child):
        """Make `child` the first of `parent_slot`'s children."""
        cdef Columns c
        take_columns(self, &c)
        _link(&c, parent_slot, child)

    def _unlink(self, int32_t parent_slot, int32_t child):
        """Take `child` out of `parent_slot`'s children."""
        cdef Columns c
        take_columns(self, &c)
        _unlink(&c, parent_slot, child)

    def store_chain(self, list hashes, parent, token_ids, Py_ssize_t block_size, double ts,
                    lora_name=None, extra_keys=None, raw_hashes=None, raw_parent=None):
        """Apply one `BlockStored`: block i's parent is block i-1, block 0's is `parent`.

        Its fields are as collector/wire_rules.py admits them, and the map's limits were checked
        before (collector/limits.py): nothing here refuses a batch halfway."""
        cdef Py_ssize_t n = len(hashes)
        cdef carray.array c_hashes = _uint64s(hashes)  # (before any change: an int may not fit)
        cdef carray.array tokens = None
        if block_size and len(token_ids) == n * block_size:
            try:
                tokens = token_ids if _is_uint32_array(token_ids) else array.array("I", token_ids)
                if len(tokens) != n * block_size:  # a bytes-like's bytes taken as raw items
                    tokens = array.array("I", list(token_ids))
            except (OverflowError, TypeError):
                pass
        self._store(
            <uint64_t*>c_hashes.data.as_voidptr, n, parent is not None,
            parent if parent is not None else 0, tokens is not None,
            NULL if tokens is None else tokens.data.as_uints, block_size, ts, lora_name,
            extra_keys, raw_hashes, raw_parent,
        )

    cdef int _store(
        self, const uint64_t* hashes, Py_ssize_t n, bint has_parent, uint64_t parent_hash,
        bint with_tokens, const uint32_t* chunk_tokens, Py_ssize_t block_size, double ts,
        lora_name, extra_keys, raw_hashes, raw_parent,
    ) except -1:
        """`store_chain` on C values: `chunk_tokens`, when `with_tokens` (else NULL), holds
        `block_size` (> 0) token ids per hash."""
        cdef Py_ssize_t i, bs, saturated = 0
        cdef uint32_t ms = self._ms(ts)
        if self.block_size == 0 and block_size > 0:
            self.block_size = block_size  # (no tokens are held before: the column is empty)
        cdef bint same_size = with_tokens and block_size == self.block_size
        cdef uint8_t has_tokens = HAS_TOKENS if same_size else 0
        bs = self.block_size
        cdef TokenColumn token_column = self._token_column
        if same_size:
            token_column.prepare(bs, chunk_tokens, n * bs)  # (widened here if need be)
        cdef SlotMap slot_of = self._slot_of
        cdef Columns c
        take_columns(self, &c)
        cdef dict waiting = self._waiting
        cdef int32_t parent_slot = NO_SLOT
        cdef Py_ssize_t found
        cdef size_t at
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
            slot_of._prefetch(hashes[i])
        for i in range(n):
            block_hash = hashes[i]
            at = slot_of._locate(block_hash)
            if slot_of._vals[at] != EMPTY:
                # Another physical copy of a cached hash.
                slot = slot_of._vals[at]
                if c.count[slot] != MAX_COPIES:
                    c.count[slot] += 1
                else:
                    saturated += 1
                c.last_ms[slot] = ms
                has_parent, parent_hash, parent_slot = True, block_hash, slot
                continue
            if self._n_free:
                self._n_free -= 1
                slot = self._free_slots[self._n_free]
            else:
                slot = self._high
                if slot == c.slots:
                    self._grow()
                    take_columns(self, &c)
                self._high = slot + 1
            slot_of._put_at(at, block_hash, slot)  # (the map unchanged since `_locate`)
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
                    if slot >= token_column.slots:
                        self._reserve_tokens(slot)
                    token_column.put(slot, &chunk_tokens[i * block_size])
                else:
                    self._odd_tokens[slot] = (<const char*>&chunk_tokens[i * block_size])[: block_size * 4]
                    self.side_bytes += block_size * 4
                    c.flags[slot] |= ASIDE
                if not has_parent:
                    self._roots.setdefault(
                        (<const char*>&chunk_tokens[i * block_size])[: block_size * 4], {}
                    )[slot] = None
            if extras:
                extra = extra_keys[i] if extra_keys and i < len(extra_keys) else None
                if lora_name is not None or extra is not None:
                    self._set_extras(slot, lora_name, extra)
                    c.flags[slot] |= ASIDE
            if raw_hashes is not None:
                self._raw[block_hash] = raw_hashes[i]
                if i == 0 and raw_parent is not None:
                    self._raw_parent[slot] = raw_parent
                    c.flags[slot] |= ASIDE
            if waiting and block_hash in waiting:
                # Earlier orphans named this block as parent: Python rejoins them (rare).
                self.hittable_count += hittable_added
                self.orphan_count += orphans_added
                hittable_added = orphans_added = 0
                self._adopt(block_hash, slot)
            has_parent, parent_hash, parent_slot = True, block_hash, slot
        self.copies += n - saturated
        self.saturated_stores += saturated
        self.hittable_count += hittable_added
        self.orphan_count += orphans_added
        return 0

    def remove(self, list block_hashes):
        """Apply one `BlockRemoved`: one copy of each hash is gone."""
        cdef carray.array c_hashes = _uint64s(block_hashes)
        self._remove(<uint64_t*>c_hashes.data.as_voidptr, len(block_hashes))

    cdef int _remove(self, const uint64_t* hashes, Py_ssize_t n) except -1:
        """`remove` on C values (the fused replay's too)."""
        return remove_hashes(self, hashes, n)
