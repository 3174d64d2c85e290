# cython: language_level=3
"""The loop of collector/fleet_drain.py's `FleetDrain.drain` in C: each message read from the
fleet's SUB, routed (`FleetRouter.route_batch`), and handed to its stream's ingest
(`StreamIngest.live_frames`, collector/_ingest_live.pyx, called in C). Every message of a fleet
comes through here, where the loop's bytecodes cost about as much as a Python frame a message.
A publisher heard for the first time, or heard again after it was gone, is the drain's
(`_register`, `_heard_again`).

A route's stream and its ingest are kept on the route (its `RouteStream`) from one message to
the next, drains included, while the collector's `StreamTable` keeps the version they were
found at: every change of the streams (one replaced, removed, re-added) makes them stale.
"""

cimport cython

from kvscope.collector._fleet_route cimport RouteStream, RouteTable
from kvscope.collector._ingest_live cimport LiveIngest
from kvscope.collector._slot_attr cimport slot_get
from kvscope.collector._zmq_recv cimport MessageReceiver

from kvscope.collector.fleet_router import Route
from kvscope.collector.stream_table import StreamTable

# A `Route`'s slots, read for every message through their descriptors (_slot_attr.pxd).
cdef object _ROUTE = Route
cdef object _ROUTE_STREAM = Route.__dict__["stream"]
cdef object _ROUTE_NEW = Route.__dict__["new"]
cdef object _ROUTE_HELD = Route.__dict__["held"]
cdef object _TABLE_VERSION = StreamTable.__dict__["version"]


@cython.final
@cython.auto_pickle(False)
cdef class DrainLoop:
    """One drain of a fleet's socket: `run` up to a number of messages, or one per call."""

    cdef object read, route, now, table, gone, drain
    cdef dict streams  # the table's `by_id`
    # The router whose `route_batch` `route` is (its own, not a subclass's): called in C.
    cdef RouteTable router
    # `read`, where it is libzmq's own receive (collector/_zmq_recv.pyx): called in C.
    cdef MessageReceiver receiver

    def __init__(self, read, route, now, streams, gone, drain):
        """`read`: the socket's `MessageReader`; `route`: the router's `route_batch`; `now`: the
        clock; `streams`: the collector's `StreamTable` (each stream with its `ingest`, and
        `send_replay`); `gone`: the fleet's publishers gone; `drain`: the `FleetDrain`."""
        self.read, self.route, self.now = read, route, now
        self.table, self.gone, self.drain = streams, gone, drain
        self.streams = streams.by_id
        owner = getattr(route, "__self__", None)
        if (
            isinstance(owner, RouteTable)
            and getattr(route, "__name__", None) == "route_batch"
            and type(owner).route_batch is RouteTable.route_batch
        ):
            self.router = <RouteTable>owner
        if type(read) is MessageReceiver:
            self.receiver = <MessageReceiver>read

    cdef int step(self) except -1:
        """One message: 0 if the socket had none, else 1."""
        cdef object frames, to, batch, key, new, stream, ingest, request, version
        cdef RouteStream held = None
        if self.receiver is not None:
            frames = self.receiver.receive()
        else:
            frames = self.read()
        if frames is None:
            return 0
        if self.router is not None:  # (no call through Python, no tuple)
            to = self.router.route(frames)
            batch, self.router.routed_batch = self.router.routed_batch, None
        else:
            to, batch = self.route(frames)
        if to is None:
            return 1
        if type(to) is _ROUTE:  # (no lookup of the names in the class)
            key = slot_get(_ROUTE_STREAM, to)
            new = slot_get(_ROUTE_NEW, to)
            held = <RouteStream>slot_get(_ROUTE_HELD, to)
        else:
            key, new = to.stream, to.new
        if new:
            stream = self.drain._register(to, self.now())
            if stream is None:
                return 1
            ingest = stream.ingest
        else:
            # (the same int object while the table is unchanged: `StreamTable.version`)
            version = slot_get(_TABLE_VERSION, self.table)
            if held is not None and held.version is version:
                stream, ingest = held.stream, held.ingest
            else:
                stream = self.streams[key]
                ingest = stream.ingest
                if held is not None:
                    held.version, held.stream, held.ingest = version, stream, ingest
        if self.gone and key in self.gone:
            self.drain._heard_again(key, stream)
        if isinstance(ingest, LiveIngest):
            request = (<LiveIngest>ingest).live(frames, self.now(), batch)
        else:
            request = ingest.live_frames(frames, self.now(), batch)
        if request is not None:
            stream.send_replay(request)
        return 1

    def __call__(self, ignored=None):
        """One message: False if the socket had none."""
        return self.step() == 1

    def run(self, Py_ssize_t limit):
        """Up to `limit` messages: True once the socket had none left."""
        cdef Py_ssize_t i
        for i in range(limit):
            if self.step() == 0:
                return True
        return False
