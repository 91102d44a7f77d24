# cython: language_level=3, boundscheck=False, wraparound=False
"""Every byte of a decoded frame, as rows: offset, length, field path, type, value.

Leaves give one row each. Bytes inside a container that no child covers
(array counts, string and struct length prefixes, tag headers) become rows of
their own, named after the container, so the rows tile the input exactly.

One walk (RowCursor) makes the rows of `explain` (as Row tuples) and the byte tables of --hex (written as text
by write_byte_table, without a Python object per row but the value: --hex makes a row per field of every
message, a Fetch's records included, and a table has to be measured before it is written). Compiled, and the
Fields' slots read in C, for that.
"""

from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.string cimport memcpy, memset

from kafkasniff.render.decimal cimport DECIMAL_ROOM, write_decimal
from kafkasniff.render.fieldslots cimport FieldObject, slot
from rich.cells import cell_len

from kafkasniff.protocol._walk import FieldBase
from kafkasniff.protocol.fields import DECOMPRESSED_MESSAGES, DECOMPRESSED_RECORDS, Field
from kafkasniff.protocol.sasl import SECRET, TOKEN
from kafkasniff.render.jsonview import MASK
from kafkasniff.render.values import Pieces, show_value


cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL
    bint PyUnicode_IS_ASCII(object text)
    bint PyObject_TypeCheck(object o, type t)


cdef type _FieldBase = FieldBase  # checked for every field: a C reference, not a global looked up by name


TABLE_HEADER = ("offset", "bytes", "field", "type", "value")
HEX_SHOWN = 8  # bytes of a row shown in the bytes column unless every byte is asked for
_SECRET_BYTE = "••"  # a secret's byte in the bytes column (its value: MASK)
_TOKEN_VALUE = "length prefix or token syntax"  # a SASL token's own bytes
# What the rows look up for every field, as C values and references (not as the module's globals, by name)
cdef Py_ssize_t _HEX_SHOWN = HEX_SHOWN
# Containers whose children are decoded from other bytes (decompressed records): their offsets do not point into
# the frame, so the container is one opaque row.
cdef frozenset _DETACHED = frozenset({DECOMPRESSED_RECORDS, DECOMPRESSED_MESSAGES})
cdef dict _PREFIX_LABELS = {"tagged_fields": "tag count / tag header", "records": "length prefix"}
cdef str _SECRET = SECRET, _TOKEN = TOKEN, _BITS = "bits"
cdef object _show_value = show_value
_MORE = " …"  # after the bytes of a row that shows only its first ones


class Row(NamedTuple):
    offset: int
    length: int
    path: str
    type: str
    value: str | Pieces  # Pieces: a long value shown whole, by show_value_in_pieces


cdef str _prefix_value(FieldObject *f, limit):
    """What the bytes of a container that precede or sit between its children mean."""
    cdef str type_text = slot(f.type)
    if type_text.startswith("[]"):
        return "length: " + _show_value(<object>f, limit)
    return _PREFIX_LABELS.get(type_text, "length / presence prefix")


def _flags_value(f: Field) -> str:
    """Flags packed into one integer share its bytes: one row, the flags in its value."""
    flags = ", ".join(f"{c.name}={c.note or c.value}" for c in f.children)
    return f"{f.value} ({flags})"


cdef enum RowKind:
    SIZE, LEAF, FLAGS, PREFIX, UNDECODED


cdef struct Level:
    PyObject *field  # a container being walked (held by its parent's children, or by the roots)
    PyObject *children  # its children in byte order: a new reference
    Py_ssize_t index, count, cursor, path_len
    bint path_plain
    bint gap_shown, ended


