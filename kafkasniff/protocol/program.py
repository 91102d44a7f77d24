"""One version-resolved schema tree per (schema, version), and the program the walker runs from it.

Kafka's schemas describe every version at once: which fields exist at a version, whether strings, bytes and
arrays are compact (unsigned varint lengths) or classic (int16/int32), which values may be null, which
fields are tagged. `resolve` answers all of that once for one version and gives a plain tree (Struct,
Array, Leaf), each node with its field role (topic name, partition, error code, records, ...: facts the
generator wrote into the table, plus the few that quirks.py and embedded.py name). This is the only place
those rules are applied.

`program` assembles a tree into the int32 words the C walker (`_walk`) runs, which checks them when the
Program is made. Every view walks the same program with its own builder: summary, JSON, Field tree.
"""

from __future__ import annotations

import re
from array import array
from functools import cache
from typing import NamedTuple

from kafkasniff.protocol import _walk
from kafkasniff.protocol.schema import Variant, in_range, is_flexible

# Field roles, numbered as the walker numbers them (walk.h's enum role).
ROLES = _walk.ROLES
_ROLE_NUMBERS = {role: number for number, role in enumerate(ROLES)}
FIXED_TYPES = ("bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "uuid")
_KINDS = {type_: kind for kind, type_ in enumerate(FIXED_TYPES)}
OP_FIXED, OP_STRING, OP_BYTES, OP_ARRAY, OP_STRUCT, OP_TAGGED = range(1, 7)
INDEX_NAME = -1  # an array element's name: its index


class Leaf(NamedTuple):
    """One value: a fixed-width number, bool or uuid; a string; bytes; or records."""

    name: str
    type: str
    compact: bool
    nullable: bool
    role: str | None


class Array(NamedTuple):
    name: str
    type: str            # "[]Element"
    compact: bool
    nullable: bool
    role: str | None     # also the role of each element when they are leaves
    element: Leaf | Struct


class Struct(NamedTuple):
    name: str
    type: str
    nullable: bool       # behind a presence byte
    members: tuple
    tagged: tuple | None  # ((tag, node), ...) in flexible versions, else None: no tagged-field section


def resolve(variant: Variant, version: int, roles: dict[tuple[str, ...], str] | None = None,
            name: str = "") -> Struct:
    """The schema at one version. `roles` adds roles by path (field names from the top), over the table's."""
    return _Resolver(variant, version, roles or {}).struct(name, variant.name, False, variant.fields, ())


class _Resolver:
    def __init__(self, variant: Variant, version: int, roles: dict):
        self.variant = variant
        self.version = version
        self.flexible = is_flexible(variant, version)
        self.roles = roles

    def struct(self, name: str, type_: str, nullable: bool, fields: list[dict], path: tuple) -> Struct:
        members, tagged = [], []
        for f in fields:
            if not in_range(self.version, f.get("versions")):
                continue
            node = self.field(f, path + (f["name"],))
            if in_range(self.version, f.get("tagged")):
                tagged.append((f["tag"], node))
            else:
                members.append(node)
        # Tagged fields exist only in flexible versions; every flexible struct ends with its (maybe empty) section.
        return Struct(name, type_, nullable, tuple(members), tuple(tagged) if self.flexible else None)

    def struct_fields(self, f: dict, struct_type: str) -> list[dict]:
        if "fields" in f:
            return f["fields"]
        try:
            return self.variant.structs[struct_type]
        except KeyError:
            raise ValueError(f"{self.variant.name}: unknown struct type {struct_type}") from None

    def field(self, f: dict, path: tuple) -> Leaf | Array | Struct:
        name, type_ = f["name"], f["type"]
        compact = self.flexible and ("flexible" not in f or in_range(self.version, f["flexible"]))
        nullable = in_range(self.version, f.get("nullable"))
        role = self.roles.get(path, f.get("role"))
        if type_.startswith("[]"):
            element_type = type_[2:]
            if element_type in _KINDS or element_type in ("string", "bytes"):
                element = Leaf("", element_type, compact, False, role)
            else:
                element = self.struct("", element_type, False, self.struct_fields(f, element_type), path)
            return Array(name, type_, compact, nullable, role, element)
        if type_ in _KINDS or type_ in ("string", "bytes", "records"):
            return Leaf(name, type_, compact, nullable, role)
        return self.struct(name, type_, nullable, self.struct_fields(f, type_), path)


# -- programs ----------------------------------------------------------------------------------------

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(name: str) -> str:
    """Kafka schema names to JSON keys: ThrottleTimeMs -> throttle_time_ms, TopicID -> topic_id."""
    return _CAMEL.sub("_", name).lower()


@cache
def _json_key(name: str) -> bytes:
    """A schema name as the walker writes it in JSON, '"snake_case":': kept, as most programs share most names
    (each worker assembles the programs it meets). Kafka's field names are ASCII letters and digits: nothing in
    them needs escaping."""
    return f'"{snake_case(name)}":'.encode()


class _Assembler:
    def __init__(self) -> None:
        self.names: dict[str, int] = {}

    def name(self, text: str) -> int:
        return self.names.setdefault(text, len(self.names))

    def role(self, role: str | None) -> int:
        return _ROLE_NUMBERS[role or "none"]

    def node(self, n, element: bool = False) -> list[int]:
        name = INDEX_NAME if element else self.name(n.name)
        if type(n) is Leaf:
            if n.type in _KINDS:
                return [OP_FIXED, _KINDS[n.type], self.role(n.role), name]
            op = OP_STRING if n.type == "string" else OP_BYTES
            return [op, int(n.compact), int(n.nullable), self.role(n.role), name]
        if type(n) is Array:
            body = self.node(n.element, element=True)
            return [OP_ARRAY, int(n.compact), int(n.nullable), self.role(n.role), name, self.name(n.type), len(body),
                    *body]
        body = self.members(n)
        return [OP_STRUCT, int(n.nullable), name, self.name(n.type), len(body), *body]

    def members(self, struct: Struct) -> list[int]:
        words = [w for m in struct.members for w in self.node(m)]
        if struct.tagged is not None:
            entries = []
            for tag, node in struct.tagged:
                body = self.node(node)
                entries += (tag, len(body), *body)
            words += (OP_TAGGED, len(struct.tagged), len(entries), *entries)
        return words

    def keys(self) -> tuple[bytes, ...]:
        return tuple(map(_json_key, self.names))


def program(tree: Struct) -> _walk.Program:
    """The walker's program for a resolved tree; its root is named tree.name (the view's name for it)."""
    assembler = _Assembler()
    root_name, root_type = assembler.name(tree.name), assembler.name(tree.type)
    words = array("i", assembler.members(tree))
    return _walk.Program(words, tuple(assembler.names), assembler.keys(), root_name, root_type)


_PROGRAMS: dict[tuple, _walk.Program] = {}


def program_for(variant: Variant, version: int, name: str, roles: tuple = ()) -> _walk.Program:
    """Cached program of a schema at a version, its root called `name`; `roles`: ((path, role), ...)."""
    key = (variant.name, variant.versions, version, name, roles)
    found = _PROGRAMS.get(key)
    if found is None:
        found = _PROGRAMS[key] = program(resolve(variant, version, dict(roles), name))
    return found
