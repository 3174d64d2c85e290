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

    # (its fields: collector/_fleet_route.pxd)
    # `_ranks`: topic -> {rank: Route}: a topic is here while it has a route.
    # `_reader`: the router's `FusedApply`, or None: each batch decoded (`_route_rest`).
    # `_max_block_size`: the limit the reader reads each batch with (the default limits').

    def __cinit__(self, *args, **kwargs):
        self._ranks = {}

    def route_batch(self, frames):
        """The stream of one message and its batch as read (see `FleetRouter.route_batch`)."""
        to = self.route(frames)
        batch, self.routed_batch = self.routed_batch, None
        return to, batch

    cdef object route(self, frames):
        """`route_batch`'s route, its batch left in `routed_batch`: no tuple made for the
        usual message (the drain calls this in C)."""
        cdef object ranks, known, reader = self._reader, rank
        if len(frames) != 3:
            return self._rest(frames, -1, None)  # refused there
        topic, seq, payload = frames
        ranks = self._ranks.get(topic)
        if ranks is None or reader is None:  # not followed (yet): not read; or decoded there
            return self._rest(frames, -1, None)
        if type(reader) is FusedApply:
            rank = (<FusedApply>reader).route_read(seq, payload, self._max_block_size)
        else:
            rank = reader.route_read(seq, payload, self._max_block_size)
        if rank < 0:  # the reader declined it: its rank is scanned for there
            return self._rest(frames, -1, None)
        known = (<dict>ranks).get(rank)
        if known is None:  # a new rank of the topic
            return self._rest(frames, rank, reader)
        self.routed_batch = reader
        return known

    cdef object _rest(self, frames, rank, reader):
        """`_route_rest`'s route, its batch left in `routed_batch`."""
        to, self.routed_batch = self._route_rest(frames, rank, reader)
        return to
