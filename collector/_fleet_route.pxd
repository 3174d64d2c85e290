"""`RouteTable` (collector/_fleet_route.pyx), declared for the fleet's drain
(collector/_fleet_drain.pyx), which routes each message through it in C."""


cdef class RouteTable:
    cdef public dict _ranks
    cdef public object _reader
    cdef public object _max_block_size
    # The batch of the message `route` routed last, as `route_batch` returns it beside its route
    # (held until the next message).
    cdef object routed_batch

    cdef object route(self, frames)
    cdef object _rest(self, frames, rank, reader)
