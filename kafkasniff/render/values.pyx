# cython: language_level=3
"""How decoded values look to people (text) and to programs (JSON).

Compiled (Cython, as it is): --hex and explain show a value per row, hundreds of thousands of them."""

from __future__ import annotations

import base64
import codecs
import time
from typing import Iterable, Iterator

from cpython.object cimport PyObject

from kafkasniff.render.decimal cimport DECIMAL_ROOM, write_decimal
from kafkasniff.render.fieldslots cimport FieldObject, slot

from kafkasniff.protocol._walk import FieldBase, readable
from kafkasniff.protocol.errors import error_name
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.messages import Message

cdef extern from "Python.h":
    bint PyObject_TypeCheck(object o, type t)
    long long PyLong_AsLongLongAndOverflow(object v, int *overflow) except? -1


cdef type _FieldBase = FieldBase  # checked for every field: a C reference, not a global looked up by name


cdef str _decimal(object v):
    """str(v) of an int, written here where it fits 64 bits (str() of an int costs several times as much)."""
    cdef int overflow = 0
    cdef long long n = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow:
        return str(v)
    cdef char text[DECIMAL_ROOM]
    cdef int at = write_decimal(text, n)
    return text[at:DECIMAL_ROOM].decode("ascii")


DEFAULT_MAX_VALUE = 64
FRAME_PREFIX = 4  # offsets shown to people count from the start of the frame's size prefix
# A value shown whole that is longer than this (bytes or characters) is made and written in pieces of about this
# size: a value can be as long as its frame, and its text or JSON several times that.
PIECE = 1 << 16


class Pieces:
    """A long text value, made a piece at a time as it is written (once), never whole."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: Iterable[str]):
        self.pieces = pieces

    def __str__(self) -> str:
        return "".join(self.pieces)


def error_names(msg: Message) -> list[str]:
    """Names of the non-zero error codes in the message's body, each once."""
    return list(dict.fromkeys(error_name(code) for code in msg.errors)) if msg.errors else []
