# cython: language_level=3
"""Rows of the `messages` and `records` tables from decoded MessageEvents, as columns in the tables' raw column
order (see `tables`).

Message columns are read straight from the decoded message, as `message_event_json` (the function behind `decode
--json`) reads them: compiled, with the message's fields read as C attributes, into C arrays and dictionaries of
text (MessageColumns; going through the JSON object cost a dict of every key, and a tuple a row, converted by
pyarrow, a tenth of a decode task). Records come from the compiled walker as columns read straight from the
message's bytes (walker.record_columns), and become Arrow arrays as they are: a Fetch response can carry hundreds
of thousands of records, and a tuple each, converted by pyarrow, cost three times the decoding. Times are
microseconds since the epoch.
"""

cimport cpython.array as carray
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.math cimport fma, rint
from libc.stdint cimport int32_t

from array import array

import pyarrow as pa
import pyarrow.compute as pc

from kafkasniff.pipeline.tables import MESSAGES, RECORDS, raw_schema
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


cdef class MessageColumns:
    """The messages table's rows not written yet, as columns: numbers in C arrays, each with whether it is set, and
    text as indexes into the distinct values (an Arrow dictionary). A row is read straight from the decoded message,
    as `message_event_json` (the function behind `decode --json`) reads it (the Spark tests compare the table with
    `decode --json`, message for message). A tuple a row, converted by pyarrow, cost a decode task of bench60 a
    tenth of its time (0.12 of 1.2 s): most values repeat (the connection's endpoints, ids and files, the API's
    name), and the lists (files, errors, topics) cost pyarrow a list each."""

    def __init__(self):
        self.clear()

    def __len__(self) -> int:
        return self.count

    cpdef clear(self):
        self.count = 0
        self.ts = array("q")
        self.numbers = [_Numbers(code) for code in _NUMBER_CODES]
        self.texts = [_Texts() for _ in _TEXT_COLUMNS]
        self.lists = [_Texts() for _ in _LIST_COLUMNS]
        self.list_ends = [array("i", [0]) for _ in _LIST_COLUMNS]

    cpdef add(self, MessageEvent ev, str connection_id, list files, str src, str dst, str client_id, dict topics,
              record_count):
        """`src` and `dst` as endpoint_text gives them; `client_id`: the request's, for a response too; `topics` as
        `decode` resolves them for the event (render.output.Output.event_topics)."""
        cdef Message m = ev.message
        cdef bint response = m.kind == "response"
        cdef list numbers = self.numbers, texts = self.texts
        malformed, tls = m.malformed, ev.conn.tls
        _append_int64(self.ts, micros(ev.ts))
        # (in _TEXT_COLUMNS', _NUMBER_COLUMNS' and _LIST_COLUMNS' orders)
        (<_Texts>texts[0]).add(connection_id)
        (<_Texts>texts[1]).add(src)
        (<_Texts>texts[2]).add(dst)
        (<_Texts>texts[3]).add(m.kind)
        (<_Texts>texts[4]).add(m.api_name)
        (<_Texts>texts[5]).add(client_id)
        (<_Texts>texts[6]).add(malformed.reason if malformed else None)
        (<_Texts>texts[7]).add(tls.get("version") if tls else None)
        (<_Texts>texts[8]).add(tls.get("cipher") if tls else None)
        (<_Numbers>numbers[0]).add(m.api_key)
        (<_Numbers>numbers[1]).add(m.api_version)
        (<_Numbers>numbers[2]).add(m.header_version)
        (<_Numbers>numbers[3]).add(m.correlation_id)
        (<_Numbers>numbers[4]).add(m.end - m.offset)
        (<_Numbers>numbers[5]).add(ev.latency_ms)
        (<_Numbers>numbers[6]).add(m.throttle_time_ms if response else None)
        (<_Numbers>numbers[7]).add(record_count)
        (<_Numbers>numbers[8]).add(ev.inferred if response else None)
        (<_Numbers>numbers[9]).add(None if response else ev.expects_response)
        (<_Numbers>numbers[10]).add(malformed.offset + _FRAME_PREFIX if malformed else None)
        (<_Numbers>numbers[11]).add(m.trailing.length if m.trailing else 0)
        self._add_list(0, files)
        self._add_list(1, error_names(m) if m.errors else _NO_TEXT)
        self._add_list(2, topics)
        self.count += 1

    cdef void _add_list(self, Py_ssize_t column, values) except *:
        cdef _Texts flat = self.lists[column]
        for value in values:
            flat.add(value)
        _append_int32(self.list_ends[column], len(flat.at))

    def batch(self, schema) -> pa.RecordBatch:
        """The rows as a record batch of `schema` (the table's raw schema), but that its text columns are
        dictionary-encoded."""
        columns = {"ts": _array(pa.int64(), self.count, self.ts.tobytes())}
        for name, texts in zip(_TEXT_COLUMNS, self.texts):
            columns[name] = (<_Texts>texts).array(True)
        for name, numbers in zip(_NUMBER_COLUMNS, self.numbers):
            columns[name] = (<_Numbers>numbers).array(schema.field(name).type)
        for name, flat, ends in zip(_LIST_COLUMNS, self.lists, self.list_ends):
            columns[name] = pa.ListArray.from_arrays(pa.array(ends, pa.int32()), (<_Texts>flat).array(False))
        return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], names=schema.names)


