"""The schema-driven interpreter: one decoder for every struct Kafka's schemas define.

A schema variant at one version is compiled once into a chain of small
closures ("ops"). Each op has the shape `op(buf, pos, end, out) -> new_pos`: it
reads one field starting at `pos`, appends its `Field` to `out` and returns the
position after it. Compilation resolves everything that depends only on the
version (presence, compact vs. classic encoding, nullability, tags), so the hot
path does no schema lookups.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Callable

from kafkasniff.protocol import primitives as p
from kafkasniff.protocol.errors import error_name
from kafkasniff.protocol.fields import DecodeError, Field
from kafkasniff.protocol.schema import Variant, in_range, is_flexible

Op = Callable[[object, int, int, list], int]
StructDecoder = Callable[[object, int, int, list], int]

TAGGED_FIELDS = "_tagged_fields"
FIXED_READERS = {
    "bool": p.read_bool,
    "int8": p.read_int8,
    "int16": p.read_int16,
    "uint16": p.read_uint16,
    "int32": p.read_int32,
    "uint32": p.read_uint32,
    "int64": p.read_int64,
    "float64": p.read_float64,
    "uuid": p.read_uuid,
}
# Kafka's own parser rejects these; an analyzer shows what is on the wire and flags it.
NOT_NULLABLE = "not nullable at this version"
_INDEX_NAMES = [f"[{i}]" for i in range(4096)]


def index_name(i: int) -> str:
    return _INDEX_NAMES[i] if i < 4096 else f"[{i}]"


def is_error_code_field(name: str, type_: str) -> bool:
    return type_ == "int16" and name.endswith("ErrorCode")


RecordsExpander = Callable[[object, int, int], list[Field]]


class FieldOps:
    """Op builders that produce the Field tree (the default)."""

    @staticmethod
    def sequence(ops: list[Op]) -> StructDecoder:
        ops_tuple = tuple(ops)

        def decode_struct(buf, pos, end, out):
            for op in ops_tuple:
                pos = op(buf, pos, end, out)
            return pos

        return decode_struct

    # Filled in below, once the builders are defined.
    leaf = array = element = struct = tagged = None


class Compiler:
    """Compiles schema fields at one version into ops.

    The schema walk (presence, compact or classic encoding, nullability, tags)
    lives here once; `builders` decide what the ops make of the bytes: a Field
    tree (FieldOps) or just the few values a summary needs (skim.SkimOps).
    """

    def __init__(self, variant: Variant, version: int, expand_records: RecordsExpander | None,
                 builders=FieldOps):
        self.variant = variant
        self.version = version
        self.flexible = is_flexible(variant, version)
        self.expand_records = expand_records
        self.b = builders

    def struct(self, fields: list[dict]) -> StructDecoder:
        """Decoder for a struct's fields, plus its tagged-field section in flexible versions."""
        ops: list[Op] = []
        tagged: dict[int, tuple[str, Op]] = {}
        for f in fields:
            if not in_range(self.version, f.get("versions")):
                continue
            op = self.field(f)
            if in_range(self.version, f.get("tagged")):
                tagged[f["tag"]] = (f["name"], op)
            else:
                ops.append(op)
        if self.flexible:
            ops.append(self.b.tagged(tagged))
        return self.b.sequence(ops)

    def struct_fields(self, f: dict, struct_name: str) -> list[dict]:
        if "fields" in f:
            return f["fields"]
        try:
            return self.variant.structs[struct_name]
        except KeyError:
            raise ValueError(f"{self.variant.name}: unknown struct type {struct_name}") from None

    def field(self, f: dict) -> Op:
        name, type_ = f["name"], f["type"]
        compact = self.flexible and ("flexible" not in f or in_range(self.version, f["flexible"]))
        nullable = in_range(self.version, f.get("nullable"))
        b = self.b
        if type_.startswith("[]"):
            elem_type = type_[2:]
            if elem_type in FIXED_READERS or elem_type in ("string", "bytes"):
                elem = b.leaf("", elem_type, compact, False, None)
            else:
                elem = b.element(elem_type, self.struct(self.struct_fields(f, elem_type)))
            return b.array(name, type_, compact, nullable, elem)
        if type_ in FIXED_READERS or type_ in ("string", "bytes"):
            return b.leaf(name, type_, compact, nullable, None)
        if type_ == "records":
            return b.leaf(name, type_, compact, nullable, self.expand_records)
        return b.struct(name, type_, nullable, self.struct(self.struct_fields(f, type_)))


