"""`MessageReceiver` (collector/_zmq_recv.pyx), declared for the fleet's drain
(collector/_fleet_drain.pyx), which receives each message through it in C."""


cdef class MessageReceiver:
    cdef object _socket
    cdef void* _handle
    cdef bint _generic  # its attributes are read as object's: its `__getattr__` passed over
    # `_closed`'s data descriptor in its class, called directly (None: read as an attribute).
    cdef object _closed_descriptor
    # The topics heard (`_TOPIC_PLACES` places, each a `bytes` or None).
    cdef list _topics
    # The list of the last message of three frames handed out (None: not one to fill again).
    cdef list _last

    cdef object receive(self)
    cdef object _topic(self, const char* data, size_t size)
