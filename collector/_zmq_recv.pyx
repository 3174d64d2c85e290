# cython: language_level=3
"""A whole ZMQ message in one call, received straight from the libzmq that pyzmq loaded.

pyzmq costs about 1 us a frame here: to learn whether more frames follow it needs either a
`Frame` object per frame (`copy=False`) or a `getsockopt(RCVMORE)` per frame. A live message is
three frames, and at a million block-events a second a batch has about 7 us in all, so
receiving took a third of it. This calls libzmq's `zmq_msg_recv` and `zmq_msg_more` on the
socket pyzmq opened: a frame costs the copy into a `bytes` and little else. A message the
caller dropped before the next receive (the drain's every message) lends that one its list and
its seq frame, filled again in place: nothing else holds them, so nothing can see them change.

The functions are looked up (dlsym) in the libzmq already loaded into the process, the one
pyzmq's sockets belong to: there is no second libzmq and nothing to link at build time. Where
they cannot be found (not Linux, or a pyzmq built another way), `available()` is False and the
caller keeps pyzmq's own receive.
"""

from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_CheckExact,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_SET_ITEM
from cpython.object cimport PyObject_GenericGetAttr, Py_TYPE
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF, Py_REFCNT
from libc.errno cimport EAGAIN, EINTR
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memcmp, memcpy

from kvscope.collector._slot_attr cimport slot_get

import zmq

cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_NOW
    int RTLD_NOLOAD

ctypedef struct zmq_msg_t:
    void* _opaque[8]  # libzmq's zmq_msg_t: 64 bytes, pointer-aligned

ctypedef int (*msg_init_t)(zmq_msg_t*) noexcept nogil
ctypedef int (*msg_recv_t)(zmq_msg_t*, void*, int) noexcept nogil
ctypedef int (*msg_close_t)(zmq_msg_t*) noexcept nogil
ctypedef void* (*msg_data_t)(zmq_msg_t*) noexcept nogil
ctypedef size_t (*msg_size_t)(const zmq_msg_t*) noexcept nogil
ctypedef int (*msg_more_t)(const zmq_msg_t*) noexcept nogil
ctypedef int (*errno_t)() noexcept nogil

cdef extern from *:
    """
    /* A bytes object nobody else holds, filled again: its cached hash (deprecated, still kept
       and read by bytes' hash) must not outlive its old bytes. */
    static inline void kvscope_bytes_refill(PyObject* b, const char* data, size_t size) {
        memcpy(PyBytes_AS_STRING(b), data, size);
    #if defined(__GNUC__) || defined(__clang__)
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    #endif
        ((PyBytesObject*)b)->ob_shash = -1;
    #if defined(__GNUC__) || defined(__clang__)
    #pragma GCC diagnostic pop
    #endif
    }
    #ifdef Py_GIL_DISABLED
    #define KVSCOPE_REFILLS 0  /* another thread's reference need not show in the count */
    #else
    #define KVSCOPE_REFILLS 1
    #endif
    """
    void bytes_refill "kvscope_bytes_refill"(object b, const char* data, size_t size) noexcept
    bint REFILLS "KVSCOPE_REFILLS"

cdef int ZMQ_DONTWAIT = 1
# A message of more frames than a live one (three) is refused whole: the frames past the fourth
# are received and dropped without a copy, so a message of thousands of frames costs nothing.
MAX_FRAMES_KEPT = 4  # (`receive` keeps them in as many variables)
cdef Py_ssize_t _FRAMES_KEPT = MAX_FRAMES_KEPT  # compared in C, not as Python ints
# A first frame (a topic) of at most this many bytes is kept in `_TOPIC_PLACES` places, by a
# hash of its bytes: the same topic heard again is handed over as the same `bytes`, which
# costs no allocation, and whose hash (the router looks each topic up) is computed once.
cdef enum:
    _TOPIC_BYTES = 256
    _TOPIC_PLACES = 1024  # a power of two

