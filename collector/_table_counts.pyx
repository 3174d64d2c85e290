# cython: language_level=3, boundscheck=False, wraparound=False
"""Counts of a set of hashes against a block table, for a reset's recovery points
(storage/recovery.py): how many of the map's hashes before the clear are cached again, and
what those hittable again weigh. Each point reads a whole before map on the ingest thread, where
a Python lookup per hash cost it ~10 ms for 20,000 blocks; here each is a probe of the slot map.
"""

from libc.stdint cimport int32_t, uint64_t

from kvscope.collector._slot_map cimport SlotMap
from kvscope.collector._table_core cimport HITTABLE, TableCore


def count_cached(TableCore table, hashes):
    """How many of `hashes` are cached in `table`."""
    cdef SlotMap slot_of = table._slot_of
    cdef Py_ssize_t found = 0
    cdef uint64_t h
    for value in hashes:
        h = value
        if slot_of._find(h) >= 0:
            found += 1
    return found


def hittable_weight(TableCore table, dict weights):
    """The sum of `weights[h]` over the hashes `h` of `weights` hittable in `table`."""
    cdef SlotMap slot_of = table._slot_of
    cdef unsigned char* flags = <unsigned char*>table._flags.data.as_voidptr
    cdef Py_ssize_t pos
    cdef uint64_t h
    total = 0
    for value, weight in weights.items():
        h = value
        pos = slot_of._find(h)
        if pos >= 0 and flags[slot_of._vals[pos]] & HITTABLE:
            total += weight
    return total
