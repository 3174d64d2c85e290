# cython: language_level=3
"""The usual case of `FleetRouter.route_batch` (collector/fleet_router.py) in C: a message of a
topic and DP rank already routed, its batch read by the router's `FusedApply`. Every message of
a fleet comes through here, where Python cost a frame and its bytecodes a message. The
rest (a new route, a refusal, a batch the reader declines, a router that decodes) is the
router's `_route_rest`, handed what was read here so that nothing is read twice.
"""

cimport cython

from kvscope.collector._replay cimport FusedApply


@cython.auto_pickle(False)
cdef class RouteTable:
    """The routes a `FleetRouter` (its subclass) registered, by topic then rank."""

    cdef public dict _ranks
    """topic -> {rank: Route}: a topic is here while it has a route."""
    cdef public object _reader
    """The router's `FusedApply`, or None: each batch decoded (`_route_rest`)."""
    cdef public object _max_block_size
    """The limit the reader reads each batch with (the default limits')."""

    def __cinit__(self, *args, **kwargs):
        self._ranks = {}

    def route_batch(self, frames):
        """The stream of one message and its batch as read (see `FleetRouter.route_batch`)."""
        cdef object ranks, known, reader = self._reader, rank
        if len(frames) != 3:
            return self._route_rest(frames, -1, None)  # refused there
        topic, seq, payload = frames
        ranks = self._ranks.get(topic)
        if ranks is None or reader is None:  # not followed (yet): not read; or decoded there
            return self._route_rest(frames, -1, None)
        if type(reader) is FusedApply:
            rank = (<FusedApply>reader).route_read(seq, payload, self._max_block_size)
        else:
            rank = reader.route_read(seq, payload, self._max_block_size)
        if rank < 0:  # the reader declined it: its rank is scanned for there
            return self._route_rest(frames, -1, None)
        known = (<dict>ranks).get(rank)
        if known is None:  # a new rank of the topic
            return self._route_rest(frames, rank, reader)
        return known, reader