def show_bytes(raw, limit: int | None = DEFAULT_MAX_VALUE) -> str:
    """Bytes as people read them: quoted text when readable (valid UTF-8, printable), else hex; cut to
    `limit` characters (or limit/2 bytes of hex), with their size. Only what is shown is formatted: a value
    can be megabytes."""
    n = len(raw)
    if readable(raw):
        # `limit` characters are within 4 bytes each: decode no more than needed (a cut character is dropped)
        head = bytes(raw if limit is None or n <= 4 * (limit + 1) else raw[:4 * (limit + 1)])
        text = head.decode("utf-8", "ignore")
        out = repr(text if limit is None or len(text) <= limit else text[:limit] + "…")
    else:
        out = "0x" + (bytes(raw).hex(" ") if limit is None or n <= limit // 2 else
                      bytes(raw[:limit // 2]).hex(" ") + " …")
    if limit is not None and n > limit // 2:
        out += f" ({n:,} bytes)"
    return out


def timestamp_text(ms: int | None) -> str:
    """A record or batch time (milliseconds since the epoch) as UTC, or why there is none."""
    if ms is None or ms < 0:
        return "no timestamp"
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    except (OverflowError, OSError, ValueError):
        return str(ms)


def show_value(f: Field, limit: int | None = DEFAULT_MAX_VALUE) -> str:
    if not PyObject_TypeCheck(f, _FieldBase):
        raise TypeError(f"not a Field: {f!r}")
    cdef FieldObject *field = <FieldObject *><PyObject *>f  # its slots, read without looking the names up
    v = slot(field.value)
    children, role, note = slot(field.children), slot(field.role), slot(field.note)
    if children is not None and slot(field.type).startswith("[]"):
        # an array cut short by a malformed frame: what the wire said, and what could be read
        decoded = len(children)
        wire = v if type(v) is int else decoded  # schema arrays hold their wire count; record lists do not
        text = f"{decoded} items" if wire == decoded else f"{wire} on the wire, {decoded} decoded"
    elif role == "checksum":
        text = f"0x{v:08x}"
    elif role == "timestamp":
        text = f"{v} ({timestamp_text(v)})"
    elif type(v) is int:  # most values: tested first
        text = _decimal(v)
    elif v is None:
        text = "null"
    elif isinstance(v, (bytes, bytearray)):
        text = show_bytes(v, limit)
    elif isinstance(v, str):
        text = repr(v if limit is None or len(v) <= limit else v[:limit] + "…")
    elif isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, dict) or type(v) is Malformed:  # (a malformed item's note says where and why)
        text = ""
    else:
        text = str(v)
    if note:
        text = f"{text} ({note})" if text else note
    return text


def show_value_in_pieces(f: Field, limit: int | None = DEFAULT_MAX_VALUE) -> str | Pieces:
    """show_value; a long bytes or text value shown whole (no limit) as Pieces."""
    v = f.value
    if (limit is not None or not isinstance(v, (bytes, bytearray, str)) or len(v) <= PIECE or
            f.children is not None and f.type.startswith("[]") or f.role in ("checksum", "timestamp")):
        return show_value(f, limit)
    return Pieces(_shown_pieces(v, f.note))


def _shown_pieces(v: bytes | bytearray | str, note: str | None) -> Iterator[str]:
    """The pieces of show_value of bytes or text without a limit: repr() of the text, or 0x and the bytes."""
    if isinstance(v, str):
        yield from _repr_pieces((v[at:at + PIECE] for at in range(0, len(v), PIECE)), "'" in v and '"' not in v)
    elif readable(v):
        yield from _repr_pieces(_text_pieces(v, "ignore"), b"'" in v and b'"' not in v)
    else:
        yield "0x"
        for at in range(0, len(v), PIECE):
            yield (" " if at else "") + bytes(v[at:at + PIECE]).hex(" ")
    if note:
        yield f" ({note})"


def _repr_pieces(texts: Iterable[str], double_quoted: bool) -> Iterator[str]:
    """repr() of the text the pieces make, a piece at a time. repr() quotes with ' unless the text holds ' and not
    ", and escapes character by character; a piece followed by " makes its repr() take ' too."""
    quote = '"' if double_quoted else "'"
    yield quote
    for text in texts:
        yield repr(text)[1:-1] if double_quoted else repr(text + '"')[1:-2]
    yield quote


def _text_pieces(raw, errors: str = "strict") -> Iterator[str]:
    """UTF-8 bytes decoded a piece at a time (a character cut between pieces is kept whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    for at in range(0, len(raw), PIECE):
        yield decoder.decode(bytes(raw[at:at + PIECE]))
    yield decoder.decode(b"", True)


def _valid_utf8(raw) -> bool:
    try:
        for _ in _text_pieces(raw):
            pass
    except UnicodeDecodeError:
        return False
    return True


def json_bytes(raw: bytes | None):
    """Lossless JSON for bytes: base64, plus the text form when it is valid UTF-8."""
    if raw is None:
        return None
    out = {"base64": base64.b64encode(raw).decode("ascii")}
    try:
        out["text"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    return out


def json_value(v):
    if type(v) is Malformed:  # the value of a malformed item of records
        return v.to_json()
    if isinstance(v, (bytes, bytearray)):
        return json_bytes(bytes(v))
    if isinstance(v, dict):
        return {k: json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    return v


def json_value_in_pieces(v):
    """json_value; long bytes as Pieces of base64 and of text."""
    if not isinstance(v, (bytes, bytearray)) or len(v) <= PIECE:
        return json_value(v)
    step = 3 * (PIECE // 4)  # whole groups of 3 bytes: base64 pieces that join
    out = {"base64": Pieces(base64.b64encode(v[at:at + step]).decode("ascii") for at in range(0, len(v), step))}
    if _valid_utf8(v):
        out["text"] = Pieces(_text_pieces(v))
    return out