_TEXT_COLUMNS = ("connection_id", "src", "dst", "kind", "api_name", "client_id", "malformed", "tls_version",
                 "tls_cipher")
_NUMBER_COLUMNS = ("api_key", "api_version", "header_version", "correlation_id", "size", "latency_ms",
                   "throttle_time_ms", "record_count", "inferred", "expects_response", "malformed_offset",
                   "trailing_bytes")
_LIST_COLUMNS = ("capture_files", "errors", "topics")
assert sorted(MESSAGES.raw_names) == sorted(("ts",) + _TEXT_COLUMNS + _NUMBER_COLUMNS + _LIST_COLUMNS), \
    "messages table and MessageColumns disagree"
# the array typecode each number column is gathered in: its Arrow type's width (booleans a byte each)
_ARRAY_CODES = {pa.int32(): "i", pa.int64(): "q", pa.float64(): "d", pa.bool_(): "b"}
_NUMBER_CODES = tuple(_ARRAY_CODES[raw_schema(MESSAGES).field(name).type] for name in _NUMBER_COLUMNS)
cdef tuple _NO_TEXT = ()


cdef class _Numbers:
    """A column of numbers (or booleans) as an array of one typecode, and whether each is set."""

    cdef carray.array values
    cdef carray.array valid  # "b": 1 where set
    cdef Py_ssize_t nulls
    cdef char code

    def __init__(self, str code):
        self.values, self.valid, self.nulls = array(code), array("b"), 0
        self.code = ord(code)

    cdef void add(self, value) except *:
        cdef Py_ssize_t n = len(self.valid)
        carray.resize_smart(self.values, n + 1)
        carray.resize_smart(self.valid, n + 1)
        self.valid.data.as_schars[n] = value is not None
        if value is None:
            self.nulls += 1
            value = 0
        if self.code == b"i":
            self.values.data.as_ints[n] = value
        elif self.code == b"q":
            self.values.data.as_longlongs[n] = value
        elif self.code == b"d":
            self.values.data.as_doubles[n] = value
        else:
            self.values.data.as_schars[n] = value

    cdef object array(self, arrow_type):
        count = len(self.valid)
        validity = _where(pc.not_equal(pa.Array.from_buffers(pa.int8(), count, [None, pa.py_buffer(self.valid)]), 0)
                          ) if self.nulls else None
        if pa.types.is_boolean(arrow_type):
            return pa.Array.from_buffers(pa.uint8(), count, [validity, pa.py_buffer(self.values)]).cast(arrow_type)
        return pa.Array.from_buffers(arrow_type, count, [validity, pa.py_buffer(self.values)])


cdef class _Texts:
    """A column of text (or None) as an index per row into its distinct values, in order of first use. Most rows
    repeat the row before's value (the same object: a connection's endpoints and ids), which needs no lookup."""

    cdef dict index   # value -> its index
    cdef list values
    cdef carray.array at  # "i": each row's index, -1 for None
    cdef object last
    cdef int last_at
    cdef Py_ssize_t nulls

    def __init__(self):
        self.index, self.values, self.at, self.nulls = {}, [], array("i"), 0
        self.last, self.last_at = self, -1  # (a value no row has)

    cdef void add(self, value) except *:
        cdef object found
        if value is not self.last:
            if value is None:
                self.last_at = -1
            else:
                found = self.index.get(value)
                if found is None:
                    found = self.index[value] = len(self.values)
                    self.values.append(value)
                self.last_at = found
            self.last = value
        if self.last_at < 0:
            self.nulls += 1
        _append_int32(self.at, self.last_at)

    cdef object array(self, bint dictionary):
        """The column dictionary-encoded, or as plain text."""
        count = len(self.at)
        at = pa.py_buffer(self.at)
        validity = _where(pc.greater_equal(pa.Array.from_buffers(pa.int32(), count, [None, at]), 0)) if self.nulls \
            else None
        indices = pa.Array.from_buffers(pa.int32(), count, [validity, at])
        distinct = pa.array(self.values, pa.string())
        return pa.DictionaryArray.from_arrays(indices, distinct) if dictionary else distinct.take(indices)


cdef inline void _append_int32(carray.array values, int value) except *:
    cdef Py_ssize_t n = len(values)
    carray.resize_smart(values, n + 1)
    values.data.as_ints[n] = value


cdef inline void _append_int64(carray.array values, long long value) except *:
    cdef Py_ssize_t n = len(values)
    carray.resize_smart(values, n + 1)
    values.data.as_longlongs[n] = value


cdef object _where(flags):
    """The validity bitmap of the rows where `flags` (a boolean array, fresh from a compute function: no nulls, no
    offset) is true."""
    return flags.buffers()[1]


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
