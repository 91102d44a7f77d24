# cython: language_level=3, boundscheck=False, wraparound=False
"""One line per event: time, connection, direction, API and version, ids, size, latency, errors.

Every message of a capture passes through here in the default view: lines are built from typed values,
and the texts that repeat (connections, API names, seconds) are kept."""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.math cimport fabs, isfinite, rint
from libc.stdio cimport snprintf
from libc.string cimport memcpy

from kafkasniff.protocol.schema import record_apis
from kafkasniff.protocol.topics import topic_text
from kafkasniff.render.values import FRAME_PREFIX, error_names
from kafkasniff.stream.session import endpoint_text

from kafkasniff.protocol.messages cimport Message
from kafkasniff.stream.session cimport KafkaConnection

cdef frozenset _RECORD_APIS = record_apis()

# Texts kept for reuse; a table that grows past its bound starts again (a long capture has endless
# seconds and connections, and each is needed only while its traffic lasts).
cdef Py_ssize_t KEPT_TEXTS = 4096
cdef dict _seconds = {}
cdef dict _connections = {}
cdef dict _apis = {}
cdef enum:
    TO_CLIENT, TO_SERVER, EITHER
_ARROWS = ("←", "→", "↔")


cdef str _second(long long whole):
    text = _seconds.get(whole)
    if text is None:
        if len(_seconds) >= KEPT_TEXTS:
            _seconds.clear()
        # UTC time of day, as time.gmtime tells it (floor division: times before 1970 too)
        text = f"{(whole // 3600) % 24:02d}:{(whole // 60) % 60:02d}:{whole % 60:02d}"
        _seconds[whole] = text
    return text


cpdef str clock(double ts):
    """UTC time of day with microseconds."""
    cdef long long micros = <long long>rint(ts * 1e6)  # rounding half to even, as round() does
    return f"{_second(micros // 1000000)}.{micros % 1000000:06d}"


cdef str _connection_text(KafkaConnection conn, int arrow):
    """`#stream client → server`; arrow: TO_SERVER, TO_CLIENT or EITHER."""
    cdef list texts = _connections.get(conn)  # kept connections: at most KEPT_TEXTS
    if texts is None:
        if len(_connections) >= KEPT_TEXTS:
            _connections.clear()
        texts = [None, None, None]
        _connections[conn] = texts
    text = texts[arrow]
    if text is None:
        text = f"#{conn.stream} {endpoint_text(conn.client)} {_ARROWS[arrow]} {endpoint_text(conn.server)}"
        texts[arrow] = text
    return text


cdef str _api_text(Message m, bint request):
    """`Name vN kind`, kept by API key, version and kind (an int: no tuple to make and hash per line)."""
    if m.api_key is None or not m.api_name:
        return f"? {m.kind}"
    key = ((<int>m.api_key & 0xFFFF) << 17) | ((<int>m.api_version & 0xFFFF) << 1) | request
    text = _apis.get(key)
    if text is None:
        if len(_apis) >= KEPT_TEXTS:
            _apis.clear()
        text = f"{m.api_name} v{m.api_version} {m.kind}"
        _apis[key] = text
    return text


# Stands for the topics text in a line rendered by a parallel worker (a topic cannot be named so: NUL).
TOPICS_SLOT = "\x00topics\x00"
cdef Py_ssize_t PARTITIONS_SHOWN = 12