# Fixed-width numbers are unpacked inline (no reader call): they are most of all fields.
_NUMBER_FORMATS = {"int8": ">b", "int16": ">h", "uint16": ">H", "int32": ">i", "uint32": ">I", "int64": ">q",
                   "float64": ">d"}


def leaf_op(name: str, type_: str, compact: bool, nullable: bool, expand: RecordsExpander | None) -> Op:
    if type_ in _NUMBER_FORMATS:
        layout = struct.Struct(_NUMBER_FORMATS[type_])
        unpack, size = layout.unpack_from, layout.size
        is_error = is_error_code_field(name, type_)

        def number(buf, pos, end, out):
            new = pos + size
            if new > end:
                raise DecodeError(pos, f"{type_} needs {size} bytes, {max(end - pos, 0)} left")
            v = unpack(buf, pos)[0]
            out.append(Field(name, type_, pos, size, v, None, error_name(v) if is_error else None))
            return new
        return number
    if type_ in FIXED_READERS:
        read = FIXED_READERS[type_]
        if is_error_code_field(name, type_):
            def error_code(buf, pos, end, out):
                v, new = read(buf, pos, end)
                out.append(Field(name, type_, pos, new - pos, v, None, error_name(v)))
                return new
            return error_code

        def fixed(buf, pos, end, out):
            v, new = read(buf, pos, end)
            out.append(Field(name, type_, pos, new - pos, v))
            return new
        return fixed

    read_var = p.read_string if type_ == "string" else p.read_bytes

    def variable(buf, pos, end, out):
        v, new = read_var(buf, pos, end, compact, True)
        fld = Field(name, type_, pos, new - pos, v, None, None if v is not None or nullable else NOT_NULLABLE)
        if expand is not None and v:
            fld.children = expand(buf, new - len(v), new)
        out.append(fld)
        return new
    return variable


def _read_count(buf, pos, end, compact):
    if compact:
        n, new = p.read_unsigned_varint(buf, pos, end)
        return n - 1, new
    return p.read_int32(buf, pos, end)


def array_op(name: str, type_: str, compact: bool, nullable: bool, elem: Op) -> Op:
    def array(buf, pos, end, out):
        n, new = _read_count(buf, pos, end, compact)
        if n < 0:
            if n == -1:
                out.append(Field(name, type_, pos, new - pos, None, None, None if nullable else NOT_NULLABLE))
                return new
            raise DecodeError(pos, f"{name}: array length {n} is not allowed here")
        if n > end - new:
            raise DecodeError(pos, f"{name}: array count {n} exceeds the {end - new} bytes left")
        items: list[Field] = []
        fld = Field(name, type_, pos, 0, n, items)
        out.append(fld)
        start, pos = pos, new
        try:
            for _ in range(n):
                pos = elem(buf, pos, end, items)
        except DecodeError as e:
            fld.length = e.offset - start
            raise
        for i, item in enumerate(items):
            item.name = index_name(i)
        fld.length = pos - start
        return pos
    return array


def struct_element_op(type_: str, decode: StructDecoder) -> Op:
    def element(buf, pos, end, out):
        kids: list[Field] = []
        fld = Field("", type_, pos, 0, None, kids)
        out.append(fld)
        try:
            new = decode(buf, pos, end, kids)
        except DecodeError as e:
            fld.length = e.offset - pos
            raise
        fld.length = new - pos
        return new
    return element


def struct_op(name: str, type_: str, nullable: bool, decode: StructDecoder) -> Op:
    element = struct_element_op(type_, decode)

    def struct(buf, pos, end, out):
        start = pos
        if nullable:
            # Kafka marks a nullable struct with a presence byte: -1 null, 1 present.
            marker, pos = p.read_int8(buf, pos, end)
            if marker < 0:
                out.append(Field(name, type_, start, 1, None))
                return pos
        pos = element(buf, pos, end, out)
        out[-1].name = name
        out[-1].offset = start
        out[-1].length = pos - start
        return pos
    return struct


def tagged_entries(buf, pos: int, end: int, known: dict[int, tuple[str, Op]], out: list):
    """Walk a tagged-field section, decoding the known tags into `out` with their ops.

    Yields (tag, value start, value stop) for every entry, known or not; the section ends at the
    last entry's stop.
    """
    count, new = p.read_unsigned_varint(buf, pos, end)
    if count > end - new:
        raise DecodeError(pos, f"tagged field count {count} exceeds the {end - new} bytes left")
    pos = new
    for _ in range(count):
        tag, pos = p.read_unsigned_varint(buf, pos, end)
        size, pos = p.read_unsigned_varint(buf, pos, end)
        if size > end - pos:
            raise DecodeError(pos, f"tagged field {tag} size {size} exceeds the {end - pos} bytes left")
        stop = pos + size
        if tag in known:
            tag_name, op = known[tag]
            got = op(buf, pos, stop, out)
            if got != stop:
                raise DecodeError(got, f"tagged field {tag_name} (tag {tag}) has {stop - got} bytes left over")
        yield tag, pos, stop
        pos = stop


def tagged_section(known: dict[int, tuple[str, Op]]) -> Op:
    def tagged_fields(buf, pos, end, out):
        if pos < end and not buf[pos]:  # no tagged fields: by far the most common case
            out.append(Field(TAGGED_FIELDS, "tagged_fields", pos, 1, 0, []))
            return pos + 1
        kids: list[Field] = []
        section = Field(TAGGED_FIELDS, "tagged_fields", pos, 0, None, kids)
        out.append(section)
        start = stop = pos
        count = 0
        try:
            for tag, value_at, stop in tagged_entries(buf, pos, end, known, kids):
                count += 1
                if tag not in known:
                    kids.append(Field(f"tag_{tag}", "unknown_tag", value_at, stop - value_at,
                                      bytes(buf[value_at:stop]), None, f"unknown tag {tag}"))
        except DecodeError as e:
            section.length = e.offset - start
            raise
        section.value = count
        section.length = (stop if count else p.read_unsigned_varint(buf, pos, end)[1]) - start
        return start + section.length
    return tagged_fields


FieldOps.leaf = staticmethod(leaf_op)
FieldOps.array = staticmethod(array_op)
FieldOps.element = staticmethod(struct_element_op)
FieldOps.struct = staticmethod(struct_op)
FieldOps.tagged = staticmethod(tagged_section)


@cache
def compile_variant(variant_key: tuple, version: int, expand_records: RecordsExpander | None,
                    builders=FieldOps) -> StructDecoder:
    variant = _VARIANTS[variant_key]
    return Compiler(variant, version, expand_records, builders).struct(variant.fields)


_VARIANTS: dict[tuple, Variant] = {}


def struct_decoder(variant: Variant, version: int, expand_records: RecordsExpander | None = None,
                   builders=FieldOps) -> StructDecoder:
    """Cached decoder for a whole schema (message body, header or data struct) at a version."""
    key = (variant.name, variant.versions)
    _VARIANTS.setdefault(key, variant)
    return compile_variant(key, version, expand_records, builders)


def decode_struct(variant: Variant, version: int, buf, pos: int, end: int, name: str,
                  expand_records: RecordsExpander | None = None) -> tuple[Field, DecodeError | None]:
    """Decode one schema struct from buf[pos:end].

    Returns the struct Field (children decoded so far) and the DecodeError that
    stopped it, if any. Never raises for bad bytes.
    """
    kids: list[Field] = []
    root = Field(name, variant.name, pos, 0, None, kids)
    decode = struct_decoder(variant, version, expand_records)
    try:
        new = decode(buf, pos, end, kids)
    except DecodeError as e:
        root.length = e.offset - pos
        return root, e
    root.length = new - pos
    return root, None
