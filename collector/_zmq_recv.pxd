"""`MessageReceiver` (collector/_zmq_recv.pyx), declared for the fleet's drain
(collector/_fleet_drain.pyx), which receives each message through it in C."""


cdef class MessageReceiver:
    cdef object _socket
    cdef void* _handle
    cdef bint _generic  # its attributes are read as object's: its `__getattr__` passed over

    cdef object receive(self)
