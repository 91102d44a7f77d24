"""`-V` on a terminal, and `--hex`: each event as a field tree, or as a table of byte ranges, printed as
soon as it is decoded (into a file or pipe, `-V` alone is render/plaintree.py's).

The tree shows header, body and records (batches, then each record's offset, timestamp, key, value
and headers), error-code names, CRC verdicts and codecs. `--hex` lists every byte range of the frame
with the same rows as `explain` (render/bytemap.pyx). Offsets count from the start of the frame's
4-byte size prefix. SASL secrets are masked, bytes included, unless `show_secrets`.
"""

from __future__ import annotations

import sys
from array import array
from typing import TextIO

from rich.console import Console
from rich.text import Text

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.messages import Message, tree_text, with_fields
from kafkasniff.protocol.sasl import SECRET, TOKEN
from kafkasniff.render.bytemap import TABLE_HEADER, byte_cells, write_byte_table
from kafkasniff.render.jsonview import MASK, token_reader
from kafkasniff.render.oneline import message_line, notice_line, sasl_line
from kafkasniff.render.plaintree import after_body, bytes_writer
from kafkasniff.render.tables import table_lines
from kafkasniff.render.values import DEFAULT_MAX_VALUE, FRAME_PREFIX, show_value
from kafkasniff.stream.session import MessageEvent, SaslTokenEvent

# Records of one message made into Fields for this view; past it they are counted in one line (memory).
RECORDS_SHOWN = 10_000
_ITEM_TYPES = frozenset({"RecordBatch", "Message", "PartialBatch", "Malformed", "RecordsNotShown"})


# walk.h's text styles, by number
_STYLES = (None, "bold", "dim", "red", "bold red", "green", "yellow", "magenta", "bold cyan")


def _styled(text: bytes, spans: bytes) -> Text:
    """Text from the text builder, with its spans (int32 triples: start and end in bytes, style)."""
    styled = Text(text.decode())
    if spans:
        words = array("i", spans)
        at = _char_offsets(text)
        for i in range(0, len(words), 3):
            styled.stylize(_STYLES[words[i + 2]], at[words[i]], at[words[i + 1]])
    return styled


def _char_offsets(text: bytes) -> list[int]:
    """Spans count bytes, rich counts characters: the character offset of every byte offset (and the end)."""
    offsets, chars = [], 0
    for b in text:
        offsets.append(chars)
        chars += b & 0xC0 != 0x80  # a byte that starts a character
    offsets.append(chars)
    return offsets


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


