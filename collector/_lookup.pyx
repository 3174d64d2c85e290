# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The lookup by tokens of a `BlockTable` (`BlockTable.longest_prefix`), on the columns its
compiled core holds (declared in _table_core.pxd).

The API's POST /lookup runs it against every table of every replica (100 replicas: 100 walks a
request). In Python one level of the walk (slice a block's tokens, compare, next sibling) cost
about 0.7 us, a 30-block prompt over 100 replicas 2.2 ms; here a level is a memcmp of a block
packed at the table's token width (the query is packed so once per width, `TokenQuery.packed`).
It only reads the table's columns.
"""

from cpython cimport array as carray
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memcmp

from kvscope.collector._table_core cimport (
    FOREIGN_EXTRA, HAS_TOKENS, NO_SLOT, TableCore, column_data,
)
from kvscope.collector._token_column cimport TokenColumn


cdef inline bint _fits(
    int32_t slot, const uint8_t* want, TokenColumn tokens, const uint8_t* flags,
    dict extras, object lora_name,
):
    """Whether cached block `slot` holds the packed tokens `want` (and the query's LoRA, if
    any)."""
    cdef uint8_t f = flags[slot]
    cdef const uint8_t* held = tokens.at(slot)
    if not f & HAS_TOKENS or want[0] != held[0]:
        return False
    if memcmp(held, want, tokens.stride) != 0:
        return False
    if extras is None:
        return True  # no LoRA or extra keys anywhere in the table, none asked for
    return not f & FOREIGN_EXTRA and extras.get(slot, (None, None))[0] == lora_name


def longest_prefix(TableCore table, query, lora_name=None):
    """`BlockTable.longest_prefix`: how many leading full blocks of `query` (a `TokenQuery`)
    are cached in `table`, chained from block 0: the first among the roots, each next one
    among the children of the one before."""
    cdef Py_ssize_t bs = table.block_size
    cdef TokenColumn tokens = table._token_column
    if bs == 0:
        return 0
    cdef carray.array tokens_of_query = query.tokens
    if len(tokens_of_query) < bs:
        return 0
    roots = table._roots.get(query.first_block(bs))
    if not roots:
        return 0
    # Packed at the table's width, up to the first block with a token wider (matching none).
    cdef bytes packed
    cdef Py_ssize_t blocks
    packed, blocks = query.packed(bs, tokens.width)
    if blocks == 0:
        return 0
    cdef dict extras = table._extras
    if lora_name is None and not extras:
        extras = None
    cdef const uint8_t* flags = <const uint8_t*>column_data(table._flags)
    cdef const int32_t* first_child = <const int32_t*>column_data(table._first_child)
    cdef const int32_t* next_sibling = <const int32_t*>column_data(table._next_sibling)
    cdef const uint8_t* want = <const uint8_t*>packed
    cdef int32_t found = NO_SLOT, child
    for root in roots:
        if _fits(root, want, tokens, flags, extras, lora_name):
            found = root
            break
    cdef Py_ssize_t matched = 0
    while found != NO_SLOT:
        matched += 1
        if matched == blocks:
            break
        want += tokens.stride
        child = first_child[found]
        found = NO_SLOT
        while child != NO_SLOT:
            if _fits(child, want, tokens, flags, extras, lora_name):
                found = child
                break
            child = next_sibling[child]
    return matched
