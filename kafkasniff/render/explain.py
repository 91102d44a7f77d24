"""`kafkasniff explain` output: a byte-by-byte table (rich) or the same tree as JSON."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.identify import Identification
from kafkasniff.render.bytemap import Row, rows, uncovered
from kafkasniff.render.values import json_value

HEX_SHOWN = 8


def message_rows(ident: Identification, data: bytes, limit: int | None) -> list[Row]:
    out = []
    if ident.has_size_prefix:
        out.append(Row(0, 4, "size", "int32", str(len(data) - 4)))
    for f in ident.message.fields():
        out.extend(rows(f, "", limit))
    covered_to = max((r.offset + r.length for r in out), default=0)
    if covered_to < len(data):
        # Bytes after the point where decoding stopped (malformed frames).
        out.append(Row(covered_to, len(data) - covered_to, "_undecoded", "bytes", "not decoded"))
    return out


def hex_of(data: bytes, r: Row) -> str:
    chunk = data[r.offset:r.offset + min(r.length, HEX_SHOWN)]
    return chunk.hex(" ") + (" …" if r.length > HEX_SHOWN else "")


def headline(ident: Identification, data: bytes) -> str:
    m = ident.message
    parts = [f"{m.api_name or '?'} v{m.api_version} {m.kind}"]
    if m.header_version is not None:
        parts.append(f"header v{m.header_version}")
    if m.correlation_id is not None:
        parts.append(f"correlation id {m.correlation_id}")
    if m.kind == "request" and m.header_version:
        parts.append(f"client id {m.client_id!r}")
    prefix = " + 4-byte size prefix" if ident.has_size_prefix else ""
    parts.append(f"{m.size} bytes{prefix}")
    return " · ".join(parts)


def print_explanation(console: Console, ident: Identification, data: bytes, limit: int | None) -> None:
    m = ident.message
    console.print(f"[bold]{headline(ident, data)}[/bold]")
    if ident.assumed:
        console.print(f"[yellow]{ident.assumed}[/yellow]")
        if ident.alternatives:
            shown = ", ".join(f"{n} v{v}" for n, v in ident.alternatives[:12])
            more = f" and {len(ident.alternatives) - 12} more" if len(ident.alternatives) > 12 else ""
            console.print(f"[dim]also fits: {shown}{more} (pick one with --api-key/--api-version)[/dim]")
    if ident.suggestion:
        console.print(f"[yellow]{ident.suggestion}[/yellow]")
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("offset", "bytes", "field", "type"):
        table.add_column(col, no_wrap=True)
    table.add_column("value", overflow="fold", min_width=20)
    for r in message_rows(ident, data, limit):
        span = str(r.offset) if r.length <= 1 else f"{r.offset}-{r.offset + r.length - 1}"
        table.add_row(span, hex_of(data, r), r.path, r.type, r.value)
    console.print(table)
    if m.malformed:
        console.print(f"[bold red]MALFORMED at offset {m.malformed.offset}: {m.malformed.reason}[/bold red]")
    if m.trailing:
        console.print(f"[yellow]{m.trailing.length} trailing bytes after the body at offset "
                      f"{m.trailing.offset}[/yellow]")


def field_json(f: Field) -> dict:
    node = {"name": f.name, "type": f.type, "offset": f.offset, "length": f.length,
            "value": json_value(f.value)}
    if f.note:
        node["note"] = f.note
    if f.children is not None:
        node["children"] = [field_json(c) for c in f.children]
    return node


def explanation_json(ident: Identification, data: bytes) -> dict:
    m = ident.message
    all_rows = message_rows(ident, data, None)
    return {
        "kind": m.kind, "api_key": m.api_key, "api_name": m.api_name, "api_version": m.api_version,
        "header_version": m.header_version, "correlation_id": m.correlation_id, "client_id": m.client_id,
        "size_prefix": ident.has_size_prefix, "size": m.size,
        "assumed": ident.assumed,
        "alternatives": [{"api_name": n, "api_version": v} for n, v in ident.alternatives],
        "suggestion": ident.suggestion,
        "malformed": m.malformed.to_json() if m.malformed else None,
        "trailing_bytes": m.trailing.length if m.trailing else 0,
        "unexplained": uncovered(all_rows, 0, len(data)),
        "rows": [{"offset": r.offset, "length": r.length, "hex": data[r.offset:r.offset + r.length].hex(),
                  "field": r.path, "type": r.type, "value": r.value} for r in all_rows],
        "fields": [field_json(f) for f in m.fields()],
    }
