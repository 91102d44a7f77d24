"""Skim a message: check its whole structure, keep only the values a one-line summary needs.

The same schema walk as the full decoder (interpreter.Compiler), with builders
that make no Field objects. They build a small tree of nodes, and each (schema,
version) tree is turned into the Python source of one straight-line function,
compiled once: the one-line view skims every message, and a call per field is
most of what skimming would cost otherwise.

The generated code moves the position, checks every length against the bytes
present exactly as the full decoder does (same offsets, same reasons), and
appends `(name, value)` for the wanted fields only: non-zero error codes, the
header's correlation id and client id, and Produce's acks. Runs of
fixed-width fields share one bounds check.
"""

from __future__ import annotations

import struct
from typing import Callable

from kafkasniff.protocol import primitives as p
from kafkasniff.protocol.fields import DecodeError
from kafkasniff.protocol.interpreter import FIXED_READERS, is_error_code_field, struct_decoder, tagged_entries
from kafkasniff.protocol.schema import Variant, in_range

_FIXED_SIZES = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
                "float64": 8, "uuid": 16}
_UNPACKERS = {type_: struct.Struct(fmt).unpack_from
              for type_, fmt in (("int8", ">b"), ("int16", ">h"), ("uint16", ">H"), ("int32", ">i"),
                                 ("uint32", ">I"), ("int64", ">q"), ("float64", ">d"))}
SKIP, ERROR_CODE, WANTED_VALUE, BOOL = "skip", "error code", "wanted", "bool"
# Python allows 20 nested blocks in a function; deeper parts of a schema get functions of their own.
_MAX_INLINE_DEPTH = 14

Skimmer = Callable[[object, int, int, list], int]


# -- nodes the builders make -------------------------------------------------------------------

