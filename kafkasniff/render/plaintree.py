"""`-V` into a file or a pipe: each message's tree as plain text, written as it is made (a Fetch can hold millions
of records), without rich: importing it took a fifth of a small capture's decode. On a terminal, and with --hex,
render/tree.py draws the same rows with styles.
"""

from __future__ import annotations

import io
import re
import sys
from typing import TextIO

from kafkasniff.protocol.messages import Message, tree_text
from kafkasniff.protocol.topics import topic_text
from kafkasniff.render.jsonview import token_reader
from kafkasniff.render.oneline import TOPICS_SLOT, message_row, notice_line, topics_row
from kafkasniff.render.values import DEFAULT_MAX_VALUE, FRAME_PREFIX, show_bytes
from kafkasniff.stream.session import MessageEvent, SaslTokenEvent


def after_body(m: Message, limit: int | None) -> list[tuple[str, str]]:
    """The lines after a message's fields, (text, style) each: where it is malformed, and its trailing bytes."""
    parts = []
    if m.malformed:
        parts.append((f"MALFORMED at byte {m.malformed.offset + FRAME_PREFIX}: {m.malformed.reason}", "bold red"))
    if m.trailing:
        t = m.trailing
        parts.append((f"{t.length} trailing bytes after the body, bytes {t.offset + FRAME_PREFIX}-"
                      f"{t.end + FRAME_PREFIX - 1}: {show_bytes(t.value, limit)}", "yellow"))
    return parts


def bytes_writer(out: TextIO):
    """A function writing UTF-8 bytes (or a view valid during the call) to a text file: to the file's binary
    buffer once what the file holds is flushed, or decoded where it has none."""
    binary = getattr(out, "buffer", None)
    if binary is None:
        return lambda data: out.write(str(data, "utf-8"))
    out.flush()
    return binary.write


class PlainTree:
    """The tree view of events into a file or pipe (`out`, or whatever sys.stdout is at the time)."""

    def __init__(self, out: TextIO | None = None, *, show_secrets: bool = False, full: bool = False,
                 topic_names: dict[str, str] | None = None):
        self._out = out
        self.show_secrets = show_secrets
        self.full = full
        self.limit = None if full else DEFAULT_MAX_VALUE
        self.topic_names = topic_names  # topic id -> name, learned as the capture goes by
        self._sasl_tree = None  # render.tree's, for SASL tokens (rare: rich is imported then)

    def show(self, ev, topics: dict[str, list] | None = None) -> None:
        out = self._out or sys.stdout
        if type(ev) is MessageEvent:
            self.write_message(ev, topics, self.topic_names, bytes_writer(out))
        else:
            out.write(self.event_text(ev))

    def write_message(self, ev: MessageEvent, topics, topic_names, write) -> None:
        """The message's tree, handed to write(bytes, or a view valid during the call) as it is made. `topics`,
        `topic_names`: as Output resolves them (or, in a parallel worker, TOPICS_SLOT and MARK_TOPIC_IDS)."""
        m = ev.message
        write(message_row(ev, topics))
        rest, _ = tree_text(m, ev.payload, self.limit, self.show_secrets, False, token_reader(m, self.show_secrets),
                            topic_names, lambda text, spans: write(text))
        tail = "".join(text + "\n" for text, _style in after_body(m, self.limit))
        write(rest + tail.encode())

    def event_text(self, ev) -> str:
        """What is not a message: a notice's line, or a raw SASL token's tree (render.tree's: rich then)."""
        if type(ev) is SaslTokenEvent:
            if self._sasl_tree is None:
                from kafkasniff.render.tree import TreeView

                self._sasl_tree = TreeView(io.StringIO(), show_secrets=self.show_secrets, full=self.full)
            return self._sasl_tree.render(ev).plain + "\n"
        return notice_line(ev) + "\n"


def name_marks(text: bytes, topics: dict, names: dict) -> bytes:
    """A parallel worker's text of a message with what it left to the parent named: the headline's topics
    (TOPICS_SLOT) and each topic id the tree would name (MARK_TOPIC_IDS: NUL id NUL), with the names the capture
    has given so far (`names`: topic id -> name), or nothing where it has not. Values never hold a NUL: the
    tree shows them escaped."""
    at = text.find(b"\0")
    if at < 0:
        return text
    pieces, start = [], 0
    with memoryview(text) as view:  # the text between marks is copied once, by join
        while at >= 0:
            end = text.find(b"\0", at + 1)
            key = text[at + 1:end] if end > at else b""
            if key == _SLOT_KEY:
                named = topics_row(topics)
            elif _TOPIC_ID_MARK.fullmatch(key):
                name = names.get(key.decode())
                named = b"" if name is None else f" ({topic_text(name)})".encode()
            else:  # not a mark (no text of a message holds a NUL: its values and names are escaped)
                at = text.find(b"\0", at + 1)
                continue
            pieces += (view[start:at], named)
            start = end + 1
            at = text.find(b"\0", start)
        pieces.append(view[start:])
        return b"".join(pieces)


_SLOT_KEY = TOPICS_SLOT.strip("\0").encode()
_TOPIC_ID_MARK = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
