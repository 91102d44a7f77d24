"""Writers of Kafka's wire primitives, for the encoders (tests and tools build exact frames with them).

Reading is the walker's (program.py, _walk): one implementation of the wire rules.
"""

from __future__ import annotations

import struct
import uuid as uuidlib

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


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
