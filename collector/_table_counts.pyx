# cython: language_level=3, boundscheck=False, wraparound=False
"""Counts of a set of hashes against a block table, for a reset's recovery points
(storage/recovery.py): how many of the map's hashes before the clear are cached again, and
what those hittable again weigh. Each point reads a whole before map on the ingest thread, where
a Python lookup per hash cost it ~10 ms for 20,000 blocks; here each is a probe of the slot map.
And a reset's prefix groups counted at each recovery offset (storage/reset_follower.py), in the
store writer: the blocks of each group of the before map cached again, hittable again, and shared
and hittable again, without a dict of the table made per offset.
"""

from cpython cimport array
from libc.stdint cimport int32_t, uint64_t

import array

from kvscope.collector._slot_map cimport EMPTY, SlotMap
from kvscope.collector._table_core cimport HITTABLE, TableCore


def count_cached(TableCore table, const uint64_t[::1] hashes, bint hittable=False):
    """How many of `hashes` (an `array("Q")`) are cached in `table` (`hittable`: and
    hittable): a probe each over a C array, no Python int made per hash."""
    cdef SlotMap slot_of = table._slot_of
    cdef unsigned char* flags = <unsigned char*>table._flags.data.as_voidptr
    cdef Py_ssize_t i, pos, found = 0
    for i in range(hashes.shape[0]):
        pos = slot_of._find(hashes[i])
        if pos >= 0 and (not hittable or flags[slot_of._vals[pos]] & HITTABLE):
            found += 1
    return found


def hittable_hash_array(TableCore table):
    """The hittable hashes as a new `array("Q")`, in the slot map's order: read in one pass."""
    cdef SlotMap slot_of = table._slot_of
    cdef unsigned char* flags = <unsigned char*>table._flags.data.as_voidptr
    cdef size_t i
    cdef Py_ssize_t k = 0
    found = array.array("Q", bytes(slot_of._size * sizeof(uint64_t)))
    cdef uint64_t[::1] view = found
    for i in range(slot_of._cap):
        if slot_of._vals[i] != EMPTY and flags[slot_of._vals[i]] & HITTABLE:
            view[k] = slot_of._keys[i]
            k += 1
    del view
    del found[k:]
    return found


def add_group_counts(TableCore table, SlotMap marks, int32_t[::1] counts):
    """Adds, per group `g` of `marks` (hash -> g * 2, plus 1 if shared: `chain_groups`'), its
    blocks cached in `table` to `counts[3g]`, those hittable to `counts[3g + 1]` and those
    hittable and shared to `counts[3g + 2]`. It walks the smaller of the two maps and probes
    the other: after a reset the table is nearly empty, later the before map may be the
    smaller."""
    cdef SlotMap slot_of = table._slot_of
    cdef unsigned char* flags = <unsigned char*>table._flags.data.as_voidptr
    cdef size_t i, cap
    cdef Py_ssize_t pos
    cdef int32_t slot, mark
    cdef Py_ssize_t g
    cdef bint table_walked = slot_of._size <= marks._size
    cdef SlotMap walked = slot_of if table_walked else marks
    cdef SlotMap probed = marks if table_walked else slot_of
    cap = walked._cap
    for i in range(cap):
        if walked._vals[i] == EMPTY:
            continue
        pos = probed._find(walked._keys[i])
        if pos < 0:
            continue
        if table_walked:
            slot, mark = walked._vals[i], probed._vals[pos]
        else:
            slot, mark = probed._vals[pos], walked._vals[i]
        g = 3 * <Py_ssize_t>(mark >> 1)
        if g + 2 >= counts.shape[0]:
            raise IndexError("a group past the counts")
        counts[g] += 1
        if flags[slot] & HITTABLE:
            counts[g + 1] += 1
            if mark & 1:
                counts[g + 2] += 1