cdef msg_init_t _msg_init = NULL
cdef msg_recv_t _msg_recv = NULL
cdef msg_close_t _msg_close = NULL
cdef msg_data_t _msg_data = NULL
cdef msg_size_t _msg_size = NULL
cdef msg_more_t _msg_more = NULL
cdef errno_t _errno = NULL


def _loaded_libzmq_paths():
    """Paths of the libzmq shared objects mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libzmq" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


cdef bint _bind(void* lib) noexcept:
    global _msg_init, _msg_recv, _msg_close, _msg_data, _msg_size, _msg_more, _errno
    _msg_init = <msg_init_t>dlsym(lib, b"zmq_msg_init")
    _msg_recv = <msg_recv_t>dlsym(lib, b"zmq_msg_recv")
    _msg_close = <msg_close_t>dlsym(lib, b"zmq_msg_close")
    _msg_data = <msg_data_t>dlsym(lib, b"zmq_msg_data")
    _msg_size = <msg_size_t>dlsym(lib, b"zmq_msg_size")
    _msg_more = <msg_more_t>dlsym(lib, b"zmq_msg_more")
    _errno = <errno_t>dlsym(lib, b"zmq_errno")
    return (
        _msg_init != NULL and _msg_recv != NULL and _msg_close != NULL and _msg_data != NULL
        and _msg_size != NULL and _msg_more != NULL and _errno != NULL
    )


cdef bint _find() noexcept:
    cdef void* lib
    paths = _loaded_libzmq_paths()
    if len(paths) != 1:
        # None: not Linux, or pyzmq is linked statically. Two: which one made pyzmq's sockets
        # cannot be told, and the other's functions on them would be undefined behaviour.
        return False
    encoded = paths[0].encode()
    lib = dlopen(encoded, RTLD_NOW | RTLD_NOLOAD)  # the one already loaded, never another
    return lib != NULL and _bind(lib)


# Importing zmq loaded pyzmq's backend, and with it libzmq.
cdef bint _AVAILABLE = _find()


def available():
    """Whether libzmq's functions were found (else use pyzmq's receive)."""
    return _AVAILABLE


cdef inline Py_ssize_t _topic_place(const char* data, size_t size) noexcept nogil:
    """Where a topic of these bytes is kept: FNV-1a's steps over 8 bytes at a time."""
    cdef uint64_t h = 14695981039346656037ULL ^ size, word
    cdef size_t i = 0
    while i + 8 <= size:
        memcpy(&word, data + i, 8)
        h = (h ^ word) * 1099511628211ULL
        i += 8
    if i < size:
        word = 0
        memcpy(&word, data + i, size - i)
        h = (h ^ word) * 1099511628211ULL
    return <Py_ssize_t>((h ^ (h >> 29)) & (_TOPIC_PLACES - 1))


cdef inline bint _refillable(PyObject* frame, size_t size) noexcept:
    """Whether a frame of the spare list is a `bytes` of `size` bytes that only it holds."""
    return (
        Py_REFCNT(<object>frame) == 1
        and PyBytes_CheckExact(<object>frame)
        and <size_t>PyBytes_GET_SIZE(<object>frame) == size
    )


cdef inline void _put(list frames, Py_ssize_t i, object frame) noexcept:
    """`frames[i] = frame`, its old item let go after."""
    cdef PyObject* old = PyList_GET_ITEM(frames, i)
    if old == <PyObject*>frame:
        return
    Py_INCREF(frame)
    PyList_SET_ITEM(frames, i, frame)
    Py_DECREF(<object>old)


