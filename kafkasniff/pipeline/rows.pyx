# cython: language_level=3
"""Rows of the `messages` and `records` tables from decoded MessageEvents, in the tables' raw column order (see
`tables`): a message's as a tuple, records as columns.

Message columns are read straight from the decoded message, as `message_event_json` (the
function behind `decode --json`) reads them: compiled, with the message's fields read as C
attributes, a row costs a tuple, where going through the JSON object cost a dict of every key
(the Spark tests compare the tables with `decode --json`, message for message). Records come from the compiled
walker as columns read straight from the message's bytes (walker.record_columns), and become Arrow arrays as they
are: a Fetch response can carry hundreds of thousands of records, and a tuple each, converted by pyarrow, cost
three times the decoding. Times are microseconds since the epoch.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.math cimport fma, rint
from libc.stdint cimport int32_t

from array import array

import pyarrow as pa
import pyarrow.compute as pc

from kafkasniff.pipeline.tables import MESSAGES, RECORDS
from kafkasniff.protocol import messages
from kafkasniff.protocol.walker import NULL_INT32, NULL_INT64, RECORD_COLUMNS, RECORD_GROUP
from kafkasniff.render.values import FRAME_PREFIX, error_names

from kafkasniff.protocol.messages cimport Message
from kafkasniff.stream.session cimport MessageEvent

# A record's row: the carrying message's columns, what its batch shares (the walker's RECORD_GROUP) and its own
# values (RECORD_COLUMNS, but the group), in the table's order.
_RECORD_MESSAGE_COLUMNS = ("ts", "connection_id", "direction", "api_name", "api_version", "correlation_id",
                           "client_id")
_SHARED_COLUMNS = _RECORD_MESSAGE_COLUMNS + RECORD_GROUP
_OWN_COLUMNS = tuple(name for name, _ in RECORD_COLUMNS[:-1])
assert RECORD_COLUMNS[-1][0] == "group" and sorted(RECORDS.raw_names) == sorted(_SHARED_COLUMNS + _OWN_COLUMNS), \
    "records table and walker columns disagree"
# the columns that can be null: the type of their values, and the value that stands for null
_NULL = {"offset": (pa.int64(), NULL_INT64), "timestamp": (pa.int64(), NULL_INT64),
         "key_size": (pa.int32(), NULL_INT32), "value_size": (pa.int32(), NULL_INT32)}
cdef long long _FRAME_PREFIX = FRAME_PREFIX


cpdef long long micros(double ts):
    """ts (seconds) in whole microseconds as `decode --json` prints it (round(ts, 6)): the exact product rounded half to
    even. ts * 1e6 is rounded once more on the way (to a quarter of a microsecond at today's times), which a
    nanosecond capture's time can put on a half: 1795421627.144835484 s gave ...836 where decode says ...835."""
    cdef double product = ts * 1e6
    cdef double nearest = rint(product)  # (half to even, as Python's round)
    cdef double off = product - nearest, error
    if off == 0.5 or off == -0.5:  # a half in the product: the exact one is on one side of it, or on it
        error = fma(ts, 1e6, -product)  # the exact product minus the rounded one
        if off > 0 and error > 0:
            nearest += 1
        elif off < 0 and error < 0:
            nearest -= 1
    return <long long>nearest


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


# Records a message hands on at a time (the walker's chunks): a few KB of compressed records can be millions.
RECORDS_PER_CHUNK = 65536
_WIDTHS = tuple(array(code).itemsize for _, code in RECORD_COLUMNS)  # bytes per record of each column


cdef class RecordColumns:
    """The records table's rows not written yet, as columns: each record's values (RECORD_COLUMNS' bytes, chunk by
    chunk) and, per batch, what its records share with the carrying message's columns. Once `rows_per_group` are
    held, `full()` is called (it writes them), between chunks of a message too."""

    # shared: _SHARED_COLUMNS tuples; chunks: per RECORD_COLUMNS, the bytes of each chunk (rows.pxd)

    def __init__(self, Py_ssize_t rows_per_group, full):
        self.rows_per_group, self.full = rows_per_group, full
        self.clear()

    def __len__(self) -> int:
        return self.count

    cpdef clear(self):
        self.shared, self.chunks, self.count = [], [[] for _ in RECORD_COLUMNS], 0

    cpdef object add(self, MessageEvent ev, str connection_id, str client_id):
        """The message's records; how many it carries, None when it carries no record batches."""
        cdef Message m = ev.message
        self.common = (micros(ev.ts), connection_id, "produce" if m.kind == "request" else "fetch", m.api_name,
                       m.api_version, m.correlation_id, client_id)
        return messages.record_columns(m, ev.payload, self._take, RECORDS_PER_CHUNK)

    def _take(self, Py_ssize_t count, list groups, *columns) -> None:
        """A chunk of the current message's records (walker.record_columns)."""
        common = self.common
        cdef Py_ssize_t column
        if len(columns) != len(RECORD_COLUMNS) or any(len(values) != count * width
                                                      for values, width in zip(columns, _WIDTHS)):
            raise ValueError(f"record_columns: columns of other lengths than {count} records")
        rebased = _rebased(columns[-1], count, len(self.shared))
        self.shared += [common + group for group in groups]
        for column in range(len(RECORD_COLUMNS) - 1):
            (<list>self.chunks[column]).append(columns[column])
        (<list>self.chunks[-1]).append(rebased)
        self.count += count
        if self.count >= self.rows_per_group:
            self.full()

    def batch(self, schema) -> pa.RecordBatch:
        """The rows as a record batch of `schema` (the table's raw schema), but that the columns of text a batch's
        records share are dictionary-encoded: each group's text once, and an index per record (no copy)."""
        groups = _array(pa.int32(), self.count, b"".join(self.chunks[-1]))
        columns = {}
        for name, values in zip(_SHARED_COLUMNS, zip(*self.shared)):
            field_type = schema.field(name).type
            if pa.types.is_string(field_type):
                dictionary = pa.array(values, field_type)
                if dictionary.null_count:  # Parquet takes nulls in the indices, not in the dictionary
                    columns[name] = pa.DictionaryArray.from_arrays(
                        pc.if_else(dictionary.is_valid().take(groups), groups, None), dictionary.fill_null(""))
                else:
                    columns[name] = pa.DictionaryArray.from_arrays(groups, dictionary)
            else:
                columns[name] = pa.array(values, field_type).take(groups)
        for name, chunks in zip(_OWN_COLUMNS, self.chunks):
            field_type = schema.field(name).type
            data = b"".join(chunks)
            if name in _NULL:
                columns[name] = _array(field_type, self.count, data, *_NULL[name])
            elif pa.types.is_boolean(field_type):  # one byte each
                columns[name] = _array(pa.uint8(), self.count, data).cast(field_type)
            else:
                columns[name] = _array(field_type, self.count, data)
        return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], names=schema.names)


cdef bytes _rebased(bytes groups, Py_ssize_t count, Py_ssize_t first):
    """A chunk's group column, its indexes counted from `first` (the groups held before it)."""
    cdef bytes rebased = PyBytes_FromStringAndSize(NULL, count * sizeof(int32_t))
    cdef const int32_t *src = <const int32_t *>PyBytes_AS_STRING(groups)
    cdef int32_t *dst = <int32_t *>PyBytes_AS_STRING(rebased)
    cdef Py_ssize_t i
    for i in range(count):
        dst[i] = src[i] + <int32_t>first
    return rebased


def _array(arrow_type, Py_ssize_t count, bytes data, value_type=None, null=None):
    """An Arrow array of `count` values of a fixed-width type from their native bytes (no copy); with `value_type`,
    the values equal to `null` (of that type) are null."""
    values = pa.py_buffer(data)
    if value_type is None:
        return pa.Array.from_buffers(arrow_type, count, [None, values])
    valid = pc.not_equal(pa.Array.from_buffers(value_type, count, [None, values]), pa.scalar(null, value_type))
    return pa.Array.from_buffers(arrow_type, count, [valid.buffers()[1], values])
