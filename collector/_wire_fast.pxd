# What the fused replay's first pass (collector/_fused_read.pyx) shares with the compiled decoder
# (collector/_wire_fast.pyx) besides their checks (collector/_wire_checks.pxd): the table key of
# an event, through the same cache of the last one.
from libc.stdint cimport int64_t

from kvscope.collector._msgpack cimport Reader
from kvscope.collector._wire_scan cimport Event


cdef class _LastKey:
    cdef bytes medium  # None: nil
    cdef bint group_nil
    cdef int64_t group
    cdef object key

    cdef object key_of(self, Reader* r, Event* e)
