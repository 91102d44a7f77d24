"""The one model every decoder produces and every renderer consumes.

A decoded message is a tree of `Field`s. Each field knows where its bytes are
(`offset` and `length`, absolute within the buffer that was decoded), so the
`explain` view, `--hex` and error reports all read the same tree. The walker
(`_walk`, C) makes them: their storage is its FieldBase, the methods are here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from kafkasniff.protocol._walk import FieldBase

# Types of the fields that hold records decompressed from a batch or a legacy wrapper message: their
# offsets count within the decompressed bytes, not the frame.
DECOMPRESSED_RECORDS = "[]DecompressedRecord"
DECOMPRESSED_MESSAGES = "[]DecompressedMessage"
# The name the walker gives a struct's tagged-field section.
TAGGED_FIELDS = "_tagged_fields"


class Field(FieldBase):
    """One decoded wire item.

    `type` is the wire type as Kafka's schemas spell it (`int32`, `string`,
    `[]TopicData`, ...) or a structural kind used by the record decoders
    (`RecordBatch`, `Record`, ...). `value` holds the decoded Python value for
    leaves (int, str, bytes, bool, float, None); containers carry `children`.
    `note` is a short human annotation (error name, CRC verdict, codec) that
    renderers show next to the value. `role` says what a schema field is for
    (program.ROLES: "errorCode", "topicName", ...), or None.
    """

    __slots__ = ()

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
