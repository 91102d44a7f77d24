"""`kafkasniff explain` output: a byte-by-byte table, or the same tree as JSON, written as they are made.

A dump may hold 16 MiB of bytes, and its output can be ten times that: nothing is made whole. The table is
written a row at a time (render/tables.py, as --hex), the JSON document an item at a time, and a long value
(bytes or text shown whole) a piece at a time.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as json_string  # what json.dumps quotes strings with
from typing import Callable, Iterator, TextIO

from rich.console import Console

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.identify import Identification, declared_size, readings_text
from kafkasniff.render.bytemap import HEX_SHOWN, Row, byte_rows, uncovered
from kafkasniff.render.jsonview import readings_json
from kafkasniff.render.tables import column_widths, table_lines, write_table
from kafkasniff.render.values import PIECE, Pieces, json_value_in_pieces, show_value, show_value_in_pieces


def message_rows(ident: Identification, data: bytes, limit: int | None,
                 show: Callable[[Field, int | None], str | Pieces] = show_value) -> Iterator[Row]:
    """The rows of every byte of the frame, in order (the bytes after where decoding stopped in one); `show`
    gives a leaf's value."""
    size_text = str(declared_size(data)) if ident.has_size_prefix else None
    return byte_rows(list(ident.message.fields()), len(data), size_text, 0, limit, show)


def hex_of(data: bytes, r: Row) -> str:
    chunk = data[r.offset:r.offset + min(r.length, HEX_SHOWN)]
    return chunk.hex(" ") + (" …" if r.length > HEX_SHOWN else "")


def headline(ident: Identification, data: bytes) -> str:
    m = ident.message
    if m.api_version is None:  # the bytes end before the header's API key and version
        parts = [f"{m.kind} of unknown API and version"]
    else:
        parts = [f"{m.api_name} v{m.api_version} {m.kind}"]
    if m.header_version is not None:
        parts.append(f"header v{m.header_version}")
    if m.correlation_id is not None:
        parts.append(f"correlation id {m.correlation_id}")
    if m.kind == "request" and m.header_version:
        parts.append(f"client id {m.client_id!r}")
    if not ident.has_size_prefix:
        parts.append(f"{m.size} bytes")
    elif declared_size(data) == m.size:
        parts.append(f"{m.size} bytes + 4-byte size prefix")
    else:  # the dump stops inside the frame
        parts.append(f"{m.size} of {declared_size(data)} bytes + 4-byte size prefix")
    return " · ".join(parts)


def print_explanation(console: Console, ident: Identification, data: bytes, limit: int | None) -> None:
    """The headline, what was assumed, the table, and what is wrong; on a terminal styled, else plain lines."""
    m = ident.message
    console.print(f"[bold]{headline(ident, data)}[/bold]")
    if ident.assumed:
        console.print(f"[yellow]{ident.assumed}[/yellow]")
        if ident.alternatives:
            console.print(f"[dim]also fits: {readings_text(ident.alternatives)} (pick one with --api-key/--api-version)"
                          "[/dim]")
    if ident.suggestion:
        console.print(f"[yellow]{ident.suggestion}[/yellow]")
    header = ("offset", "bytes", "field", "type", "value")

    def cells(show: Callable[[Field, int | None], str | Pieces]) -> Iterator[tuple]:
        for r in message_rows(ident, data, limit, show):
            span = str(r.offset) if r.length <= 1 else f"{r.offset}-{r.offset + r.length - 1}"
            yield span, hex_of(data, r), r.path, r.type, r.value

    if console.is_terminal:
        for line in table_lines(header, [(*cell[:-1], str(cell[-1])) for cell in cells(show_value_in_pieces)]):
            console.print(line, soft_wrap=True)
    else:
        # the rows are made twice, to measure their columns and to write them, rather than held: there can be
        # hundreds of thousands
        write_table(console.file, header, cells(show_value_in_pieces), column_widths(header, cells(_no_value)))
    if m.malformed:
        console.print(f"[bold red]MALFORMED at offset {m.malformed.offset}: {m.malformed.reason}[/bold red]")
    if m.trailing:
        plural = "s" if m.trailing.length > 1 else ""
        console.print(f"[yellow]{m.trailing.length} trailing byte{plural} after the body at offset "
                      f"{m.trailing.offset}[/yellow]")
    if ident.following:
        console.print(f"[yellow]{ident.following}[/yellow]")


