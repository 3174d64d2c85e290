"""`FusedApply` (collector/_replay.pyx), declared for the modules that call it in C: a stream's
live path (_ingest_live.pyx) and the fleet's router (_fleet_route.pyx)."""

from libc.stdint cimport int64_t

from kvscope.collector._fused_read cimport BatchRead
from kvscope.collector._map_counters cimport Counts
from kvscope.collector._table_core cimport TableCore


cdef class FusedApply(BatchRead):
    cdef object prefix_map, limits, epoch, recv_ts
    cdef bint degraded  # what a clear in the batch tells `PrefixMap.clear`
    cdef readonly Py_ssize_t taken  # batches applied here, not left to decode + apply
    cdef bint busy  # in `live` or `apply_read`: another thread's call meanwhile declines
    # The batch a router read (`route_read`), until `apply_read` applies it.
    cdef object read_payload
    cdef int64_t read_max_block_size
    cdef double read_ts
    cdef int64_t read_seq
    # For a map that is not a `MapCore` (which keeps its own): the table of the last batch's
    # last key, while the map's tables are that dict (an entry of it is never replaced: a clear
    # replaces the dict).
    cdef dict last_tables
    cdef object last_table_key
    cdef TableCore last_table
    # Added to the map's counters at `flush`: before a clear or a batch applied the usual way.
    cdef Counts tally
    cdef double last_ts
    cdef bint pending  # some counter above is not added yet

    cdef int bind(self, prefix_map, epoch, bint degraded, recv_ts,
                  int64_t max_block_size) except -1
    cdef int flush(self) except -1
    cdef int apply(self, object seq, double ts, object changes, dict tables) except -1
    cdef bint fused(self, payload, seq) except -1
    cdef Py_ssize_t told(self)
    cdef bint ready(self, prefix_map, payload, epoch, bint degraded, recv_ts,
                    int64_t max_block_size) except -1
    # The live path's two halves for a stream with a sink, called in C by
    # collector/_ingest_live.pyx.
    cpdef prepare(self, prefix_map, payload, epoch, bint degraded, recv_ts,
                  int64_t max_block_size)
    cpdef apply_prepared(self, seq, changes)
    cpdef route_read(self, seq_frame, payload, int64_t max_block_size)
    cpdef seq_read(self, payload)
    cpdef apply_read(self, prefix_map, payload, seq, epoch, bint degraded, recv_ts,
                     int64_t max_block_size)