cdef class RowCursor:
    """The rows of a frame's fields, one at a time (next_row), in byte order: the size prefix's row when
    `size_text` is given (offset 0), then the rows of each root (their offsets plus `shift`), then a row for the
    bytes up to `end` that no row covers (where decoding stopped). The current row: offset, length, kind, the
    field it is made from (the container for a prefix's row), and its path (UTF-8, path[:path_len]; path_plain
    when it is printable ASCII, as wide on a terminal as it is long)."""

    cdef list roots
    cdef Py_ssize_t root_index, end, shift, covered_to
    cdef object size_text
    cdef Level *levels
    cdef int depth, capacity
    cdef char *path
    cdef Py_ssize_t path_capacity
    cdef bint size_done, tail_done
    # the current row
    cdef Py_ssize_t offset, length
    cdef int kind
    cdef FieldObject *field
    cdef Py_ssize_t path_len
    cdef bint path_plain

    def __cinit__(self, list roots, Py_ssize_t end, size_text, Py_ssize_t shift):
        for root in roots:
            if not PyObject_TypeCheck(root, _FieldBase):
                raise TypeError(f"not a Field: {root!r}")
        self.roots = roots
        self.end = end
        self.shift = shift
        self.size_text = size_text
        self.size_done = size_text is None
        self.covered_to = 4 if size_text is not None else 0
        self.capacity = 16
        self.levels = <Level *>PyMem_Malloc(self.capacity * sizeof(Level))
        self.path_capacity = 256
        self.path = <char *>PyMem_Malloc(self.path_capacity)
        if self.levels == NULL or self.path == NULL:
            raise MemoryError()

    def __dealloc__(self):
        while self.depth:
            self._pop()
        PyMem_Free(self.levels)
        PyMem_Free(self.path)

    cdef void _pop(self):
        self.depth -= 1
        Py_DECREF(<object>self.levels[self.depth].children)

    cdef int _set_path(self, Py_ssize_t at, bint parent_plain, name) except -1:
        """path[:at] joined with name (as join_path: no dot before an item's [i], none after an empty path)."""
        cdef Py_ssize_t n
        cdef const char *text = PyUnicode_AsUTF8AndSize(name, &n)
        cdef bint dot = at > 0 and n > 0 and text[0] != b'['
        if at + n + 1 > self.path_capacity:
            self.path_capacity = 2 * (at + n + 1)
            self.path = <char *>PyMem_Realloc(self.path, self.path_capacity)
            if self.path == NULL:
                raise MemoryError()
        if dot:
            self.path[at] = b'.'
            at += 1
        memcpy(self.path + at, text, n)
        self.path_len = at + n
        self.path_plain = parent_plain and _plain(text, n)
        return 0

    cdef bint _enter(self, FieldObject *f, Py_ssize_t parent_len, bint parent_plain) except -1:
        """Start on f: True when it is one row (a leaf, a detached container, packed flags), else its level is
        pushed and False."""
        self._set_path(parent_len, parent_plain, slot(f.name))
        children = slot(f.children)
        if children is None or slot(f.type) in _DETACHED:
            return self._row(LEAF, f.offset, f.length, f)
        if children and PyObject_TypeCheck(children[0], _FieldBase) and \
                slot((<FieldObject *><PyObject *>children[0]).type) == _BITS:
            return self._row(FLAGS, f.offset, f.length, f)
        children = self._in_byte_order(children)
        if self.depth == self.capacity:
            self.capacity *= 2
            self.levels = <Level *>PyMem_Realloc(self.levels, self.capacity * sizeof(Level))
            if self.levels == NULL:
                raise MemoryError()
        cdef Level *level = &self.levels[self.depth]
        memset(level, 0, sizeof(Level))
        level.field = <PyObject *>f
        Py_INCREF(children)
        level.children = <PyObject *>children
        level.count = len(children)
        level.cursor = f.offset
        level.path_len = self.path_len
        level.path_plain = self.path_plain
        self.depth += 1
        return False

    cdef list _in_byte_order(self, children):
        cdef list items = children if type(children) is list else list(children)
        cdef Py_ssize_t i, last = -1
        for item in items:
            if not PyObject_TypeCheck(item, _FieldBase):
                raise TypeError(f"not a Field: {item!r}")
            if (<FieldObject *><PyObject *>item).offset < last:
                return sorted(items, key=_offset)
            last = (<FieldObject *><PyObject *>item).offset
        return items

    cdef bint _row(self, int kind, Py_ssize_t offset, Py_ssize_t length, FieldObject *f) except -1:
        self.kind = kind
        self.field = f
        if kind == SIZE or kind == UNDECODED:
            self.offset, self.length = offset, length
        else:
            self.offset, self.length = offset + self.shift, length
            if self.offset + length > self.covered_to:
                self.covered_to = self.offset + length
        return True

    cdef bint next_row(self) except -1:
        """Move to the next row: False when there is none."""
        cdef Level *top
        cdef FieldObject *child
        cdef FieldObject *container
        if not self.size_done:
            self.size_done = True
            self._set_path(0, True, "size")
            return self._row(SIZE, 0, 4, NULL)
        while True:
            if self.depth == 0:
                if self.root_index < len(self.roots):
                    self.root_index += 1
                    if self._enter(<FieldObject *><PyObject *>self.roots[self.root_index - 1], 0, True):
                        return True
                    continue
                if self.tail_done or self.covered_to >= self.end:
                    return False
                self.tail_done = True
                self._set_path(0, True, "_undecoded")
                return self._row(UNDECODED, self.covered_to, self.end - self.covered_to, NULL)
            top = &self.levels[self.depth - 1]
            if top.ended:
                self._pop()
                continue
            if top.index < top.count:
                child = <FieldObject *><PyObject *>(<list>top.children)[top.index]
                if child.offset > top.cursor and not top.gap_shown:
                    top.gap_shown = True
                    self.path_len, self.path_plain = top.path_len, top.path_plain
                    return self._row(PREFIX, top.cursor, child.offset - top.cursor, <FieldObject *>top.field)
                top.gap_shown = False
                top.index += 1
                if child.offset + child.length > top.cursor:
                    top.cursor = child.offset + child.length
                if self._enter(child, top.path_len, top.path_plain):
                    return True
                continue
            top.ended = True
            container = <FieldObject *>top.field
            if container.offset + container.length > top.cursor:
                self.path_len, self.path_plain = top.path_len, top.path_plain
                return self._row(PREFIX, top.cursor, container.offset + container.length - top.cursor, container)

    cdef str path_text(self):
        return self.path[:self.path_len].decode("utf-8")

    cdef object type_text(self):
        if self.kind == SIZE:
            return "int32"
        if self.kind == UNDECODED:
            return "bytes"
        return slot(self.field.type)

    cdef object value(self, limit, show):
        """The row's value: `show` gives a leaf's."""
        if self.kind == LEAF:
            return show(<object>self.field, limit)
        if self.kind == PREFIX:
            return _prefix_value(self.field, limit)
        if self.kind == FLAGS:
            return _flags_value(<object>self.field)
        if self.kind == SIZE:
            return self.size_text
        return "not decoded"


