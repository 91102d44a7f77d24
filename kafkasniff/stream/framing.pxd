"""The framer's C-level interface, for the session to call it without Python calls."""


cdef inline long long int32_at(const unsigned char* p):
    """The signed big-endian 32-bit integer at p (a frame's size, a response's correlation id)."""
    return <int>((<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3])


cdef inline int int16_at(const unsigned char* p):
    """The signed big-endian 16-bit integer at p (an API key, a version, a string's length)."""
    return <short>((p[0] << 8) | p[1])


cdef class Plausibility:
    cdef readonly int header_bytes, correlation_at

    cpdef object header(self, buf, Py_ssize_t pos, Py_ssize_t end)
    cpdef bint frame(self, buf, Py_ssize_t pos, Py_ssize_t end) except -1
    cpdef new_search(self)


cdef class Framer:
    cdef Plausibility plausibility
    cdef bint requests  # the direction of requests (else responses): what a frame's first bytes must be
    cdef long long max_frame
    cdef bint synced
    # Raw SASL tokens may be empty (a broker answers a PLAIN token with a bare zero size):
    # the session lowers this to 0 while they flow.
    cdef public long long min_frame
    cdef bytearray buf
    cdef long long buf_offset  # stream offset of buf[0]
    cdef double first_ts  # time of the bytes that started the buffer
    cdef double last_ts
    # Where the current unsynced run began (-1: none), and why we are out of sync.
    cdef long long skip_start
    cdef str skip_reason
    cdef list out
    # Out of sync only: the stream offset up to which candidates have been looked at; candidates
    # that wait for more bytes, as (stream offset where they can be decided, stream offset); and
    # (stream offset after the bytes, time) of each piece fed, to date the frames found in them.
    cdef long long scan_from
    cdef list waiting  # sorted
    cdef long long waiting_from  # the stream offset of the first waiting candidate, when there is one
    cdef list arrivals
    # In sync, a big frame is copied straight into its payload as its bytes come (see FILL_FROM): the payload,
    # how much of it has come, the stream offset of its size prefix and the time of its first byte.
    cdef bytes filling
    cdef Py_ssize_t filled
    cdef long long filling_offset
    cdef double filling_first_ts
    # In sync after a gap that ended inside a frame whose size prefix had come: where that frame ends, the next one
    # starts (-1: no such frame); the bytes until then are dropped, those from lost_from on not yet reported.
    cdef long long lost_until, lost_from

    cpdef list feed(self, bytes data, double ts)
    cpdef list gap(self, long long size, double ts, str reason=*)
    cpdef list close(self)
    cdef bytes _cut_whole(self, bytes data, double ts)
    cdef bytes _fill(self, bytes data, double ts)
    cdef bytes _drop_lost(self, bytes data, double ts)
    cdef void _report_lost(self, double ts)
    cdef void _start_filling(self)
    cdef void _stop_filling(self)
    cdef list _take(self)
    cdef void _unsync(self, str reason)
    cdef void _lose(self, Py_ssize_t n, str reason)
    cdef void _cut(self, double ts, bint final)
    cdef double _arrival_ts(self, long long stream_end)
    cdef bint _resync(self, bint final) except -1
    cdef object _scan(self, bint final)
    cdef void _wait(self, long long decided_at, long long at)
    cdef tuple _judge(self, Py_ssize_t at, bint final)
