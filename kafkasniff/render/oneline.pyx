# cython: language_level=3, boundscheck=False, wraparound=False
"""One line per event: time, connection, direction, API and version, ids, size, latency, errors.

Every message of a capture passes through here in the default view: lines are built from typed values,
and the texts that repeat (connections, API names, seconds) are kept."""

from libc.math cimport rint

from kafkasniff.protocol.schema import carries_records
from kafkasniff.render.values import FRAME_PREFIX, error_names
from kafkasniff.stream.session import endpoint_text

from kafkasniff.stream.session cimport KafkaConnection

# Texts kept for reuse; a table that grows past its bound starts again (a long capture has endless
# seconds and connections, and each is needed only while its traffic lasts).
cdef Py_ssize_t KEPT_TEXTS = 4096
cdef dict _seconds = {}
cdef dict _connections = {}
cdef dict _apis = {}


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


cdef str _connection_text(KafkaConnection conn, str arrow):
    key = (conn, arrow)
    text = _connections.get(key)
    if text is None:
        if len(_connections) >= KEPT_TEXTS:
            _connections.clear()
        text = f"#{conn.stream} {endpoint_text(conn.client)} {arrow} {endpoint_text(conn.server)}"
        _connections[key] = text
    return text


cdef str _api_text(str api_name, api_version, str kind):
    key = (api_name, api_version, kind)
    text = _apis.get(key)
    if text is None:
        if len(_apis) >= KEPT_TEXTS:
            _apis.clear()
        text = f"{api_name} v{api_version} {kind}" if api_name else f"? {kind}"
        _apis[key] = text
    return text


# Stands for the topics text in a line rendered by a parallel worker (a topic cannot be named so: NUL).
TOPICS_SLOT = "\x00topics\x00"
PARTITIONS_SHOWN = 12


cdef str _plural(long long n, str one, str many):
    return f"{n:,} {one if n == 1 else many}"


cpdef str topics_text(dict topics):
    """ topic[partitions] for each topic a message names (as Output resolves them), with a leading space."""
    parts = []
    for name, entry in topics.items():
        shown = list(dict.fromkeys(entry[1]))
        more = f",…+{len(shown) - PARTITIONS_SHOWN}" if len(shown) > PARTITIONS_SHOWN else ""
        parts.append(f" {name}[{','.join(map(str, shown[:PARTITIONS_SHOWN]))}{more}]" if shown else f" {name}")
    return "".join(parts)


cpdef str message_line(MessageEvent ev, topics=None):
    """`topics`: the message's topics as Output resolves them (shown for APIs that carry records), or
    TOPICS_SLOT where a parallel worker leaves them to the parent."""
    m = ev.message
    cdef bint request = m.kind == "request"
    cdef str line = (f"{clock(ev.ts)} {_connection_text(ev.conn, '→' if request else '←')} "
                     f"{_api_text(m.api_name, m.api_version, m.kind)} corr={m.correlation_id}")
    if request:
        line += f" client={m.client_id!r}" if m.client_id is not None else " client=null"
        if not ev.expects_response:
            line += " (no response expected)"
    line += f" {m.end - m.offset}B"
    if ev.latency_ms is not None:
        line += f" {ev.latency_ms:.3f}ms"
        if not ev.request.expects_response:
            line += " (unexpected: its request expected no response)"
    if ev.inferred:
        line += " (request not captured: inferred)"
    if topics is not None and carries_records(m.api_key):
        line += topics if type(topics) is str else topics_text(topics)
    if m.batches:
        line += f" {_plural(m.batches, 'batch', 'batches')} {_plural(m.records, 'record', 'records')}"
    if m.errors:
        line += " errors=" + ",".join(error_names(m))
    if m.malformed:
        line += f" MALFORMED at byte {m.malformed.offset + FRAME_PREFIX}: {m.malformed.reason}"
    elif m.trailing:
        line += f" +{m.trailing.length} trailing bytes"
    return line


cpdef str sasl_line(SaslTokenEvent ev, bint show_secrets):
    arrow = "→" if ev.direction == "c2s" else "←"
    shown = ""
    if ev.fields:
        shown = " " + " ".join([f"{f.name}={f.value if show_secrets or f.type != 'secret' else '********'}"
                                for f in ev.fields])
    return (f"{clock(ev.ts)} {_connection_text(ev.conn, arrow)} "
            f"SASL {ev.mechanism or ''} token {len(ev.token)}B{shown}")


cpdef str notice_line(NoticeEvent ev):
    where = f" {_connection_text(ev.conn, '↔')}" if ev.conn is not None else ""
    size = f" ({ev.size} bytes at stream offset {ev.stream_offset}, {ev.direction})" if ev.size else ""
    return f"{clock(ev.ts)}{where} ! {ev.text}{size}"


cpdef str event_line(ev, bint show_secrets=False, topics=None):
    if type(ev) is MessageEvent:
        return message_line(ev, topics)
    if type(ev) is SaslTokenEvent:
        return sasl_line(ev, show_secrets)
    return notice_line(ev)