def field_json(f: Field) -> dict:
    node = {"name": f.name, "type": f.type, "offset": f.offset, "length": f.length,
            "value": json_value_in_pieces(f.value)}
    if f.note:
        node["note"] = f.note
    if f.children is not None:
        node["children"] = (field_json(c) for c in f.children)
    return node


def _hex_pieces(data: bytes, start: int, end: int) -> Iterator[str]:
    for at in range(start, end, PIECE):
        yield data[at:min(at + PIECE, end)].hex()


def write_explanation_json(out: TextIO, ident: Identification, data: bytes) -> None:
    """The explanation as one JSON document (json.dumps with indent=1), written as it is made."""
    m = ident.message
    spans = [(r.offset, r.length) for r in message_rows(ident, data, None, _no_value)]
    document = {
        "kind": m.kind, "api_key": m.api_key, "api_name": m.api_name, "api_version": m.api_version,
        "header_version": m.header_version, "correlation_id": m.correlation_id, "client_id": m.client_id,
        "size_prefix": ident.has_size_prefix, "size": m.size,
        "assumed": ident.assumed,
        "alternatives": readings_json(ident.alternatives),
        "suggestion": ident.suggestion,
        "following": ident.following,
        "malformed": m.malformed.to_json() if m.malformed else None,
        "trailing_bytes": m.trailing.length if m.trailing else 0,
        "unexplained": uncovered(spans, 0, len(data)),
        "rows": ({"offset": r.offset, "length": r.length,
                  "hex": Pieces(_hex_pieces(data, r.offset, r.offset + r.length)) if r.length > PIECE else
                  data[r.offset:r.offset + r.length].hex(),
                  "field": r.path, "type": r.type, "value": r.value}
                 for r in message_rows(ident, data, None, show_value_in_pieces)),
        "fields": (field_json(f) for f in m.fields()),
    }
    del spans  # not held while the rows are written
    write_json(out.write, document)
    out.write("\n")


def _no_value(f: Field, limit: int | None) -> str:
    return ""


_SCALARS = frozenset({str, int, float, bool, type(None)})


def write_json(write: Callable[[str], object], value, level: int = 0) -> None:
    """What json.dumps(value, indent=1) makes, written as it is made: lists may be iterators of their items, and
    strings Pieces."""
    if type(value) is Pieces:
        write('"')
        for piece in value.pieces:
            write(json_string(piece)[1:-1])
        write('"')
    elif isinstance(value, dict):
        if all(type(v) in _SCALARS for v in value.values()):  # a row, a leaf's value: made by json in C
            write(json.dumps(value, indent=1).replace("\n", "\n" + " " * level))
        else:
            _write_items(write, value.items(), level, "{", "}")
    elif isinstance(value, (list, tuple, Iterator)):
        _write_items(write, value, level, "[", "]")
    else:
        write(json.dumps(value))


def _write_items(write: Callable[[str], object], items, level: int, opening: str, closing: str) -> None:
    """A list's items, or a dict's (key, value) items, one per line indented one more than the container."""
    keyed = opening == "{"
    inner = "\n" + " " * (level + 1)
    empty = True
    for item in items:
        write((opening if empty else ",") + inner)
        empty = False
        if keyed:
            key, item = item
            write(json_string(key) + ": ")
        write_json(write, item, level + 1)
    write(opening + closing if empty else "\n" + " " * level + closing)
