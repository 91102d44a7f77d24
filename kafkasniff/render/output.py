"""Where events go: the chosen view (one line, JSON Lines, tree), filters and statistics.

Shared by decode and sniff: `emit` each event as it is decoded, `finish` at the end.
"""

from __future__ import annotations

import contextlib
import orjson
import os
import sys
from dataclasses import dataclass, field
from typing import TextIO

from kafkasniff.protocol.entities import entity_paths, topic_bearing_prefixes
from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.interpreter import TAGGED_FIELDS
from kafkasniff.protocol.messages import Message
from kafkasniff.protocol.records import records_of
from kafkasniff.render.jsonview import error_names, event_json
from kafkasniff.render.oneline import event_line
from kafkasniff.render.stats import Stats, print_stats
from kafkasniff.render.tree import TreeView
from kafkasniff.stream.session import MessageEvent

NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"


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
        # --stats counts the records produced and fetched per topic.
        return self.view != "line" or self.hex or self.stats

    @property
    def needs_fields(self) -> bool:
        """Whether anything shown needs decoded fields; the one-line view alone needs only a skim."""
        return self.view != "line" or self.hex or self.stats or bool(self.topics)

    @property
    def prints_events(self) -> bool:
        """--stats alone prints only the tables."""
        return not (self.stats and self.view == "line")


def client_id_of(ev: MessageEvent) -> str | None:
    if ev.message.kind == "request":
        return ev.message.client_id
    return ev.request.message.client_id if ev.request else None


class TopicNames:
    """Topic names a message mentions, with the records it carries for each.

    Newer versions of Fetch, Produce and others name topics by id only; ids are
    resolved with the (id, name) pairs that Metadata, CreateTopics and similar
    responses carry, learned as the capture goes by. Unresolved ids are listed
    as the id's text. Memory grows with the number of distinct topics only.
    """

    def __init__(self) -> None:
        self.by_id: dict[str, str] = {}

    def of(self, msg: Message) -> dict[str, int]:
        """{topic: records in this message for it}, in order of appearance."""
        found: dict[str, int] = {}
        if msg.body is not None and msg.api_key is not None:
            paths = frozenset(entity_paths(msg.api_key, msg.kind, msg.api_version, "topicName"))
            relevant = topic_bearing_prefixes(msg.api_key, msg.kind, msg.api_version)
            self._struct(msg.body, (), paths, relevant, None, found)
        return found

    def _struct(self, struct: Field, path: tuple, paths: frozenset, relevant: frozenset, topic: str | None,
                found: dict) -> None:
        members = list(_members(struct))
        name = topic_id = None
        for m in members:
            if path + (m.name,) in paths and m.children is None and isinstance(m.value, str):
                name = m.value
            elif m.name == "TopicId" and m.type == "uuid" and m.value != NO_TOPIC_ID:
                topic_id = m.value
        if name is not None and topic_id is not None:
            self.by_id[topic_id] = name
        elif topic_id is not None:
            name = self.by_id.get(topic_id, topic_id)
        if name is not None:
            topic = name
            found.setdefault(name, 0)
        for m in members:
            here = path + (m.name,)
            if here not in relevant:
                continue  # nothing below can name a topic or carry records
            if m.type == "records":
                if topic is not None:
                    found[topic] = found.get(topic, 0) + _record_count(m)
            elif m.children is None:
                continue
            elif m.type.startswith("[]"):
                items = m.children
                if items and items[0].children is not None:
                    for item in items:
                        self._struct(item, here, paths, relevant, topic, found)
                elif here in paths:
                    for item in items:
                        if isinstance(item.value, str):
                            found.setdefault(item.value, 0)
            else:
                self._struct(m, here, paths, relevant, topic, found)


def _members(struct: Field):
    """A struct's fields, tagged fields in line with the others."""
    for c in struct.children or ():
        if c.name == TAGGED_FIELDS:
            yield from c.children or ()
        else:
            yield c


def _record_count(records: Field) -> int:
    """Data records decoded from a records field (control records are markers, not data)."""
    return sum(len(records_of(item)) for item in records.children or ()
               if item.type in ("RecordBatch", "Message") and not item.value["is_control"])


class Output:
    def __init__(self, options: OutputOptions, out: TextIO | None = None):
        self.options = options
        self._out = out  # None: whatever sys.stdout is at the time (a progress bar may redirect it)
        self.shown = 0
        self.topic_names = TopicNames()
        self.stats = Stats() if options.stats else None
        self.tree = None
        if options.view == "tree" and options.prints_events:
            self.tree = TreeView(out, hex_=options.hex, show_secrets=options.show_secrets,
                                 full=options.full_values)

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    def event_topics(self, ev: MessageEvent) -> dict[str, int]:
        """Topics of the message (a response adds its request's) with records carried for each."""
        found = self.topic_names.of(ev.message)
        if ev.request is not None:
            for name in self.topic_names.of(ev.request.message):
                found.setdefault(name, 0)
        return found

    def wanted(self, ev, topics: dict[str, int] | None = None) -> bool:
        o = self.options
        if type(ev) is not MessageEvent:
            return not (o.apis or o.topics or o.client_ids or o.errors_only) and (
                not o.streams or (ev.conn is not None and ev.conn.stream in o.streams))
        m = ev.message
        if o.streams and ev.conn.stream not in o.streams:
            return False
        if o.apis and (m.api_name or "").lower() not in o.apis and str(m.api_key) not in o.apis:
            return False
        if o.client_ids and client_id_of(ev) not in o.client_ids:
            return False
        if o.topics:
            if topics is None:
                topics = self.event_topics(ev)
            if not o.topics.intersection(topics):
                return False
        if o.errors_only and not (error_names(m) or m.malformed):
            return False
        return True

    def emit(self, ev) -> None:
        o = self.options
        topics = None
        if type(ev) is MessageEvent and (o.topics or o.stats or o.view == "json"):
            topics = self.event_topics(ev)
        if not self.wanted(ev, topics):
            return
        self.shown += 1
        if self.stats is not None:
            self.stats.observe(ev, topics)
        if not o.prints_events:
            return
        if self.tree is not None:
            self.tree.show(ev)
        elif o.view == "json":
            self.out.write(orjson.dumps(event_json(ev, o.show_secrets, topics)).decode() + "\n")
        else:
            self.out.write(event_line(ev, o.show_secrets) + "\n")

    def finish(self) -> None:
        if self.stats is not None:
            if self.options.view == "json":
                self.out.write(orjson.dumps(self.stats.to_json()).decode() + "\n")
            else:
                print_stats(self.stats, self.out)
        self.out.flush()


def stdout_gone() -> None:
    """The reader of stdout went away (`| head`): point stdout at /dev/null so exiting is quiet."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