cdef class _LineBuilder:
    """A line's UTF-8 bytes, written piece by piece into one growing buffer (reused line after line)."""
    cdef bytearray buffer
    cdef Py_ssize_t size

    def __cinit__(self):
        self.buffer = bytearray(256)
        self.size = 0

    cdef char* _room(self, Py_ssize_t n) except NULL:
        if self.size + n > len(self.buffer):
            self.buffer.extend(bytes(self.size + n))
        return <char*>self.buffer + self.size

    cdef void raw(self, const char* data, Py_ssize_t n) except *:
        memcpy(self._room(n), data, n)
        self.size += n

    cdef void text(self, str piece) except *:
        cdef Py_ssize_t n
        cdef const char* data = PyUnicode_AsUTF8AndSize(piece, &n)  # kept by the str: ASCII text is not copied
        self.raw(data, n)

    cdef void integer(self, long long value, bint grouped=False) except *:
        """Decimal digits; `grouped`: with thousands separators, as format(value, ",")."""
        cdef char digits[32]
        cdef int at = 32, count = 0
        cdef bint negative = value < 0
        cdef unsigned long long rest = <unsigned long long>(-value) if negative else <unsigned long long>value
        while True:
            if grouped and count and count % 3 == 0:
                at -= 1
                digits[at] = c','
            at -= 1
            digits[at] = <char>(c'0' + rest % 10)
            rest //= 10
            count += 1
            if rest == 0:
                break
        if negative:
            at -= 1
            digits[at] = c'-'
        self.raw(digits + at, 32 - at)

    cdef void number(self, value) except *:
        """An int field's value, or what a missing one prints as (None)."""
        if type(value) is int:
            self.integer(value)
        else:
            self.text(str(value))

    cdef void millis(self, double value) except *:
        """As format(value, ".3f") (both round the exact binary value to nearest, ties to even)."""
        cdef char digits[64]
        cdef int n
        if isfinite(value) and fabs(value) < 1e15:
            n = snprintf(digits, sizeof(digits), "%.3f", value)
            self.raw(digits, n)
        else:
            self.text(f"{value:.3f}")

    cdef bytes take(self):
        return PyBytes_FromStringAndSize(<char*>self.buffer, self.size)


cdef _LineBuilder _line = _LineBuilder()
cdef _LineBuilder _topics_line = _LineBuilder()  # apart: topics are written while no line is being written
cdef dict _client_reprs = {}


