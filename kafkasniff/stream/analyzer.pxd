"""The analyzer's C-level interface: the parallel engine hands each connection's bytes to it without Python calls."""


cdef class Analyzer:
    cdef public frozenset port_hints
    cdef public long long max_frame
    cdef public object tcp, keylog
    # Each connection's handler: a Session, a TlsSession, or _FirstBytes until its first bytes come.
    cdef public dict sessions
    cdef public dict tls_sessions  # those waiting may be given keys by a followed key log
    cdef public dict ended_sessions  # the last ENDED_KEPT, oldest first
    cdef public long long gaps, gap_bytes

    cpdef list stream_data(self, stream, int direction, bytes data, double ts)
