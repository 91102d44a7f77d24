# cython: language_level=3
"""Every byte of a decoded frame, as rows: offset, length, field path, type, value.

Leaves give one row each. Bytes inside a container that no child covers
(array counts, string and struct length prefixes, tag headers) become rows of
their own, named after the container, so the rows tile the input exactly.

Compiled (Cython, as it is): --hex makes a row per field of every message, a Fetch's records included.
"""

from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

from kafkasniff.protocol.fields import DECOMPRESSED_MESSAGES, DECOMPRESSED_RECORDS, Field
from kafkasniff.render.values import Pieces, show_value

# Containers whose children are decoded from other bytes (decompressed records):
# their offsets do not point into the frame, so the container is one opaque row.
DETACHED_TYPES = frozenset({DECOMPRESSED_RECORDS, DECOMPRESSED_MESSAGES})

_PREFIX_LABELS = {"tagged_fields": "tag count / tag header", "records": "length prefix"}


class Row(NamedTuple):
    offset: int
    length: int
    path: str
    type: str
    value: str | Pieces  # Pieces: a long value shown whole, by show_value_in_pieces


def join_path(parent: str, name: str) -> str:
    if not parent:
        return name
    if not name or name.startswith("["):
        return parent + name
    return f"{parent}.{name}"


def _prefix_value(f: Field, limit: int | None) -> str:
    """What the bytes of a container that precede or sit between its children mean."""
    if f.type.startswith("[]"):
        return f"length: {show_value(f, limit)}"
    return _PREFIX_LABELS.get(f.type, "length / presence prefix")


def rows(f: Field, parent: str = "", limit: int | None = 64,
         show: Callable[[Field, int | None], str | Pieces] = show_value) -> Iterator[Row]:
    """The rows of f and what it holds, in byte order; `show` gives a leaf's value."""
    path = join_path(parent, f.name)
    if f.children is None or f.type in DETACHED_TYPES:
        yield Row(f.offset, f.length, path, f.type, show(f, limit))
        return
    if f.children and f.children[0].type == "bits":
        # Flags packed into one integer share its bytes: one row, the flags in its value.
        flags = ", ".join(f"{c.name}={c.note or c.value}" for c in f.children)
        yield Row(f.offset, f.length, path, f.type, f"{f.value} ({flags})")
        return
    cursor = f.offset
    for child in sorted(f.children, key=lambda c: c.offset):
        if child.offset > cursor:
            yield Row(cursor, child.offset - cursor, path, f.type, _prefix_value(f, limit))
        yield from rows(child, path, limit, show)
        cursor = max(cursor, child.end)
    if f.end > cursor:
        yield Row(cursor, f.end - cursor, path, f.type, _prefix_value(f, limit))


def uncovered(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """Byte ranges in [start, end) that no (offset, length) of the rows covers: empty when the map is complete."""
    gaps = []
    cursor = start
    for offset, length in sorted(spans):
        if offset > cursor:
            gaps.append((cursor, offset))
        cursor = max(cursor, offset + length)
    if cursor < end:
        gaps.append((cursor, end))
    return gaps