class TreeView:
    def __init__(self, out: TextIO | None = None, *, hex_: bool = False, show_secrets: bool = False,
                 full: bool = False, topic_names: dict[str, str] | None = None):
        self._out = out
        self.topic_names = topic_names  # topic id -> name, learned as the capture goes by
        stream = out or sys.stdout
        # On a terminal: colours, through rich; file=None follows sys.stdout, which a progress bar on the same
        # terminal redirects. Into a file or pipe: plain text (the tree without --hex: render/plaintree.py).
        self.console = Console(file=out, highlight=False) if stream.isatty() else None
        self.hex = hex_
        self.show_secrets = show_secrets
        self.full = full
        self.limit = None if full else DEFAULT_MAX_VALUE

    def show(self, ev, topics: dict[str, list] | None = None) -> None:
        if self.console is None and self.hex and type(ev) is MessageEvent:  # into a file or pipe: as it is made
            self._write_hex_message(ev, topics, bytes_writer(self._out or sys.stdout))
            return
        text = self.render(ev, topics)
        if self.console is None:
            (self._out or sys.stdout).write(text.plain + "\n")
        else:
            self.console.print(text, soft_wrap=True)

    def render(self, ev, topics: dict[str, list] | None = None) -> Text:
        """One event (`topics`: its topics as Output resolves them, for the headline), styled."""
        if type(ev) is MessageEvent:
            lines = self._message(ev, topics)
        elif type(ev) is SaslTokenEvent:
            lines = self._sasl(ev)
        else:
            lines = [Text(notice_line(ev), style="yellow")]
        return Text("\n").join(lines)

    # -- messages -------------------------------------------------------------------------------

    def _message(self, ev: MessageEvent, topics: dict[str, list] | None) -> list[Text]:
        m, payload = ev.message, ev.payload
        headline = Text(message_line(ev, topics), style="bold")
        if self.hex:
            table = self._with_fields(m, payload, lambda fields: self._table_lines(fields, payload))
            parts = [headline, *self._tls_origin(ev), *table]
        else:
            text, spans = tree_text(m, payload, self.limit, self.show_secrets, True, token_reader(m, self.show_secrets),
                                    self.topic_names)
            parts = [headline]
            if text:
                parts.append(_styled(text[:-1], spans))
        return parts + self._after_body(m)

    # -- --hex into a file or pipe on parallel workers (Output.render), as render/plaintree.py's PlainTree does -V --

    def write_message(self, ev: MessageEvent, topics, topic_names, write) -> None:
        """The message's byte table, handed to write(bytes) in pieces; `topics` as Output gives it (in a
        worker, TOPICS_SLOT, for the parent to fill: name_marks). No topic id in the table is named, so
        `topic_names` is not needed."""
        self._write_hex_message(ev, topics, write)

    def event_text(self, ev) -> str:
        """What is not a message, as show() writes it."""
        return self.render(ev).plain + "\n"

    def _write_hex_message(self, ev: MessageEvent, topics: dict[str, list] | None, write) -> None:
        """The message's byte table as plain text, handed to write(bytes) as it is made."""
        m, payload = ev.message, ev.payload
        head = [message_line(ev, topics), *(line.plain for line in self._tls_origin(ev))]
        write("".join(text + "\n" for text in head).encode())
        self._with_fields(m, payload, lambda fields: write_byte_table(
            *self._frame(fields, payload), self.limit, self.full, self.show_secrets, write))
        tail = "".join(line.plain + "\n" for line in self._after_body(m))
        if tail:
            write(tail.encode())

    def _with_fields(self, m: Message, payload, use):
        """use(the message's header, body and trailing Fields), the tree made for the call only: a pending
        request must not keep it."""
        with_fields(m, payload, token_reader(m, self.show_secrets), RECORDS_SHOWN)
        try:
            return use(list(m.fields()))
        finally:
            m.header = m.body = None

    @staticmethod
    def _tls_origin(ev: MessageEvent) -> list[Text]:
        """Bytes decrypted from TLS are not the captured bytes: say where the offsets count from."""
        tls = ev.conn.tls
        if tls is None:
            return []
        return [Text(f"decrypted from TLS {tls['version']} ({tls['cipher']}): the frame starts at byte "
                     f"{ev.stream_offset:,} of the decrypted {ev.direction} stream; offsets below are within the frame",
                     style="dim")]

    def _after_body(self, m: Message) -> list[Text]:
        return [Text(text, style=style) for text, style in after_body(m, self.limit)]

    def _label(self, name: str, type_: str, value: str | None = None, style: str = "") -> Text:
        text = Text()
        text.append(name, style="bold")
        if value is not None:
            text.append(": ")
            text.append(value, style=style)
        text.append(f"  {type_}", style="dim")
        return text

    # -- SASL -----------------------------------------------------------------------------------

    def _sasl(self, ev: SaslTokenEvent) -> list[Text]:
        headline = Text(sasl_line(ev, self.show_secrets), style="bold")
        if self.hex:
            token = Field("token", TOKEN if ev.fields else "bytes", 0, len(ev.token), ev.token, ev.fields)
            return [headline, *self._table_lines([token], ev.token)]
        tree = Node(headline)
        for f in ev.fields or ():  # the token's parts: strings, and secrets
            secret = f.type == SECRET
            shown = show_value(f, self.limit) if self.show_secrets or not secret else MASK
            tree.add(self._label(f.name, f.type, shown, "magenta" if secret else ""))
        return tree.lines()

    # -- byte table -----------------------------------------------------------------------------

    @staticmethod
    def _frame(fields: list[Field], payload) -> tuple:
        """What the byte table of a frame is made from (write_byte_table's first arguments): its fields, its end
        and size, where its payload starts, the size prefix's bytes and the payload."""
        return fields, FRAME_PREFIX + len(payload), str(len(payload)), FRAME_PREFIX, \
            len(payload).to_bytes(FRAME_PREFIX, "big"), payload

    def _table_lines(self, fields: list[Field], payload) -> list[Text]:
        """The byte table, styled: the header bold, secrets' values magenta."""
        cells = [(span, hex_, path, type_, Text(value, style="magenta") if secret else value) for
                 span, hex_, path, type_, value, secret in
                 byte_cells(*self._frame(fields, payload), self.limit, self.full, self.show_secrets)]
        return list(table_lines(TABLE_HEADER, cells))
