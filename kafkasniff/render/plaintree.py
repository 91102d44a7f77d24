"""`-V` into a file or a pipe: each message's tree as plain text, written as it is made (a Fetch can hold millions
of records), without rich: importing it took a fifth of a small capture's decode. On a terminal, and with --hex,
render/tree.py draws the same rows with styles.
"""

from __future__ import annotations

import sys
from typing import TextIO

from kafkasniff.protocol.messages import Message, tree_text
from kafkasniff.render.jsonview import token_reader
from kafkasniff.render.oneline import message_row, notice_line
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
            self._write_message(ev, topics, out)
        elif type(ev) is SaslTokenEvent:
            if self._sasl_tree is None:
                from kafkasniff.render.tree import TreeView

                self._sasl_tree = TreeView(out, show_secrets=self.show_secrets, full=self.full)
            out.write(self._sasl_tree.render(ev).plain + "\n")
        else:
            out.write(notice_line(ev) + "\n")

    def _write_message(self, ev: MessageEvent, topics: dict[str, list] | None, out: TextIO) -> None:
        m = ev.message
        binary = getattr(out, "buffer", None)
        if binary is None:
            def write(text, spans) -> None:  # bytes, or a view of the walker's buffer valid during the call
                out.write(str(text, "utf-8"))
        else:
            out.flush()

            def write(text, spans) -> None:
                binary.write(text)
        write(message_row(ev, topics), None)
        rest, _ = tree_text(m, ev.payload, self.limit, self.show_secrets, False, token_reader(m, self.show_secrets),
                            self.topic_names, write)
        tail = "".join(text + "\n" for text, _style in after_body(m, self.limit))
        write(rest + tail.encode(), None)
