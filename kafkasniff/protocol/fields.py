"""The one model every decoder produces and every renderer consumes.

A decoded message is a tree of `Field`s. Each field knows where its bytes are
(`offset` and `length`, absolute within the buffer that was decoded), so the
`explain` view, `--hex` and error reports all read the same tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

# Types of the fields that hold records decompressed from a batch or a legacy wrapper message: their
# offsets count within the decompressed bytes, not the frame.
DECOMPRESSED_RECORDS = "[]DecompressedRecord"
DECOMPRESSED_MESSAGES = "[]DecompressedMessage"


class Field:
    """One decoded wire item.

    `type` is the wire type as Kafka's schemas spell it (`int32`, `string`,
    `[]TopicData`, ...) or a structural kind used by the record decoders
    (`RecordBatch`, `Record`, ...). `value` holds the decoded Python value for
    leaves (int, str, bytes, bool, float, None); containers carry `children`.
    `note` is a short human annotation (error name, CRC verdict, codec) that
    renderers show next to the value.
    """

    __slots__ = ("name", "type", "offset", "length", "value", "children", "note")

    def __init__(self, name: str, type: str, offset: int, length: int = 0,
                 value: Any = None, children: list[Field] | None = None, note: str | None = None):
        self.name = name
        self.type = type
        self.offset = offset
        self.length = length
        self.value = value
        self.children = children
        self.note = note

    @property
    def end(self) -> int:
        return self.offset + self.length

    def child(self, name: str) -> Field | None:
        for c in self.children or ():
            if c.name == name:
                return c
        return None

    def __getitem__(self, name: str) -> Field:
        found = self.child(name)
        if found is None:
            raise KeyError(name)
        return found

    def walk(self, path: str = "") -> Iterator[tuple[str, Field]]:
        """Depth-first (path, field) pairs, the path joined with dots."""
        here = f"{path}.{self.name}" if path else self.name
        yield here, self
        for c in self.children or ():
            yield from c.walk(here)

    def to_python(self) -> Any:
        """Plain values: dict for structs, list for arrays, the value for leaves."""
        if self.children is None:
            return self.value
        if self.type.startswith("[]"):
            return [c.to_python() for c in self.children]
        return {c.name: c.to_python() for c in self.children}

    def __repr__(self) -> str:
        kids = f", {len(self.children)} children" if self.children is not None else ""
        return f"Field({self.name!r}, {self.type!r}, @{self.offset}+{self.length}, {self.value!r}{kids})"


@dataclass(frozen=True, slots=True)
class Malformed:
    """Why decoding stopped: the absolute byte offset and a one-line reason."""

    offset: int
    reason: str

    def to_json(self) -> dict:
        return {"offset": self.offset, "reason": self.reason}


class DecodeError(Exception):
    """Raised inside decoders when the bytes cannot be read as the schema says.

    Caught at message level and turned into a `Malformed` verdict; never escapes
    the protocol package's public functions.
    """

    def __init__(self, offset: int, reason: str):
        super().__init__(f"at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason
