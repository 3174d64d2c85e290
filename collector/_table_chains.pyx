# cython: language_level=3, boundscheck=False, wraparound=False
"""`chain_groups`: a block table's cached blocks grouped by the chain they hang from, for a
reset's prefix groups (storage/reset_follower.py, which says what a group is).

A block's root is the head of its chain: a block whose parent is None or not cached. A block
is shared when two or more leaves (cached prefixes) hang under it. Groups are numbered in the
order of their smallest hash. A hash cycle (hostile input) is cut where a walk up from a block
has gone as far as the table has blocks, as the reference in tests/test_table_chains.py does:
the answer is the same, hash for hash, only computed over C arrays. It runs over a whole
before map once per reset, in the store writer, where per-block dict work was most of its time.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, uint8_t, uint64_t
from libc.string cimport memcpy

from kvscope.collector._radix_sort cimport radix_sort
from kvscope.collector._slot_map cimport EMPTY, SlotMap
from kvscope.collector._table_core cimport HAS_PARENT, Columns, TableCore, take_columns


cdef void* _alloc(Py_ssize_t n, size_t size) except NULL:
    cdef void* p = PyMem_Malloc(<size_t>(n if n > 0 else 1) * size)
    if p == NULL:
        raise MemoryError()
    return p


def chain_groups(TableCore table, Py_ssize_t first):
    """(hash -> its group * 2, plus 1 if it is shared, as a slot map; each group's root, size
    and shared blocks), groups numbered from `first`: the marks a follower counts a table
    against (collector/_table_counts.pyx's `add_group_counts`), made with the groups."""
    cdef SlotMap slot_of = table._slot_of
    cdef Columns c
    take_columns(table, &c)
    cdef Py_ssize_t n = slot_of._size, cap = slot_of._cap
    cdef Py_ssize_t i, k = 0, j, npath, norder = 0, nedges = 0, groups = 0
    cdef int32_t start, h, p, r, slot, g
    cdef Py_ssize_t pos
    cdef uint64_t* hashes = NULL
    cdef int32_t* parent = NULL  # the block index of the parent if cached, else -1
    cdef int32_t* at = NULL  # slot-map position -> block index
    cdef int32_t* root = NULL
    cdef int32_t* order = NULL
    cdef int32_t* path = NULL
    cdef uint8_t* leaves = NULL
    cdef int32_t* group_of_root = NULL
    cdef uint64_t* by_hash = NULL
    # Per group: its blocks, and its shared ones (counted in C: a Python int per block was
    # much of the grouping's cost).
    cdef int32_t* size_of = NULL
    cdef int32_t* shared_of = NULL
    if first < 0 or first + n > 0x3FFFFFFF:
        raise ValueError("a group index must fit 30 bits")
    cdef SlotMap marks = SlotMap(n)
    roots = []
    try:
        hashes = <uint64_t*>_alloc(n, sizeof(uint64_t))
        parent = <int32_t*>_alloc(n, sizeof(int32_t))
        at = <int32_t*>_alloc(cap, sizeof(int32_t))
        root = <int32_t*>_alloc(n, sizeof(int32_t))
        order = <int32_t*>_alloc(2 * n, sizeof(int32_t))
        path = <int32_t*>_alloc(n + 2, sizeof(int32_t))
        leaves = <uint8_t*>_alloc(n, sizeof(uint8_t))
        group_of_root = <int32_t*>_alloc(n, sizeof(int32_t))
        by_hash = <uint64_t*>_alloc(n, sizeof(uint64_t))
        size_of = <int32_t*>_alloc(n, sizeof(int32_t))
        shared_of = <int32_t*>_alloc(n, sizeof(int32_t))
        # Blocks in the slot map's order (the order `counts()` gives): the cut of a cycle
        # depends on it.
        for i in range(cap):
            if slot_of._vals[i] != EMPTY:
                at[i] = <int32_t>k
                hashes[k] = slot_of._keys[i]
                k += 1
        k = 0
        for i in range(cap):
            slot = slot_of._vals[i]
            if slot == EMPTY:
                continue
            parent[k] = -1
            if c.flags[slot] & HAS_PARENT:
                pos = slot_of._find(c.parent[slot])
                if pos >= 0:
                    parent[k] = at[pos]
            root[k] = -1
            k += 1
        # Each block's root; `order`: every block after its parent (some twice, as the
        # reference has them: a block reached from below, then again in its own turn).
        for start in range(n):
            p = parent[start]
            if p >= 0 and root[p] >= 0:
                root[start] = root[p]
                order[norder] = start
                norder += 1
                continue
            npath = 0
            h = start
            while root[h] < 0:
                p = parent[h]
                if p < 0 or npath > n:  # (past n: a cycle, in hostile input; cut here)
                    root[h] = h
                    order[norder] = h
                    norder += 1
                    break
                path[npath] = h
                npath += 1
                h = p
            r = root[h]
            for j in range(npath - 1, -1, -1):
                h = path[j]
                if root[h] < 0:
                    root[h] = r
                    order[norder] = h
                    norder += 1
        # Leaves under each block, counted up the (child, parent) edges from the last: only
        # "two or more" matters, so the counts stop at 2.
        for i in range(n):
            leaves[i] = 1
        for i in range(norder):
            h = order[i]
            if root[h] != h:
                leaves[parent[h]] = 0
        for i in range(norder - 1, -1, -1):
            h = order[i]
            if root[h] != h:
                p = parent[h]
                leaves[p] = 2 if leaves[p] + leaves[h] >= 2 else leaves[p] + leaves[h]
        # Groups by their smallest hash.
        for i in range(n):
            group_of_root[i] = -1
        memcpy(by_hash, hashes, <size_t>n * sizeof(uint64_t))
        if radix_sort(by_hash, n) < 0:
            raise MemoryError()
        for i in range(n):
            h = at[slot_of._find(by_hash[i])]
            r = root[h]
            g = group_of_root[r]
            if g < 0:
                g = group_of_root[r] = <int32_t>groups
                groups += 1
                roots.append(hashes[r])
                size_of[g] = shared_of[g] = 0
            size_of[g] += 1
            if leaves[h] >= 2:
                shared_of[g] += 1
            marks._put(hashes[h], <int32_t>(2 * (first + g) + (leaves[h] >= 2)))
        sizes = [size_of[g] for g in range(groups)]
        shared_sizes = [shared_of[g] for g in range(groups)]
        return marks, roots, sizes, shared_sizes
    finally:
        PyMem_Free(hashes)
        PyMem_Free(parent)
        PyMem_Free(at)
        PyMem_Free(root)
        PyMem_Free(order)
        PyMem_Free(path)
        PyMem_Free(leaves)
        PyMem_Free(group_of_root)
        PyMem_Free(by_hash)
        PyMem_Free(size_of)
        PyMem_Free(shared_of)
