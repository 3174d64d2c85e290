"""The first pass of `FusedApply` (collector/_replay.pyx) over a batch: `BatchRead`, which it
extends."""

from libc.stdint cimport int64_t, uint32_t, uint64_t

from kvscope.collector._msgpack cimport Reader
from kvscope.collector._wire_fast cimport _LastKey
from kvscope.collector._wire_scan cimport N_TAILS, Event, TailMemo


cdef struct Op:
    # One event of a batch, as `Batch.events` holds it (consecutive removals from a table are
    # one), its hashes and tokens in the batch's scratch buffers.
    int kind
    Py_ssize_t key  # index in the batch's keys
    Py_ssize_t hashes, n_hashes
    Py_ssize_t tokens, n_tokens  # its token ids, if it has some (tokens -1: none)
    bint with_tokens  # the table keeps them (store_chain keeps block_size per hash, or none)
    bint has_parent
    uint64_t parent
    Py_ssize_t block_size


cdef class BatchRead:
    cdef int64_t max_block_size  # the decoder's limit the batch is checked against
    # What the first pass read of the batch besides its events, for the live ingest's rules.
    cdef bint rank_nil, has_clear
    cdef int64_t rank_value
    cdef _LastKey last_key
    cdef Event event
    # The last tails the scan read (collector/_wire_scan.pxd's `TailMemo`), kept from batch to
    # batch whatever stream they came from: a memo is taken only where it is exactly the bytes.
    cdef TailMemo tails[N_TAILS]
    cdef Op* ops
    cdef uint64_t* hashes
    cdef uint32_t* tokens
    cdef Py_ssize_t ops_cap, hashes_cap, tokens_cap, n_ops, n_hashes, n_tokens
    cdef list keys  # the batch's table keys, in order, one per run of events that share one
    cdef Py_ssize_t n_keys  # (the list is overwritten in place, not emptied: no realloc a batch)

    cdef int read(self, bytes payload, double* ts) except -2
    cdef object built(self, object payload, object seq, double ts)