def _offset(f) -> int:
    return f.offset


def byte_rows(list roots, Py_ssize_t end, size_text, Py_ssize_t shift, limit: int | None = 64,
              show: Callable[[Field, int | None], str | Pieces] = show_value) -> Iterator[Row]:
    """RowCursor's rows as Row tuples, made one at a time."""
    cdef RowCursor cursor = RowCursor(roots, end, size_text, shift)
    while cursor.next_row():
        yield Row(cursor.offset, cursor.length, cursor.path_text(), cursor.type_text(), cursor.value(limit, show))


# --- the byte table of --hex, as text ---------------------------------------------------------------------------

cdef struct Out:
    char *data
    Py_ssize_t len, capacity


cdef int _reserve(Out *o, Py_ssize_t n) except -1:
    if o.len + n > o.capacity:
        o.capacity = 2 * (o.len + n)
        o.data = <char *>PyMem_Realloc(o.data, o.capacity)
        if o.data == NULL:
            raise MemoryError()
    return 0


cdef inline int _put(Out *o, const char *p, Py_ssize_t n) except -1:
    _reserve(o, n)
    memcpy(o.data + o.len, p, n)
    o.len += n
    return 0


cdef inline int _put_text(Out *o, str text) except -1:
    cdef Py_ssize_t n
    cdef const char *p = PyUnicode_AsUTF8AndSize(text, &n)
    return _put(o, p, n)


cdef inline int _pad(Out *o, Py_ssize_t n) except -1:
    """n spaces (at least the two between columns)."""
    _reserve(o, n)
    memset(o.data + o.len, b' ', n)
    o.len += n
    return 0


cdef inline Py_ssize_t _digits(Py_ssize_t v):
    cdef Py_ssize_t n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