cdef void _put_clock(_LineBuilder line, double ts) except *:
    cdef long long micros = <long long>rint(ts * 1e6)  # rounding half to even, as round() does
    cdef long long fraction = micros % 1000000  # Cython's % and // floor, as Python's: times before 1970 too
    cdef char digits[7]
    cdef int i
    line.text(_second(micros // 1000000))
    digits[0] = c'.'
    for i in range(6, 0, -1):
        digits[i] = <char>(c'0' + fraction % 10)
        fraction //= 10
    line.raw(digits, 7)


cdef void _put_topics(_LineBuilder line, dict topics) except *:
    """ topic[partitions] for each topic a message names (as Output resolves them), partitions once each in
    first-seen order, at most PARTITIONS_SHOWN of them."""
    cdef Py_ssize_t i, count
    for name, entry in topics.items():
        line.raw(" ", 1)
        line.text(topic_text(name if type(name) is str else str(name)))
        partitions = entry[1]
        if not partitions:
            continue
        distinct = partitions if len(partitions) == 1 else list(dict.fromkeys(partitions))
        count = len(distinct)
        line.raw("[", 1)
        for i in range(min(count, PARTITIONS_SHOWN)):
            if i:
                line.raw(",", 1)
            line.number(distinct[i])
        if count > PARTITIONS_SHOWN:
            line.text(f",…+{count - PARTITIONS_SHOWN}")
        line.raw("]", 1)


cpdef bytes topics_row(dict topics):
    """The topics of a message as its line shows them (UTF-8, with a leading space): where a parallel
    worker's line holds TOPICS_SLOT."""
    _topics_line.size = 0
    _put_topics(_topics_line, topics)
    return _topics_line.take()


cdef void _put_plural(_LineBuilder line, long long n, str one, str many) except *:
    line.integer(n, True)
    line.raw(" ", 1)
    line.text(one if n == 1 else many)


cdef str _client_repr(str client_id):
    text = _client_reprs.get(client_id)
    if text is None:
        if len(_client_reprs) >= KEPT_TEXTS:
            _client_reprs.clear()
        text = repr(client_id)
        _client_reprs[client_id] = text
    return text


cpdef bytes message_row(MessageEvent ev, topics=None):
    """The message's line as UTF-8, with its newline. `topics`: the message's topics as Output resolves them
    (shown for APIs that carry records), or TOPICS_SLOT where a parallel worker leaves them to the parent."""
    cdef Message m = ev.message
    cdef _LineBuilder line = _line
    cdef bint request = m.kind == "request"
    line.size = 0  # a line left unfinished by an exception is dropped
    _put_clock(line, ev.ts)
    line.raw(" ", 1)
    line.text(_connection_text(ev.conn, TO_SERVER if request else TO_CLIENT))
    line.raw(" ", 1)
    line.text(_api_text(m, request))
    line.raw(" corr=", 6)
    line.number(m.correlation_id)
    if request:
        if m.client_id is not None:
            line.raw(" client=", 8)
            line.text(_client_repr(m.client_id))
        else:
            line.raw(" client=null", 12)
        if not ev.expects_response:
            line.text(" (no response expected)")
    line.raw(" ", 1)
    line.integer(m.end - m.offset)
    line.raw("B", 1)
    if ev.latency_ms is not None:
        line.raw(" ", 1)
        line.millis(ev.latency_ms)
        line.raw("ms", 2)
        if not ev.request.expects_response:
            line.text(" (unexpected: its request expected no response)")
    if ev.inferred:
        line.text(" (request not captured: inferred")
        if ev.screened is not None:
            line.text(ev.screened.besides(m.api_key, m.api_version))
        line.raw(")", 1)
    if topics is not None and m.api_key in _RECORD_APIS:
        if type(topics) is str:
            line.text(topics)
        else:
            _put_topics(line, topics)
    if m.batches:
        line.raw(" ", 1)
        _put_plural(line, m.batches, "batch", "batches")
        line.raw(" ", 1)
        _put_plural(line, m.records, "record", "records")
    if m.errors:
        line.text(" errors=" + ",".join(error_names(m)))
    if m.malformed:
        line.text(f" MALFORMED at byte {m.malformed.offset + FRAME_PREFIX}: {m.malformed.reason}")
    elif m.trailing:
        line.text(f" +{m.trailing.length} trailing bytes")
    line.raw("\n", 1)
    return line.take()


cpdef str message_line(MessageEvent ev, topics=None):
    """The message's line as text (see message_row)."""
    row = message_row(ev, topics)
    return row[:len(row) - 1].decode()


cpdef str sasl_line(SaslTokenEvent ev, bint show_secrets):
    cdef int arrow = TO_SERVER if ev.direction == "c2s" else TO_CLIENT
    shown = ""
    if ev.fields:
        shown = " " + " ".join([f"{f.name}={f.value if show_secrets or f.type != 'secret' else '********'}"
                                for f in ev.fields])
    return (f"{clock(ev.ts)} {_connection_text(ev.conn, arrow)} "
            f"SASL {ev.mechanism or ''} token {len(ev.token)}B{shown}")


cpdef str notice_line(NoticeEvent ev):
    where = f" {_connection_text(ev.conn, EITHER)}" if ev.conn is not None else ""
    size = f" ({ev.size} bytes at stream offset {ev.stream_offset}, {ev.direction})" if ev.size else ""
    return f"{clock(ev.ts)}{where} ! {ev.text}{size}"


cpdef str event_line(ev, bint show_secrets=False, topics=None):
    if type(ev) is MessageEvent:
        return message_line(ev, topics)
    if type(ev) is SaslTokenEvent:
        return sasl_line(ev, show_secrets)
    return notice_line(ev)


cpdef bytes event_row(ev, bint show_secrets=False, topics=None):
    """The event's line as UTF-8, with its newline."""
    if type(ev) is MessageEvent:
        return message_row(ev, topics)
    return (event_line(ev, show_secrets, topics) + "\n").encode()
