# cython: language_level=3
"""The usual case of `FleetRouter.route_batch` (collector/fleet_router.py) in C: a message of a
topic and DP rank already routed, its batch read by the router's `FusedApply`. Every message of
a fleet comes through here, where Python cost a frame and its bytecodes a message. The
rest (a new route, a refusal, a batch the reader declines, a router that decodes) is the
router's `_route_rest`, handed what was read here so that nothing is read twice.

A known topic's routes are found in a cache of places by the topic's hash (the receiver hands
each topic over as one `bytes`, its hash computed once), its bytes compared, with the route of
the rank last routed: no dict looked up for the usual message. Every change of the routes
(`_add_route`, `_drop_route`) makes every place stale.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport PyObject_Hash
from cpython.ref cimport PyObject
from libc.string cimport memcmp

from kvscope.collector._replay cimport FusedApply

cdef enum:
    _PLACES = 1024  # a power of two


@cython.final
@cython.auto_pickle(False)
cdef class _Known:
    """A followed topic as a cache place holds it: its ranks' routes, and the last one routed."""

    # (its fields: collector/_fleet_route.pxd)


@cython.final
@cython.auto_pickle(False)
cdef class RouteStream:
    """What the fleet's drain (collector/_fleet_drain.pyx) keeps on a `Route` of its stream:
    nothing until it first routes a message there."""

    # (its fields: collector/_fleet_route.pxd)


cdef inline bint _same_bytes(object held, object topic) noexcept:
    if held is topic:
        return True
    cdef Py_ssize_t size = PyBytes_GET_SIZE(held)
    return (
        size == PyBytes_GET_SIZE(topic)
        and memcmp(PyBytes_AS_STRING(held), PyBytes_AS_STRING(topic), size) == 0
    )


@cython.auto_pickle(False)
cdef class RouteTable:
    """The routes a `FleetRouter` (its subclass) registered, by topic then rank."""

    # (its fields: collector/_fleet_route.pxd)
    # `_ranks`: topic -> {rank: Route}: a topic is here while it has a route.
    # `_reader`: the router's `FusedApply`, or None: each batch decoded (`_route_rest`).
    # `_max_block_size`: the limit the reader reads each batch with (the default limits').

    def __cinit__(self, *args, **kwargs):
        self._ranks = {}
        self._known = [None] * _PLACES
        self._version = 0

    def _add_route(self, topic, rank, route):
        """`_ranks[topic][rank] = route`: every cached place stale."""
        self._version += 1
        self._ranks.setdefault(topic, {})[rank] = route

    def _drop_route(self, topic, rank):
        """The route of `topic` and `rank` gone (and the topic, with its last): every cached
        place stale."""
        self._version += 1
        ranks = self._ranks[topic]
        del ranks[rank]
        if not ranks:
            del self._ranks[topic]

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
        cdef _Known place = self._place_of(topic)
        if place is not None:
            ranks = place.ranks
        else:
            ranks = self._ranks.get(topic)
        if ranks is None or reader is None:  # not followed (yet): not read; or decoded there
            return self._rest(frames, -1, None)
        if type(reader) is FusedApply:
            rank = (<FusedApply>reader).route_read(seq, payload, self._max_block_size)
        else:
            rank = reader.route_read(seq, payload, self._max_block_size)
        if rank < 0:  # the reader declined it: its rank is scanned for there
            return self._rest(frames, -1, None)
        if place is not None and (place.rank is rank or place.rank == rank):
            known = place.route
        else:
            known = (<dict>ranks).get(rank)
            if known is None:  # a new rank of the topic
                return self._rest(frames, rank, reader)
            self._cache(topic, ranks, rank, known)
        self.routed_batch = reader
        return known

    cdef _Known _place_of(self, topic):
        """The cached place of `topic`, if it holds it and is not stale; else None."""
        if not PyBytes_CheckExact(topic):
            return None
        cdef PyObject* held = PyList_GET_ITEM(
            self._known, PyObject_Hash(topic) & (_PLACES - 1)
        )
        if <object>held is None:
            return None
        cdef _Known place = <_Known>held
        if place.version != self._version or not _same_bytes(place.topic, topic):
            return None
        return place

    cdef _cache(self, topic, dict ranks, rank, route):
        """`topic`'s place holds it, with `rank`'s route (the place it had, or a new one)."""
        if not PyBytes_CheckExact(topic):
            return
        cdef Py_ssize_t i = PyObject_Hash(topic) & (_PLACES - 1)
        cdef _Known place = <_Known>self._known[i]
        if place is None:
            place = _Known()
            self._known[i] = place
        place.topic, place.ranks, place.version = topic, ranks, self._version
        place.rank, place.route = rank, route

    cdef object _rest(self, frames, rank, reader):
        """`_route_rest`'s route, its batch left in `routed_batch`."""
        to, self.routed_batch = self._route_rest(frames, rank, reader)
        return to
