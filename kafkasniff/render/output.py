"""Where events go: the chosen view (one line, JSON Lines), with filters. Shared by decode and sniff."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import TextIO

from kafkasniff.protocol.entities import topics
from kafkasniff.render.jsonview import error_names, event_json
from kafkasniff.render.oneline import event_line
from kafkasniff.stream.session import MessageEvent


@dataclass
class OutputOptions:
    view: str = "line"                # line | json | tree
    hex: bool = False
    show_secrets: bool = False
    full_values: bool = False
    apis: frozenset = frozenset()     # API names (lower case) or keys as strings
    topics: frozenset = frozenset()
    client_ids: frozenset = frozenset()
    streams: frozenset = frozenset()
    errors_only: bool = False
    stats: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def needs_records(self) -> bool:
        return self.view != "line" or self.hex


def _client_id(ev: MessageEvent) -> str | None:
    if ev.message.kind == "request":
        return ev.message.client_id
    return ev.request.message.client_id if ev.request else None


class Output:
    def __init__(self, options: OutputOptions, out: TextIO | None = None):
        self.options = options
        self.out = out or sys.stdout
        self.shown = 0

    def wanted(self, ev) -> bool:
        o = self.options
        if type(ev) is not MessageEvent:
            return not (o.apis or o.topics or o.client_ids or o.errors_only) and (
                not o.streams or (ev.conn is not None and ev.conn.stream in o.streams))
        m = ev.message
        if o.streams and ev.conn.stream not in o.streams:
            return False
        if o.apis and (m.api_name or "").lower() not in o.apis and str(m.api_key) not in o.apis:
            return False
        if o.client_ids and _client_id(ev) not in o.client_ids:
            return False
        if o.topics:
            found = set(topics(m))
            if ev.request is not None:
                found |= set(topics(ev.request.message))
            if not found & o.topics:
                return False
        if o.errors_only and not (error_names(m) or m.malformed):
            return False
        return True

    def emit(self, ev) -> None:
        if not self.wanted(ev):
            return
        self.shown += 1
        if self.options.view == "json":
            self.out.write(json.dumps(event_json(ev, self.options.show_secrets), ensure_ascii=False) + "\n")
        else:
            self.out.write(event_line(ev, self.options.show_secrets) + "\n")

    def finish(self) -> None:
        self.out.flush()