cdef class MessageReceiver:
    """Receives whole messages from one pyzmq socket, without waiting."""

    # (its fields: collector/_zmq_recv.pxd)

    def __init__(self, socket):
        if not _AVAILABLE:
            raise RuntimeError("libzmq's functions were not found: use pyzmq's recv")
        self._socket = socket  # keeps it alive: the handle is its libzmq socket
        self._handle = <void*><uintptr_t>socket.underlying
        self._generic = type(socket).__getattribute__ is object.__getattribute__
        self._closed_descriptor = None
        if self._generic:
            # `_closed` as a data descriptor of its class (pyzmq's, a C field): called directly.
            for klass in type(socket).__mro__:
                if "_closed" in klass.__dict__:
                    found = klass.__dict__["_closed"]
                    if (
                        Py_TYPE(found).tp_descr_get != NULL
                        and Py_TYPE(found).tp_descr_set != NULL
                    ):
                        self._closed_descriptor = found
                    break
        self._topics = [None] * _TOPIC_PLACES

    def __call__(self):
        """The next message's frames as bytes, or None when no message is waiting."""
        return self.receive()

    cdef object receive(self):
        """`__call__`, for a caller in C (the fleet's drain): no call through Python."""
        # pyzmq's own recv checks this flag (`_check_closed`); its `closed` property also asks
        # libzmq (a getsockopt through its attribute hook): most of this call's cost. Even
        # `_closed` read the usual way goes through that hook (`Socket.__getattr__`, its
        # sockopts by name), which looks up both `__getattribute__` and `__getattr__` first.
        if self._closed_descriptor is not None:
            closed = slot_get(self._closed_descriptor, self._socket)
        elif self._generic:
            closed = PyObject_GenericGetAttr(self._socket, "_closed")
        else:
            closed = self._socket._closed
        if closed:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        cdef zmq_msg_t msg
        cdef object frame, f0 = None, f1 = None, f2 = None, f3 = None  # those kept
        cdef Py_ssize_t n = 0
        cdef int rc, err
        cdef bint more = True
        cdef const char* data
        cdef size_t size
        cdef PyObject* seq
        # The last message's list, if nobody else holds it (nor changed its length): this
        # one's, if it has three frames too, and its seq frame refilled if its size is this one's.
        cdef list spare = self._last
        self._last = None
        if not REFILLS or spare is None or Py_REFCNT(spare) != 1 or PyList_GET_SIZE(spare) != 3:
            spare = None  # (1: `spare` is its only holder now)
        # One zmq_msg_t for every frame: libzmq's receive drops what it held before.
        _msg_init(&msg)
        try:
            while more:
                # Never blocks: a message's frames arrive together, so only the first can be
                # missing. No GIL release is needed for a call that returns at once.
                rc = _msg_recv(&msg, self._handle, ZMQ_DONTWAIT)
                if rc < 0:
                    err = _errno()
                    if n == 0 and (err == EAGAIN or err == EINTR):
                        return None
                    raise zmq.ZMQError(err)
                if n < _FRAMES_KEPT:
                    data = <const char*>_msg_data(&msg)
                    size = _msg_size(&msg)
                    if n == 0:
                        f0 = self._topic(data, size)
                    elif n == 1 and spare is not None and _refillable(
                        PyList_GET_ITEM(spare, 1), size
                    ):
                        seq = PyList_GET_ITEM(spare, 1)
                        bytes_refill(<object>seq, data, size)
                        f1 = <object>seq
                    else:
                        frame = PyBytes_FromStringAndSize(data, size)
                        if n == 1:
                            f1 = frame
                        elif n == 2:
                            f2 = frame
                        else:
                            f3 = frame
                    n += 1
                more = _msg_more(&msg)
        finally:
            _msg_close(&msg)
        if n == 3:
            if spare is None:
                spare = [f0, f1, f2]
            else:
                _put(spare, 0, f0)
                _put(spare, 1, f1)
                _put(spare, 2, f2)
            self._last = spare
            return spare
        if n == 1:
            return [f0]
        if n == 2:
            return [f0, f1]
        return [f0, f1, f2, f3]

    cdef object _topic(self, const char* data, size_t size):
        """The first frame: the `bytes` kept for a topic of these bytes, else a new one (kept,
        if it is short enough)."""
        if size > _TOPIC_BYTES:
            return PyBytes_FromStringAndSize(data, size)
        cdef Py_ssize_t place = _topic_place(data, size)
        cdef object held = self._topics[place]
        if (
            held is not None
            and <size_t>PyBytes_GET_SIZE(held) == size
            and memcmp(PyBytes_AS_STRING(held), data, size) == 0
        ):
            return held
        held = PyBytes_FromStringAndSize(data, size)
        self._topics[place] = held
        return held
