"""Skim a message: check its whole structure, keep only the values a one-line summary needs.

The same schema walk as the full decoder (interpreter.Compiler), with builders
that make no Field objects. They build a small tree of nodes, and each (schema,
version) tree is assembled into a program for the skim interpreter in C
(`_skim.c`): the one-line view skims every message, and in Python the call per
field was most of what skimming cost.

The interpreter moves the position, checks every length against the bytes
present as the full decoder does, and appends `(name, value)` for the wanted
fields only: non-zero error codes, the header's correlation id and client id,
and Produce's acks. Runs of fixed-width fields share one bounds check. Where the
bytes are wrong it stops without saying why: the full decoder then says where
and why (messages.py), so a malformed frame reads alike in every view.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

from kafkasniff.protocol import _skim
from kafkasniff.protocol.interpreter import FIXED_READERS, is_error_code_field, struct_decoder
from kafkasniff.protocol.schema import Variant, in_range

_FIXED_SIZES = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
                "float64": 8, "uuid": 16}
SKIP, ERROR_CODE, WANTED_VALUE, BOOL = "skip", "error code", "wanted", "bool"


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


# -- programs for the interpreter in _skim.c ------------------------------------------------------

OP_RUN, OP_STRING, OP_BYTES, OP_ARRAY, OP_ARRAY_SKIP, OP_NULLABLE, OP_TAGGED = range(1, 8)
_KINDS = {type_: kind for kind, type_ in enumerate(
    ("bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "uuid"))}
_ROLES = {SKIP: 0, ERROR_CODE: 1, WANTED_VALUE: 2, BOOL: 3}
REFUSED = -1


class SkimProgram(NamedTuple):
    ops: array
    names: tuple[str, ...]

    def run(self, buf, pos: int, end: int, out: list) -> int:
        """The position after the walk, or REFUSED where the bytes are not what the schema says."""
        return _skim.run(self.ops, self.names, buf, pos, end, out)


class _Assembler:
    def __init__(self) -> None:
        self.names: dict[str, int] = {}

    def name(self, text: str) -> int:
        return self.names.setdefault(text, len(self.names))

    def ops(self, node) -> list[int]:
        kind = type(node)
        if kind is Sequence:
            return [op for item in node.items for op in self.ops(item)]
        if kind is Run:
            code = [OP_RUN, node.size, len(node.parts)]
            for type_, _, name, role in node.parts:
                code += (_KINDS[type_], _ROLES[role], self.name(name))
            return code
        if kind is Text:
            if node.kind == "string":
                return [OP_STRING, node.compact, self.name(node.name) if node.keep else -1]
            return [OP_BYTES, node.compact]
        if kind is Array:
            if type(node.elem) is Run and node.elem.skips_only:
                return [OP_ARRAY_SKIP, node.compact, node.elem.size]
            body = self.ops(node.elem)
            return [OP_ARRAY, node.compact, len(body), *body]
        if kind is NullableStruct:
            body = self.ops(node.body)
            return [OP_NULLABLE, len(body), *body]
        if kind is Tagged:
            entries = []
            for tag, (_, op) in node.known.items():
                body = self.ops(op)
                entries += (tag, len(body), *body)
            return [OP_TAGGED, len(node.known), len(entries), *entries]
        raise TypeError(f"no skim op for {node!r}")


_PROGRAMS: dict[tuple, SkimProgram] = {}


def skim_program(header: Variant, header_version: int, body: Variant | None, body_version: int) -> SkimProgram:
    """One program that skims a header and then (unless body is None) the body after it.

    It appends the header's correlation id and client id first (as far as the header goes), then the
    body's wanted values."""
    key = (header.name, header.versions, header_version, body and body.name, body and body.versions, body_version)
    found = _PROGRAMS.get(key)
    if found is None:
        parts = [struct_decoder(header, header_version, None, HEADER_VALUES)]
        if body is not None:
            parts.append(struct_decoder(body, body_version, None, BODY_VALUES))
        assembler = _Assembler()
        ops = array("i", assembler.ops(SkimOps.sequence(parts)))
        found = _PROGRAMS[key] = SkimProgram(ops, tuple(assembler.names))
    return found


def kept_values(body) -> list[tuple[str, object]]:
    """The values a skim keeps, taken from a decoded body (Field tree) instead, in wire order."""
    return [(f.name, f.value) for _, f in body.walk()
            if (f.value and is_error_code_field(f.name, f.type)) or f.name in BODY_VALUES.wanted]


def header_value_count(header: Variant, version: int) -> int:
    """How many values a header's skim yields when the header is whole."""
    return sum(1 for f in header.fields if in_range(version, f.get("versions")) and
               not in_range(version, f.get("tagged")) and f["name"] in HEADER_VALUES.wanted)
