"""Skim a message: check its whole structure, keep only the values a one-line summary needs.

The same compiled schema walk as the full decoder (interpreter.Compiler), with
op builders that make no Field objects: they move the position, check every
length against the bytes present exactly as the full decoder does, and append
`(name, value)` for the wanted fields only: non-zero error codes, the header's
correlation id and client id, and Produce's acks. Runs of fixed-width fields
that nobody wants are merged into one bounds-checked skip.
"""

from __future__ import annotations

from kafkasniff.protocol import primitives as p
from kafkasniff.protocol.fields import DecodeError
from kafkasniff.protocol.interpreter import (FIXED_READERS, Op, StructDecoder, is_error_code_field, struct_decoder,
                                             tagged_entries)
from kafkasniff.protocol.schema import Variant

WANTED = frozenset({"CorrelationId", "ClientId", "Acks"})
_FIXED_SIZES = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
                "float64": 8, "uuid": 16}


class Skip:
    """A run of fixed-width fields nobody wants: merged with its neighbours before compiling."""

    __slots__ = ("size", "parts")

    def __init__(self, parts: tuple[tuple[str, int], ...]):
        self.parts = parts  # (wire type, size) of each field, to report a shortfall where it happens
        self.size = sum(size for _, size in parts)

    def __call__(self, buf, pos, end, out):
        new = pos + self.size
        if new > end:
            for type_, size in self.parts:
                if pos + size > end:
                    raise DecodeError(pos, f"{type_} needs {size} bytes, {max(end - pos, 0)} left")
                pos += size
        return new


def _bool_check(buf, pos, end, out):
    v, new = p.read_bool(buf, pos, end)  # a bool byte must be 0 or 1, as the full decoder insists
    return new


class SkimOps:
    @staticmethod
    def sequence(ops: list[Op]) -> StructDecoder:
        merged: list[Op] = []
        for op in ops:
            if type(op) is Skip and merged and type(merged[-1]) is Skip:
                merged[-1] = Skip(merged[-1].parts + op.parts)
            else:
                merged.append(op)
        if len(merged) == 1:
            return merged[0]
        if len(merged) == 2:  # most element structs: no loop for them
            first, second = merged
            return lambda buf, pos, end, out: second(buf, first(buf, pos, end, out), end, out)
        if len(merged) == 3:
            first, second, third = merged
            return lambda buf, pos, end, out: third(buf, second(buf, first(buf, pos, end, out), end, out), end, out)
        ops_tuple = tuple(merged)

        def skim_struct(buf, pos, end, out):
            for op in ops_tuple:
                pos = op(buf, pos, end, out)
            return pos

        return skim_struct

    @staticmethod
    def leaf(name: str, type_: str, compact: bool, nullable: bool, expand) -> Op:
        if type_ in FIXED_READERS:
            read = FIXED_READERS[type_]
            if is_error_code_field(name, type_):
                def error_code(buf, pos, end, out):
                    v, new = read(buf, pos, end)
                    if v:
                        out.append((name, v))
                    return new
                return error_code
            if name in WANTED:
                def wanted(buf, pos, end, out):
                    v, new = read(buf, pos, end)
                    out.append((name, v))
                    return new
                return wanted
            return _bool_check if type_ == "bool" else Skip(((type_, _FIXED_SIZES[type_]),))

        if type_ == "string":
            # Strings are read (not skipped) so invalid UTF-8 is malformed here as in the full decoder.
            keep = name in WANTED

            def string(buf, pos, end, out):
                v, new = p.read_string(buf, pos, end, compact, True)
                if keep:
                    out.append((name, v))
                return new
            return string

        def skip_bytes(buf, pos, end, out):
            if compact:
                n, new = p.read_unsigned_varint(buf, pos, end)
                n -= 1
            else:
                n, new = p.read_int32(buf, pos, end)
            if n < -1:
                raise DecodeError(pos, f"bytes length {n} is negative")
            if n > end - new:
                raise DecodeError(pos, f"bytes length {n} exceeds the {end - new} bytes left")
            return new + max(n, 0)
        return skip_bytes

    @staticmethod
    def array(name: str, type_: str, compact: bool, nullable: bool, elem: Op) -> Op:
        fixed = elem.size if type(elem) is Skip else None

        def array(buf, pos, end, out):
            if compact:
                n, new = p.read_unsigned_varint(buf, pos, end)
                n -= 1
            else:
                n, new = p.read_int32(buf, pos, end)
            if n < 0:
                if n == -1:
                    return new
                raise DecodeError(pos, f"{name}: array length {n} is not allowed here")
            if n > end - new:
                raise DecodeError(pos, f"{name}: array count {n} exceeds the {end - new} bytes left")
            if fixed is not None and new + n * fixed <= end:
                return new + n * fixed
            for _ in range(n):
                new = elem(buf, new, end, out)
            return new
        return array

    @staticmethod
    def element(type_: str, decode: StructDecoder) -> Op:
        return decode

    @staticmethod
    def struct(name: str, type_: str, nullable: bool, decode: StructDecoder) -> Op:
        if not nullable:
            return decode

        def nullable_struct(buf, pos, end, out):
            marker, pos = p.read_int8(buf, pos, end)
            return pos if marker < 0 else decode(buf, pos, end, out)
        return nullable_struct

    @staticmethod
    def tagged(known: dict[int, tuple[str, Op]]) -> Op:
        def tagged_fields(buf, pos, end, out):
            if pos < end and not buf[pos]:
                return pos + 1  # no tagged fields: by far the most common case
            stop = p.read_unsigned_varint(buf, pos, end)[1]  # where an all-empty section would end
            for _, _, stop in tagged_entries(buf, pos, end, known, out):
                pass
            return stop
        return tagged_fields


def skim_struct(variant: Variant, version: int, buf, pos: int, end: int,
                found: list) -> tuple[int, DecodeError | None]:
    """Skim buf[pos:end] as the schema struct; wanted values go to `found`. Returns (end, error)."""
    try:
        return struct_decoder(variant, version, None, SkimOps)(buf, pos, end, found), None
    except DecodeError as e:
        return e.offset, e