cdef int _put_int(Out *o, Py_ssize_t v) except -1:
    cdef char text[DECIMAL_ROOM]
    cdef int at = write_decimal(text, v)
    return _put(o, text + at, DECIMAL_ROOM - at)


cdef inline bint _plain(const char *p, Py_ssize_t n):
    """Printable ASCII only: as wide on a terminal as it is long."""
    cdef Py_ssize_t i
    for i in range(n):
        if <unsigned char>p[i] < 0x20 or <unsigned char>p[i] > 0x7E:
            return False
    return True


cdef Py_ssize_t _text_width(str text) except -1:
    """Terminal cells the text takes (rich's measure where it is not printable ASCII)."""
    cdef Py_ssize_t n
    cdef const char *p = PyUnicode_AsUTF8AndSize(text, &n)
    return n if _plain(p, n) else cell_len(text)


cdef Py_ssize_t _SECRET_BYTE_WIDTH = cell_len(_SECRET_BYTE), _MORE_WIDTH = cell_len(_MORE)
cdef bytes _HEX_DIGITS = b"0123456789abcdef"


cdef class _Table:
    """One frame's byte table: how its cursor's rows are measured and written, cell by cell."""

    cdef const unsigned char[:] data
    cdef bytes prefix
    cdef Py_ssize_t shift
    cdef bint full, show_secrets
    cdef object limit
    cdef object last_type  # the type measured last, and its width: rows of a kind come together
    cdef Py_ssize_t last_type_width

    cdef Py_ssize_t type_width(self, type_text) except -1:
        if type_text is not self.last_type:
            self.last_type, self.last_type_width = type_text, _text_width(type_text)
        return self.last_type_width

    cdef Py_ssize_t frame_end(self):
        return self.shift + self.data.shape[0]

    cdef bint secret(self, RowCursor row):
        return row.kind != SIZE and row.kind != UNDECODED and slot(row.field.type) == _SECRET

    cdef Py_ssize_t shown(self, RowCursor row):
        """Bytes of the row the bytes column shows."""
        return row.length if self.full or row.length <= _HEX_SHOWN else _HEX_SHOWN

    cdef Py_ssize_t span_width(self, RowCursor row):
        if row.length <= 1:
            return _digits(row.offset)
        return _digits(row.offset) + 1 + _digits(row.offset + row.length - 1)

    cdef int put_span(self, Out *o, RowCursor row) except -1:
        _put_int(o, row.offset)
        if row.length > 1:
            _put(o, "-", 1)
            _put_int(o, row.offset + row.length - 1)
        return 0

    cdef Py_ssize_t hex_width(self, RowCursor row, bint masked):
        cdef Py_ssize_t shown = self.shown(row), cells
        if masked:
            cells = shown * _SECRET_BYTE_WIDTH + (shown - 1 if shown else 0)
        else:  # the bytes the frame has of them
            cells = min(row.offset + shown, self.frame_end()) - row.offset
            cells = 3 * cells - 1 if cells > 0 else 0
        return cells + (_MORE_WIDTH if shown < row.length else 0)

    cdef int put_hex(self, Out *o, RowCursor row, bint masked) except -1:
        cdef Py_ssize_t shown = self.shown(row), at, stop, i
        cdef unsigned char byte
        cdef const char *digits = _HEX_DIGITS
        if masked:
            for i in range(shown):
                if i:
                    _put(o, " ", 1)
                _put_text(o, _SECRET_BYTE)
        else:
            stop = min(row.offset + shown, self.frame_end())
            _reserve(o, 3 * (stop - row.offset))
            for at in range(row.offset, stop):
                byte = self.prefix[at] if at < self.shift else self.data[at - self.shift]
                if at > row.offset:
                    o.data[o.len] = b' '
                    o.len += 1
                o.data[o.len] = digits[byte >> 4]
                o.data[o.len + 1] = digits[byte & 15]
                o.len += 2
        if shown < row.length:
            _put_text(o, _MORE)
        return 0

    cdef str value(self, RowCursor row, bint masked, type_text):
        if masked:
            return MASK
        if type_text == _TOKEN:
            return _TOKEN_VALUE
        return row.value(self.limit, _show_value)