class Run:
    """Consecutive fixed-width fields: (wire type, size, name, role) each."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[tuple[str, int, str, str], ...]):
        self.parts = parts

    @property
    def size(self) -> int:
        return sum(size for _, size, _, _ in self.parts)

    @property
    def skips_only(self) -> bool:
        return all(role == SKIP for _, _, _, role in self.parts)


class Text:
    __slots__ = ("kind", "name", "compact", "keep")

    def __init__(self, kind: str, name: str, compact: bool, keep: bool):
        self.kind, self.name, self.compact, self.keep = kind, name, compact, keep


class Array:
    __slots__ = ("name", "compact", "elem")

    def __init__(self, name: str, compact: bool, elem):
        self.name, self.compact, self.elem = name, compact, elem


class NullableStruct:
    __slots__ = ("body",)

    def __init__(self, body):
        self.body = body


class Tagged:
    __slots__ = ("known",)

    def __init__(self, known: dict):
        self.known = known


class Sequence:
    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items


class SkimOps:
    """Builders for interpreter.Compiler; `wanted` names the fields whose values are kept."""

    def __init__(self, wanted: frozenset[str]):
        self.wanted = wanted

    @staticmethod
    def sequence(nodes: list) -> Sequence:
        merged: list = []
        for node in nodes:
            for item in node.items if type(node) is Sequence else (node,):
                if type(item) is Run and merged and type(merged[-1]) is Run:
                    merged[-1] = Run(merged[-1].parts + item.parts)
                else:
                    merged.append(item)
        return Sequence(merged)

    def leaf(self, name: str, type_: str, compact: bool, nullable: bool, expand):
        if type_ in FIXED_READERS:
            if is_error_code_field(name, type_):
                role = ERROR_CODE
            elif name in self.wanted:
                role = WANTED_VALUE
            else:
                role = BOOL if type_ == "bool" else SKIP
            return Run(((type_, _FIXED_SIZES[type_], name, role),))
        # Strings are read (not skipped) so invalid UTF-8 is malformed here as in the full decoder.
        return Text("string" if type_ == "string" else "bytes", name, compact, name in self.wanted)

    @staticmethod
    def array(name: str, type_: str, compact: bool, nullable: bool, elem) -> Array:
        return Array(name, compact, elem)

    @staticmethod
    def element(type_: str, decode):
        return decode

    @staticmethod
    def struct(name: str, type_: str, nullable: bool, decode):
        return NullableStruct(decode) if nullable else decode

    @staticmethod
    def tagged(known: dict) -> Tagged:
        return Tagged(known)


HEADER_VALUES = SkimOps(frozenset({"CorrelationId", "ClientId"}))
BODY_VALUES = SkimOps(frozenset({"Acks"}))  # Produce's: whether a response will come


# -- helpers the generated code calls -----------------------------------------------------------

def _run_error(buf, pos: int, end: int, out: list, parts) -> None:
    """A run does not fit: replay it field by field, as the full decoder reads it, up to the failure."""
    for type_, size, name, role in parts:
        if pos + size > end:
            if type_ == "bool":
                raise DecodeError(pos, "bool needs 1 byte, 0 left")
            raise DecodeError(pos, f"{type_} needs {size} bytes, {max(end - pos, 0)} left")
        _act(buf, pos, out, type_, name, role)
        pos += size


def _act(buf, pos: int, out: list, type_: str, name: str, role: str) -> None:
    if role == BOOL and buf[pos] > 1:
        raise DecodeError(pos, f"bool byte is {buf[pos]}, not 0 or 1")
    if role == ERROR_CODE or role == WANTED_VALUE:
        v = FIXED_READERS[type_](buf, pos, pos + _FIXED_SIZES[type_])[0]
        if v or role == WANTED_VALUE:
            out.append((name, v))


def _length(buf, pos: int, end: int, compact: bool, kind: str) -> tuple[int, int]:
    if compact:
        if pos < end and buf[pos] < 0x80:
            n, new = buf[pos] - 1, pos + 1
        else:
            n, new = p.read_unsigned_varint(buf, pos, end)
            n -= 1
    else:
        width = 2 if kind == "string" else 4
        if pos + width > end:
            raise DecodeError(pos, f"{'int16' if width == 2 else 'int32'} needs {width} bytes, {max(end - pos, 0)} left")
        n, new = (_UNPACKERS["int16"] if width == 2 else _UNPACKERS["int32"])(buf, pos)[0], pos + width
    if n < -1:
        raise DecodeError(pos, f"{kind} length {n} is negative")
    if n > end - new:
        raise DecodeError(pos, f"{kind} length {n} exceeds the {end - new} bytes left")
    return n, new


def _skip_string(buf, pos: int, end: int, compact: bool) -> int:
    n, new = _length(buf, pos, end, compact, "string")
    if n <= 0:
        return new
    try:
        str(buf[new:new + n], "utf-8")
    except UnicodeDecodeError:
        raise DecodeError(new, "string is not valid UTF-8") from None
    return new + n


def _skip_bytes(buf, pos: int, end: int, compact: bool) -> int:
    n, new = _length(buf, pos, end, compact, "bytes")
    return new + n if n > 0 else new


def _array_length(buf, pos: int, end: int, compact: bool, name: str) -> tuple[int, int]:
    """(element count, position after it); -1 for a null array."""
    if compact:
        n, new = p.read_unsigned_varint(buf, pos, end)
        n -= 1
    else:
        n, new = p.read_int32(buf, pos, end)
    if n < -1:
        raise DecodeError(pos, f"{name}: array length {n} is not allowed here")
    if n > end - new:
        raise DecodeError(pos, f"{name}: array count {n} exceeds the {end - new} bytes left")
    return n, new


def _tagged(buf, pos: int, end: int, known: dict, out: list) -> int:
    stop = p.read_unsigned_varint(buf, pos, end)[1]  # where an all-empty section would end
    for _, _, stop in tagged_entries(buf, pos, end, known, out):
        pass
    return stop


# -- source generation -------------------------------------------------------------------------

class _Generator:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, object] = {
            "DecodeError": DecodeError, "_run_error": _run_error, "_skip_string": _skip_string,
            "_skip_bytes": _skip_bytes, "_read_string": p.read_string, "_array_length": _array_length,
            "_tagged": _tagged, **{f"_unpack_{t}": u for t, u in _UNPACKERS.items()},
        }

    def constant(self, value) -> str:
        name = f"_c{len(self.names)}"
        self.names[name] = value
        return name

    def function(self, node) -> Skimmer:
        outer, self.lines = self.lines, []
        self.emit(node, 1)
        source = "def skim(buf, pos, end, out):\n" + "".join(self.lines) + "    return pos\n"
        self.lines = outer
        namespace = dict(self.names)
        exec(compile(source, "<kafkasniff skim>", "exec"), namespace)
        return namespace["skim"]

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text + "\n")

    def emit(self, node, depth: int) -> None:
        if depth > _MAX_INLINE_DEPTH:
            self.line(depth, f"pos = {self.constant(self.function(node))}(buf, pos, end, out)")
            return
        kind = type(node)
        if kind is Sequence:
            for item in node.items:
                self.emit(item, depth)
            if not node.items:
                self.line(depth, "pass")
        elif kind is Run:
            self.run(node, depth)
        elif kind is Text:
            self.text(node, depth)
        elif kind is Array:
            self.array(node, depth)
        elif kind is NullableStruct:
            self.line(depth, "if pos >= end:")
            self.line(depth + 1, "raise DecodeError(pos, 'int8 needs 1 bytes, 0 left')")
            self.line(depth, "pos += 1")
            self.line(depth, "if buf[pos - 1] < 0x80:")  # the presence marker: -1 is null
            self.line(depth + 1, "pass")
            self.emit(node.body, depth + 1)
        elif kind is Tagged:
            known = {tag: (name, self.function(op)) for tag, (name, op) in node.known.items()}
            self.line(depth, "if pos < end and not buf[pos]:")  # no tagged fields: by far the most common case
            self.line(depth + 1, "pos += 1")
            self.line(depth, "else:")
            self.line(depth + 1, f"pos = _tagged(buf, pos, end, {self.constant(known)}, out)")
        else:
            raise TypeError(f"no skim code for {node!r}")

    def run(self, node: Run, depth: int) -> None:
        size = node.size
        self.line(depth, f"if pos + {size} > end:")
        self.line(depth + 1, f"_run_error(buf, pos, end, out, {self.constant(node.parts)})")
        at = 0
        for type_, part_size, name, role in node.parts:
            where = f"pos + {at}" if at else "pos"
            if role == BOOL:
                self.line(depth, f"if buf[{where}] > 1:")
                self.line(depth + 1, f"raise DecodeError({where}, f'bool byte is {{buf[{where}]}}, not 0 or 1')")
            elif role == ERROR_CODE:
                self.line(depth, f"v = _unpack_{type_}(buf, {where})[0]")
                self.line(depth, "if v:")
                self.line(depth + 1, f"out.append(({name!r}, v))")
            elif role == WANTED_VALUE:
                self.line(depth, f"out.append(({name!r}, _unpack_{type_}(buf, {where})[0]))")
            at += part_size
        self.line(depth, f"pos += {size}")

    def text(self, node: Text, depth: int) -> None:
        if node.keep:
            self.line(depth, f"v, pos = _read_string(buf, pos, end, {node.compact}, True)")
            self.line(depth, f"out.append(({node.name!r}, v))")
        else:
            self.line(depth, f"pos = _skip_{node.kind}(buf, pos, end, {node.compact})")

    def array(self, node: Array, depth: int) -> None:
        elem = node.elem
        if node.compact:  # a one-byte count: nearly every array
            self.line(depth, "if pos < end and buf[pos] < 0x80:")
            self.line(depth + 1, "n = buf[pos] - 1")
            self.line(depth + 1, "pos += 1")
            self.line(depth + 1, "if n > end - pos:")
            self.line(depth + 2, "n, pos = _array_length(buf, pos - 1, end, True, "
                                 f"{node.name!r})")  # raises, with the full decoder's words
            self.line(depth, "else:")
            self.line(depth + 1, f"n, pos = _array_length(buf, pos, end, True, {node.name!r})")
        else:
            self.line(depth, f"n, pos = _array_length(buf, pos, end, False, {node.name!r})")
        if type(elem) is Run and elem.skips_only:
            size = elem.size
            self.line(depth, f"if n > 0 and pos + n * {size} > end:")
            self.line(depth + 1, f"_run_error(buf, pos + (end - pos) // {size} * {size}, end, out, "
                                 f"{self.constant(elem.parts)})")
            self.line(depth, f"if n > 0:")
            self.line(depth + 1, f"pos += n * {size}")
            return
        self.line(depth, "for _ in range(n):")  # a null array (-1) has no elements
        self.emit(elem, depth + 1)


_SKIMMERS: dict[tuple, Skimmer] = {}


def skimmer(header: Variant, header_version: int, body: Variant | None, body_version: int) -> Skimmer:
    """One function that skims a header and then (unless body is None) the body after it.

    It appends the header's correlation id and client id first (as far as the header goes), then the
    body's wanted values."""
    key = (header.name, header.versions, header_version, body and body.name, body and body.versions, body_version)
    found = _SKIMMERS.get(key)
    if found is None:
        parts = [struct_decoder(header, header_version, None, HEADER_VALUES)]
        if body is not None:
            parts.append(struct_decoder(body, body_version, None, BODY_VALUES))
        found = _SKIMMERS[key] = _Generator().function(SkimOps.sequence(parts))
    return found


def header_value_count(header: Variant, version: int) -> int:
    """How many values a header's skim yields when the header is whole."""
    return sum(1 for f in header.fields if in_range(version, f.get("versions")) and
               not in_range(version, f.get("tagged")) and f["name"] in HEADER_VALUES.wanted)
