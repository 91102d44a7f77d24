"""Readers and writers for Kafka's wire primitives.

Every reader has the shape `read_x(buf, pos, end) -> (value, new_pos)` and
raises `DecodeError` with the offset where the bytes ran out or made no sense.
`end` bounds the read so a length field can never reach past the bytes present;
nothing is allocated from a length before it has been checked against `end`.
"""

from __future__ import annotations

import struct
import uuid as uuidlib

from kafkasniff.protocol.fields import DecodeError

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


def _need(pos: int, n: int, end: int, what: str) -> None:
    if pos + n > end:
        raise DecodeError(pos, f"{what} needs {n} bytes, {max(end - pos, 0)} left")


def _fixed(st: struct.Struct, what: str):
    size = st.size
    unpack = st.unpack_from

    def read(buf, pos: int, end: int):
        if pos + size > end:
            raise DecodeError(pos, f"{what} needs {size} bytes, {max(end - pos, 0)} left")
        return unpack(buf, pos)[0], pos + size

    read.__name__ = f"read_{what}"
    return read


read_int8 = _fixed(_I8, "int8")
read_int16 = _fixed(_I16, "int16")
read_uint16 = _fixed(_U16, "uint16")
read_int32 = _fixed(_I32, "int32")
read_uint32 = _fixed(_U32, "uint32")
read_int64 = _fixed(_I64, "int64")
read_float64 = _fixed(_F64, "float64")


def read_bool(buf, pos: int, end: int):
    if pos >= end:
        raise DecodeError(pos, "bool needs 1 byte, 0 left")
    b = buf[pos]
    if b > 1:
        raise DecodeError(pos, f"bool byte is {b}, not 0 or 1")
    return b == 1, pos + 1


def read_uuid(buf, pos: int, end: int):
    _need(pos, 16, end, "uuid")
    return str(uuidlib.UUID(bytes=bytes(buf[pos:pos + 16]))), pos + 16


def read_unsigned_varint(buf, pos: int, end: int):
    start = pos
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise DecodeError(start, "varint runs past the end of the bytes")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError(start, "varint longer than 10 bytes")


def read_varint(buf, pos: int, end: int):
    """Zig-zag signed varint (int32 range)."""
    raw, new = read_unsigned_varint(buf, pos, end)
    if raw >> 32:
        raise DecodeError(pos, f"varint {raw} exceeds 32 bits")
    return (raw >> 1) ^ -(raw & 1), new


def read_varlong(buf, pos: int, end: int):
    """Zig-zag signed varlong (int64 range)."""
    raw, new = read_unsigned_varint(buf, pos, end)
    return (raw >> 1) ^ -(raw & 1), new


def _length(buf, pos: int, end: int, compact: bool, what: str):
    """Return (length or -1 for null, position after the length field)."""
    if compact:
        if pos < end and buf[pos] < 0x80:  # a one-byte length: nearly every string and bytes field
            n, new = buf[pos] - 1, pos + 1
        else:
            n, new = read_unsigned_varint(buf, pos, end)
            n -= 1
    else:
        n, new = (read_int16 if what == "string" else read_int32)(buf, pos, end)
    if n < -1:
        raise DecodeError(pos, f"{what} length {n} is negative")
    if n > end - new:
        raise DecodeError(pos, f"{what} length {n} exceeds the {end - new} bytes left")
    return n, new


def read_string(buf, pos: int, end: int, compact: bool = False, nullable: bool = True):
    n, pos2 = _length(buf, pos, end, compact, "string")
    if n == -1:
        if not nullable:
            raise DecodeError(pos, "null string where the schema does not allow null")
        return None, pos2
    try:
        return str(buf[pos2:pos2 + n], "utf-8"), pos2 + n
    except UnicodeDecodeError:
        raise DecodeError(pos2, "string is not valid UTF-8") from None


def read_bytes(buf, pos: int, end: int, compact: bool = False, nullable: bool = True):
    n, pos2 = _length(buf, pos, end, compact, "bytes")
    if n == -1:
        if not nullable:
            raise DecodeError(pos, "null bytes where the schema does not allow null")
        return None, pos2
    return bytes(buf[pos2:pos2 + n]), pos2 + n


def read_varint_bytes(buf, pos: int, end: int):
    """Bytes prefixed by a zig-zag varint length (-1 = null), as in record keys and values."""
    n, pos2 = read_varint(buf, pos, end)
    if n < -1:
        raise DecodeError(pos, f"length {n} is negative")
    if n == -1:
        return None, pos2
    if n > end - pos2:
        raise DecodeError(pos, f"length {n} exceeds the {end - pos2} bytes left")
    return bytes(buf[pos2:pos2 + n]), pos2 + n


# --- writers -----------------------------------------------------------------

def write_unsigned_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def write_varint(n: int) -> bytes:
    return write_unsigned_varint((n << 1) ^ (n >> 31))


def write_varlong(n: int) -> bytes:
    return write_unsigned_varint((n << 1) ^ (n >> 63))


def write_varint_bytes(b: bytes | None) -> bytes:
    if b is None:
        return write_varint(-1)
    return write_varint(len(b)) + b


FIXED_WRITERS = {
    "int8": _I8.pack,
    "int16": _I16.pack,
    "uint16": _U16.pack,
    "int32": _I32.pack,
    "uint32": _U32.pack,
    "int64": _I64.pack,
    "float64": _F64.pack,
}


def write_bool(v: bool) -> bytes:
    return b"\x01" if v else b"\x00"


def write_uuid(v: str) -> bytes:
    return uuidlib.UUID(v).bytes


def write_string(v: str | None, compact: bool) -> bytes:
    if v is None:
        return write_unsigned_varint(0) if compact else _I16.pack(-1)
    raw = v.encode("utf-8")
    return (write_unsigned_varint(len(raw) + 1) if compact else _I16.pack(len(raw))) + raw


def write_bytes(v: bytes | None, compact: bool) -> bytes:
    if v is None:
        return write_unsigned_varint(0) if compact else _I32.pack(-1)
    return (write_unsigned_varint(len(v) + 1) if compact else _I32.pack(len(v))) + v


def write_array_length(n: int | None, compact: bool) -> bytes:
    if n is None:
        return write_unsigned_varint(0) if compact else _I32.pack(-1)
    return write_unsigned_varint(n + 1) if compact else _I32.pack(n)
