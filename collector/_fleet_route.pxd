"""`RouteTable` (collector/_fleet_route.pyx), declared for the fleet's drain
(collector/_fleet_drain.pyx), which routes each message through it in C."""


cdef class _Known:
    cdef object topic  # bytes
    cdef dict ranks  # `_ranks[topic]`
    cdef Py_ssize_t version  # the table's when this was cached
    cdef object rank  # the rank last routed (an int), and its route
    cdef object route


cdef class RouteStream:
    # The stream a route's messages go to, and its ingest, as the fleet's drain found them in
    # the collector's `StreamTable` at its `version` (valid while that is still the table's).
    cdef object version
    cdef object stream
    cdef object ingest


cdef class RouteTable:
    # topic -> {rank: Route}: changed only through `_add_route` and `_drop_route` (the cached
    # places hold its dicts, and are made stale by those alone).
    cdef public dict _ranks
    cdef public object _reader
    cdef public object _max_block_size
    # The batch of the message `route` routed last, as `route_batch` returns it beside its route
    # (held until the next message).
    cdef object routed_batch
    # Known topics' cached places, by hash (`_PLACES`, each a `_Known` or None), and the
    # version of the routes: bumped by every change, it makes every place stale.
    cdef list _known
    cdef Py_ssize_t _version

    cdef object route(self, frames)
    cdef object _rest(self, frames, rank, reader)
    cdef _Known _place_of(self, topic)
    cdef _cache(self, topic, dict ranks, rank, route)
