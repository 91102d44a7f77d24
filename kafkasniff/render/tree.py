"""`-V` and `--hex`: each event as a field tree, or as a table of byte ranges, printed as soon as it is
decoded.

The tree shows header, body and records (batches, then each record's offset, timestamp, key, value
and headers), error-code names, CRC verdicts and codecs. `--hex` lists every byte range of the frame
with the same rows as `explain` (render/bytemap.py). Offsets count from the start of the frame's
4-byte size prefix. SASL secrets are masked, bytes included, unless `show_secrets`.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from kafkasniff.protocol.fields import TAGGED_FIELDS, Field, Malformed
from kafkasniff.protocol.identify import Identification
from kafkasniff.protocol.messages import Message, with_fields
from kafkasniff.protocol.records import DECOMPRESSED_NOTE
from kafkasniff.protocol.sasl import SECRET, TOKEN
from kafkasniff.protocol.schema import api_name, apis
from kafkasniff.render.bytemap import DETACHED_TYPES, Row, rows
from kafkasniff.render.explain import message_rows
from kafkasniff.render.jsonview import FRAME_PREFIX, MASK, token_reader
from kafkasniff.render.oneline import message_line, notice_line, sasl_line
from kafkasniff.render.values import DEFAULT_MAX_VALUE, show_bytes, show_value
from kafkasniff.stream.session import MessageEvent, SaslTokenEvent

HEX_SHOWN = 8  # bytes per row shown unless --full
# Records of one message made into Fields for this view; past it they are counted in one line (memory).
RECORDS_SHOWN = 10_000
_ITEM_TYPES = frozenset({"RecordBatch", "Message", "PartialBatch", "Malformed", "RecordsNotShown"})
_SECRET_BYTE = "••"


def frame_rows(msg: Message, payload, limit: int | None) -> list[Row]:
    """Byte-map rows of one frame: the size prefix, then header, body and anything after, at frame offsets."""
    payload_rows = message_rows(Identification(msg, False), payload, limit)
    return [Row(0, FRAME_PREFIX, "size", "int32", str(len(payload)))] + [
        r._replace(offset=r.offset + FRAME_PREFIX) for r in payload_rows]


def token_rows(ev: SaslTokenEvent, limit: int | None) -> list[Row]:
    """Byte-map rows of a raw SASL token frame."""
    token = Field("token", TOKEN if ev.fields else "bytes", 0, len(ev.token), ev.token, ev.fields)
    return [Row(0, FRAME_PREFIX, "size", "int32", str(len(ev.token)))] + [
        r._replace(offset=r.offset + FRAME_PREFIX) for r in rows(token, "", limit)]


def timestamp_text(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "no timestamp"
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    except (OverflowError, OSError, ValueError):
        return str(ms)


class Node:
    """A tree of labels, drawn with guide lines; lighter than rich.tree for thousands of fields."""

    __slots__ = ("label", "children")

    def __init__(self, label: Text):
        self.label = label
        self.children: list[Node] = []

    def add(self, label: Text) -> Node:
        child = Node(label)
        self.children.append(child)
        return child

    def lines(self) -> list[Text]:
        out = [self.label]
        self._draw("", out)
        return out

    def _draw(self, prefix: str, out: list[Text]) -> None:
        last = len(self.children) - 1
        for i, child in enumerate(self.children):
            line = Text()
            line.append(prefix + ("└── " if i == last else "├── "), style="dim")
            line.append_text(child.label)
            out.append(line)
            child._draw(prefix + ("    " if i == last else "│   "), out)


def table_lines(header: tuple[str, ...], cells: list[tuple]) -> list[Text]:
    """Aligned columns, two spaces apart; the last column unpadded. Cells are str or Text."""
    widths = [max(cell_len(h), *(cell_len(c[i]) for c in cells)) for i, h in enumerate(header[:-1])]
    out = []
    for row, style in [(header, "bold")] + [(c, "") for c in cells]:
        line = Text(style=style)
        for cell, width in zip(row, widths):
            line.append(cell)
            line.append(" " * (width - cell_len(cell) + 2))
        line.append(row[-1])
        out.append(line)
    return out


class TreeView:
    def __init__(self, out: TextIO | None = None, *, hex_: bool = False, show_secrets: bool = False,
                 full: bool = False):
        self._out = out
        stream = out or sys.stdout
        # Into a file or pipe: plain text, written directly. On a terminal: colours, through rich;
        # file=None follows sys.stdout, which a progress bar on the same terminal redirects.
        self.console = Console(file=out, highlight=False) if stream.isatty() else None
        self.hex = hex_
        self.show_secrets = show_secrets
        self.full = full
        self.limit = None if full else DEFAULT_MAX_VALUE

    def show(self, ev, topics: dict[str, list] | None = None) -> None:
        text = self.render(ev, topics)
        if self.console is None:
            (self._out or sys.stdout).write(text.plain + "\n")
        else:
            self.console.print(text, soft_wrap=True)

    def render(self, ev, topics: dict[str, list] | None = None) -> Text:
        """One event (`topics`: its topics as Output resolves them, for the headline); a message's Field trees
        are made for it and let go after."""
        if type(ev) is MessageEvent:
            m = ev.message
            with_fields(m, ev.payload, token_reader(m, self.show_secrets), RECORDS_SHOWN)
            try:
                lines = self._message(ev, ev.payload, topics)
            finally:
                m.header = m.body = None  # a pending request must not keep its tree
        elif type(ev) is SaslTokenEvent:
            lines = self._sasl(ev)
        else:
            lines = [Text(notice_line(ev), style="yellow")]
        return Text("\n").join(lines)

    # -- messages -------------------------------------------------------------------------------

    def _message(self, ev: MessageEvent, payload: bytes, topics: dict[str, list] | None) -> list[Text]:
        m = ev.message
        headline = Text(message_line(ev, topics), style="bold")
        if self.hex:
            frame = len(payload).to_bytes(4, "big") + payload
            parts = [headline, *self._hex_table(frame_rows(m, payload, self.limit), frame)]
        else:
            tree = Node(headline)
            if m.header is not None:
                header = tree.add(self._label("header", f"{m.header.type} v{m.header_version}"))
                self._members(header, m.header)
            if m.body is not None:
                self._members(tree.add(self._label("body", m.body.type)), m.body)
            parts = tree.lines()
        if m.malformed:
            parts.append(Text(f"MALFORMED at byte {m.malformed.offset + FRAME_PREFIX}: {m.malformed.reason}",
                              style="bold red"))
        if m.trailing:
            t = m.trailing
            parts.append(Text(f"{t.length} trailing bytes after the body, bytes {t.offset + FRAME_PREFIX}-"
                              f"{t.end + FRAME_PREFIX - 1}: {show_bytes(t.value, self.limit)}", style="yellow"))
        return parts

    def _label(self, name: str, type_: str, value: str | None = None, style: str = "") -> Text:
        text = Text()
        text.append(name, style="bold")
        if value is not None:
            text.append(": ")
            text.append(value, style=style)
        text.append(f"  {type_}", style="dim")
        return text

    def _members(self, node: Node, struct: Field) -> None:
        for c in struct.children or ():
            if c.name == TAGGED_FIELDS:
                for tagged in c.children or ():
                    self._field(node, tagged)
            else:
                self._field(node, c)

    def _field(self, node: Node, f: Field) -> None:
        if f.type == "records" and f.children is not None:
            self._records(node, f)
        elif f.type == SECRET:
            node.add(self._label(f.name, f.type, show_value(f, self.limit) if self.show_secrets else MASK, "magenta"))
        elif f.type == TOKEN:
            self._members(node.add(self._label(f.name, "SASL token", f"{len(f.value)} bytes")), f)
        elif f.children is None or (f.children and f.children[0].type == "bits"):
            style = "red" if f.role == "errorCode" and f.value else ""
            node.add(self._label(f.name, f.type, self._value(f), style))
        elif f.type.startswith("[]"):
            branch = node.add(self._label(f.name, f.type, f"{len(f.children)} items"))
            for item in f.children:
                if item.children is None:
                    branch.add(self._label(item.name, item.type, self._value(item)))
                else:
                    self._members(branch.add(Text(item.name, style="bold")), item)
        else:
            self._members(node.add(self._label(f.name, f.type)), f)

    def _value(self, f: Field) -> str:
        if f.children and f.children[0].type == "bits":
            return f"{f.value} (" + ", ".join(f"{c.name}={c.note or c.value}" for c in f.children) + ")"
        if f.role == "apiKey" and f.value in apis():
            return f"{f.value} ({api_name(f.value)})"
        return show_value(f, self.limit)

    # -- records --------------------------------------------------------------------------------

    def _records(self, node: Node, f: Field) -> None:
        items = [i for i in f.children if i.type in _ITEM_TYPES]
        kind = "legacy message" if items and items[0].type == "Message" else "record batch"
        count = f"{len(items)} {kind}" + ("" if len(items) == 1 else "es" if kind.endswith("h") else "s")
        branch = node.add(self._label(f.name, f.type, f"{count} in {f.length:,} bytes"))
        for item in items:
            self._item(branch, item, FRAME_PREFIX)

    def _item(self, node: Node, item: Field, shift: int) -> None:
        if item.type == "Malformed":
            node.add(self._malformed(item.value, shift))
            return
        if item.type == "RecordsNotShown":
            node.add(Text(item.note, style="yellow"))
            return
        if item.type == "PartialBatch":
            branch = node.add(Text(item.note, style="yellow"))
            for c in item.children:
                self._field(branch, c)
            return
        v = item.value
        crc = Text("CRC valid", style="green") if v["crc_valid"] else Text(
            f"CRC INVALID (computed 0x{v['crc_computed']:08X})", style="bold red")
        facts = [f"codec {v['codec']}"]
        if item.type == "RecordBatch":
            facts += [f"{v['record_count']} records", f"base offset {v['base_offset']}"]
            if v["producer_id"] != -1:
                facts.append(f"producer id {v['producer_id']}")
            facts += [flag for flag in ("transactional", "control") if v[f"is_{flag}"]]
            title = Text.assemble(("record batch", "bold"), f" (magic {v['magic']}): {', '.join(facts)}, ", crc)
        else:
            facts += [f"offset {v['offset']}", f"timestamp {timestamp_text(v['timestamp'])}"]
            title = Text.assemble(("message", "bold"), f" (magic {v['magic']}): {', '.join(facts)}, ", crc)
        branch = node.add(title)
        for c in item.children:
            if c.name in ("records", "messages"):
                self._inner(branch, c, shift)
            else:
                self._field(branch, c)

    def _inner(self, node: Node, inner: Field, shift: int) -> None:
        """The records of a batch, or the messages inside a compressed wrapper message."""
        if inner.type in DETACHED_TYPES:
            shift = 0
            problem = inner.note != DECOMPRESSED_NOTE  # failed, refused, or a record count that differs
            size = f"{len(inner.value):,} bytes decompressed" if inner.value is not None else "not decompressed"
            branch = node.add(Text(f"{inner.name}: {size} ({inner.note})", style="bold red" if problem else ""))
        else:
            branch = node.add(self._label(inner.name, inner.type, inner.note))
        for r in inner.children:
            if r.type == "Record":
                self._record(branch, r)
            else:
                self._item(branch, r, shift)

    def _record(self, node: Node, r: Field) -> None:
        v = r.value
        key = r["key"]
        if key.type == "ControlRecordKey":
            title = Text.assemble(("control record ", "bold"), (key["Type"].note, "bold cyan"),
                                  f" offset {v['offset']}, timestamp {timestamp_text(v['timestamp'])}")
        else:
            title = Text.assemble(("record", "bold"),
                                  f" offset {v['offset']}, timestamp {timestamp_text(v['timestamp'])}")
        branch = node.add(title)
        for name in ("key", "value"):
            f = r[name]
            if f.children is not None:  # control record key and value
                self._field(branch, f)
            else:
                branch.add(self._label(name, f.type, "null" if v[name] is None else show_bytes(v[name], self.limit)))
        for k, value in v["headers"]:
            branch.add(Text.assemble(("header ", "bold"), k, ": ",
                                     "null" if value is None else show_bytes(value, self.limit)))

    def _malformed(self, m: Malformed, shift: int) -> Text:
        where = "byte" if shift else "decompressed byte"
        return Text(f"MALFORMED at {where} {m.offset + shift}: {m.reason}", style="bold red")

    # -- SASL -----------------------------------------------------------------------------------

    def _sasl(self, ev: SaslTokenEvent) -> list[Text]:
        headline = Text(sasl_line(ev, self.show_secrets), style="bold")
        if self.hex:
            frame = len(ev.token).to_bytes(4, "big") + ev.token
            return [headline, *self._hex_table(token_rows(ev, self.limit), frame)]
        tree = Node(headline)
        for f in ev.fields or ():
            self._field(tree, f)
        return tree.lines()

    # -- byte table -----------------------------------------------------------------------------

    def _hex_table(self, all_rows: list[Row], frame: bytes | None) -> list[Text]:
        header = ("offset", "bytes", "field", "type", "value") if frame is not None else (
            "offset", "field", "type", "value")
        cells = []
        for r in all_rows:
            masked = r.type == SECRET and not self.show_secrets
            span = str(r.offset) if r.length <= 1 else f"{r.offset}-{r.offset + r.length - 1}"
            value = MASK if masked else "length prefix or token syntax" if r.type == TOKEN else r.value
            row = [span, r.path, r.type, Text(value, style="magenta") if r.type == SECRET else value]
            if frame is not None:
                row.insert(1, self._hex(frame, r, masked))
            cells.append(row)
        return table_lines(header, cells)

    def _hex(self, frame: bytes, r: Row, masked: bool) -> str:
        shown = r.length if self.full else min(r.length, HEX_SHOWN)
        text = " ".join([_SECRET_BYTE] * shown) if masked else frame[r.offset:r.offset + shown].hex(" ")
        return text + (" …" if shown < r.length else "")
