# cython: language_level=3
"""Rows of the `messages` and `records` tables from decoded MessageEvents, as tuples in the
tables' raw column order (see `tables`).

Message columns are read straight from the decoded message, as `message_event_json` (the
function behind `decode --json`) reads them: compiled, with the message's fields read as C
attributes, a row costs a tuple, where going through the JSON object cost a dict of every key
(the Spark tests compare the tables with `decode --json`, message for message). Record columns
come from the compiled walker, one tuple per record read straight from the message's bytes.
Times are microseconds since the epoch.
"""

from libc.math cimport rint

from kafkasniff.pipeline.tables import MESSAGES, RECORDS
from kafkasniff.protocol import messages
from kafkasniff.protocol.walker import RECORD_ROW
from kafkasniff.render.values import FRAME_PREFIX, error_names

from kafkasniff.protocol.messages cimport Message
from kafkasniff.stream.session cimport MessageEvent

# A record row is the carrying message's columns, then the walker's RECORD_ROW as it comes.
_RECORD_MESSAGE_COLUMNS = ("ts", "connection_id", "direction", "api_name", "api_version", "correlation_id",
                           "client_id")
assert RECORDS.raw_names == _RECORD_MESSAGE_COLUMNS + RECORD_ROW, "records table and walker rows disagree"
cdef long long _FRAME_PREFIX = FRAME_PREFIX


cpdef long long micros(double ts):
    # rint rounds half to even, as Python's round() does
    return <long long>rint(ts * 1e6)


cpdef tuple message_row(MessageEvent ev, str connection_id, list files, str src, str dst, str client_id,
                        list topics, record_count):
    """`src` and `dst` as endpoint_text gives them; `client_id`: the request's, for a response too; `topics` as
    `decode` resolves them for the event (see render.output.Output.event_topics)."""
    cdef Message m = ev.message
    cdef bint response = m.kind == "response"
    malformed, tls = m.malformed, ev.conn.tls
    return (micros(ev.ts), connection_id, files, src, dst, m.kind, m.api_key, m.api_name, m.api_version,
            m.header_version, m.correlation_id, client_id, m.end - m.offset, ev.latency_ms,
            m.throttle_time_ms if response else None, error_names(m), topics, record_count,
            ev.inferred if response else None, None if response else ev.expects_response,
            malformed.reason if malformed else None, malformed.offset + _FRAME_PREFIX if malformed else None,
            m.trailing.length if m.trailing else 0, tls.get("version") if tls else None,
            tls.get("cipher") if tls else None)


_MESSAGE_COLUMNS = ("ts", "connection_id", "capture_files", "src", "dst", "kind", "api_key", "api_name",
                    "api_version", "header_version", "correlation_id", "client_id", "size", "latency_ms",
                    "throttle_time_ms", "errors", "topics", "record_count", "inferred", "expects_response",
                    "malformed", "malformed_offset", "trailing_bytes", "tls_version", "tls_cipher")
assert MESSAGES.raw_names == _MESSAGE_COLUMNS, "messages table and message_row disagree"


cpdef list record_rows(MessageEvent ev, str connection_id, str client_id):
    """One row per record of the message, read from its bytes; None when it carries no record batches."""
    cdef Message m = ev.message
    if not m.batches:
        return None
    cdef tuple common = (micros(ev.ts), connection_id, "produce" if m.kind == "request" else "fetch", m.api_name,
                         m.api_version, m.correlation_id, client_id)
    return [common + found for found in messages.record_rows(m, ev.payload)]