cdef _Table _frame_table(bytes prefix, data, Py_ssize_t shift, limit, bint full, bint show_secrets):
    cdef _Table table = _Table()
    table.data = data
    table.prefix = prefix
    table.shift = shift
    table.limit = limit
    table.full = full
    table.show_secrets = show_secrets
    return table


cdef Py_ssize_t _path_width(RowCursor row) except -1:
    return row.path_len if row.path_plain else cell_len(row.path_text())


def write_byte_table(list roots, Py_ssize_t end, size_text, Py_ssize_t shift, bytes prefix, data, limit, bint full,
                     bint show_secrets, write) -> None:
    """The frame's byte table as plain text, columns two spaces apart and the last unpadded, handed to write(bytes)
    in pieces of about a megabyte: the rows are walked twice, to measure the columns and to write them, rather
    than held. `prefix`: the frame's first `shift` bytes, before `data`'s; secrets masked unless `show_secrets`."""
    cdef _Table table = _frame_table(prefix, data, shift, limit, full, show_secrets)
    cdef Py_ssize_t widths[4]
    cdef Py_ssize_t i
    cdef bint masked
    for i in range(4):
        widths[i] = len(TABLE_HEADER[i])
    cdef RowCursor row = RowCursor(roots, end, size_text, shift)
    while row.next_row():
        widths[0] = max(widths[0], table.span_width(row))
        widths[1] = max(widths[1], table.hex_width(row, table.secret(row) and not show_secrets))
        widths[2] = max(widths[2], _path_width(row))
        widths[3] = max(widths[3], table.type_width(row.type_text()))
    cdef Out o = Out(NULL, 0, 0)
    try:
        for i in range(4):
            _put_text(&o, TABLE_HEADER[i])
            _pad(&o, widths[i] - len(TABLE_HEADER[i]) + 2)
        _put_text(&o, TABLE_HEADER[4])
        _put(&o, "\n", 1)
        row = RowCursor(roots, end, size_text, shift)
        while row.next_row():
            table.put_span(&o, row)
            _pad(&o, widths[0] - table.span_width(row) + 2)
            masked = table.secret(row) and not show_secrets
            table.put_hex(&o, row, masked)
            _pad(&o, widths[1] - table.hex_width(row, masked) + 2)
            _put(&o, row.path, row.path_len)
            _pad(&o, widths[2] - _path_width(row) + 2)
            type_text = row.type_text()
            _put_text(&o, type_text)
            _pad(&o, widths[3] - table.type_width(type_text) + 2)
            _put_text(&o, table.value(row, masked, type_text))
            _put(&o, "\n", 1)
            if o.len >= 1 << 20:
                write(PyBytes_FromStringAndSize(o.data, o.len))
                o.len = 0
        if o.len:
            write(PyBytes_FromStringAndSize(o.data, o.len))
    finally:
        PyMem_Free(o.data)


def byte_cells(list roots, Py_ssize_t end, size_text, Py_ssize_t shift, bytes prefix, data, limit, bint full,
               bint show_secrets) -> Iterator[tuple]:
    """The cells of write_byte_table's rows (offsets, bytes, field, type, value) and whether the row is a secret,
    for a table drawn with styles."""
    cdef _Table table = _frame_table(prefix, data, shift, limit, full, show_secrets)
    cdef RowCursor row = RowCursor(roots, end, size_text, shift)
    cdef Out o = Out(NULL, 0, 0)
    cdef bint secret, masked
    try:
        while row.next_row():
            secret = table.secret(row)
            masked = secret and not show_secrets
            table.put_span(&o, row)
            span = o.data[:o.len].decode("utf-8")
            o.len = 0
            table.put_hex(&o, row, masked)
            hex_text = o.data[:o.len].decode("utf-8")
            o.len = 0
            type_text = row.type_text()
            yield span, hex_text, row.path_text(), type_text, table.value(row, masked, type_text), secret
    finally:
        PyMem_Free(o.data)


def uncovered(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """Byte ranges in [start, end) that no (offset, length) of the rows covers: empty when the map is complete."""
    gaps = []
    cursor = start
    for offset, length in sorted(spans):
        if offset > cursor:
            gaps.append((cursor, offset))
        cursor = max(cursor, offset + length)
    if cursor < end:
        gaps.append((cursor, end))
    return gaps
