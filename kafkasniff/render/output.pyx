# cython: language_level=3, boundscheck=False, wraparound=False
"""Where events go: the chosen view (one line, JSON Lines, tree), filters and statistics.

Shared by decode and sniff: `emit` each event as it is decoded, `finish` at the end.
"""

import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import TextIO

from kafkasniff.protocol.schema import record_apis
from kafkasniff.protocol.topics import TopicNames
from kafkasniff.protocol.walker import MARK_TOPIC_IDS
from kafkasniff.render.oneline import TOPICS_SLOT
from kafkasniff.render.plaintree import name_marks
from kafkasniff.render.values import error_names

from kafkasniff.render.oneline cimport event_row, message_row, topics_row
from kafkasniff.protocol.messages cimport Message
from kafkasniff.stream.session cimport MessageEvent

# The tree view, JSON, statistics and records (rich, orjson, the codecs) are imported by the views that use
# them: the one-line view starts without them.

NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"
# Stands for the topics list in JSON rendered by a parallel worker; a topic cannot be named so (NUL).
TOPICS_PLACEHOLDER = "\x00topics\x00"
# --json with workers: a message of this many bytes or more is sent to the parent as it is (pickled: its payload,
# compressed batches included) and rendered there, as it is written: its JSON can be ten times the payload, and
# copying it through pipes and pickles cost more than making it, and memory for the whole line in the worker, the
# pipe and the parent (an 8 MB response of 2 million results, --json -j 2: 223 MB).
RENDERED_BY_PARENT = 16384
# What a worker renders of a message a filter drops that names topic ids: nothing but its mentions, for the parent
# to learn the names from, as one process does whatever it shows (a bool: it stays itself through pickling).
LEARN_ONLY = False
# -V with workers: a message's tree goes to the parent in parts of about this many bytes (a Fetch's can be 50 MB),
# the first with the message's mentions, the others with CONTINUED in their place (a bool too).
TREE_PART_BYTES = 1 << 18
CONTINUED = True
_SLOT_BYTES = TOPICS_SLOT.encode()
OUTPUT_BLOCK = 1 << 16  # bytes of output gathered before they are written
cdef frozenset _RECORD_APIS = record_apis()


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
    def prints_events(self) -> bool:
        """--stats alone prints only the tables."""
        return not (self.stats and self.view == "line")

    @property
    def filtered(self) -> bool:
        """Whether filters leave events out (what --stats counts is then what they pass)."""
        return bool(self.apis or self.topics or self.client_ids or self.streams or self.errors_only)


def client_id_of(MessageEvent ev) -> str | None:
    if ev.message.kind == "request":
        return ev.message.client_id
    return ev.request.message.client_id if ev.request is not None else None


cdef bint learns_or_shows_topics(MessageEvent ev) except -1:
    """Whether the one-line view needs the event's topic mentions: to show them (Produce, Fetch), or to learn
    topic ids from them (Metadata, CreateTopics, ... name a topic and give its id together)."""
    cdef Message m = ev.message
    if m.api_key in _RECORD_APIS:
        return True
    for mention in m.mentions:
        if mention[0] is not None and mention[1] is not None:
            return True
    return False


cdef bint _teaches(list mentions):
    """Whether a mention (of `event_mentions`) gives a topic's name and id together."""
    for mention in mentions:
        if mention is not None and mention[0] is not None and mention[1] is not None:
            return True
    return False


cdef bint _names_only(list mentions):
    """Whether no mention (of `event_mentions`) has a topic id: then they resolve the same anywhere."""
    for mention in mentions:
        if mention is not None and mention[1] is not None:
            return False
    return True


cdef list event_mentions(MessageEvent ev):
    """The message's topic mentions; for a response, None and then its request's."""
    mentions = list(ev.message.mentions)
    if ev.request is not None:
        mentions.append(None)
        mentions += ev.request.message.mentions
    return mentions


cdef class Output:
    cdef readonly object options
    cdef object _out
    # Lines gathered and written a block at a time, whatever Python's own buffering of stdout is
    # (PYTHONUNBUFFERED would make every line a system call); `flush` writes them out (sniff: each message).
    cdef list _pending
    cdef Py_ssize_t _pending_bytes
    cdef public long long shown
    cdef readonly object topic_names, stats, json_line, tree
    cdef object _counted  # render.stats.counted, with --stats
    cdef int _stats_totals  # and the kind of a worker's totals (render.stats.TOTALS)
    cdef object _apart  # a worker's Stats, of what it counts apart (Stats.count_apart), and the events it showed
    cdef long long _shown_apart
    # The options, as the per-event paths test them
    cdef bint _line_view, _json_view, _prints_events, _show_secrets, _filters, _by_topic
    cdef bint _plain_tree  # -V or --hex into a file or pipe: workers can render it
    cdef object _part_topics  # delivering a tree in parts: the message's topics, or None when it is not shown
    cdef object _dumps  # --json: orjson.dumps, and the topics list a worker's line holds for the parent to fill
    cdef bytes _placeholder_json

    def __init__(self, options: OutputOptions, out: TextIO | None = None):
        self.options = options
        self._out = out  # None: whatever sys.stdout is at the time (a progress bar may redirect it)
        self._pending = []
        self._pending_bytes = 0
        self.shown = 0
        self.topic_names = TopicNames()
        self._line_view = options.view == "line"
        self._json_view = options.view == "json"
        self._prints_events = options.prints_events
        self._show_secrets = options.show_secrets
        self._filters = bool(options.apis or options.topics or options.client_ids or options.streams or
                             options.errors_only)
        self._by_topic = bool(options.topics)
        self.stats = self._counted = self._apart = None
        self._shown_apart = 0
        if options.stats:
            from kafkasniff.render.stats import TOTALS, Stats, counted

            self.stats, self._counted, self._stats_totals = Stats(), counted, TOTALS
        self.json_line = None
        if options.view == "json":
            import orjson

            from kafkasniff.render.jsonview import event_line as json_line

            self.json_line = json_line
            self._dumps = orjson.dumps
            self._placeholder_json = orjson.dumps([TOPICS_PLACEHOLDER])
        self.tree = None
        if options.view == "tree" and options.prints_events:
            if options.hex or (out or sys.stdout).isatty():
                from kafkasniff.render.tree import TreeView

                self.tree = TreeView(out, hex_=options.hex, show_secrets=options.show_secrets,
                                     full=options.full_values, topic_names=self.topic_names.by_id)
                # --hex into a file or pipe is plain text too, made a message at a time: workers can render it
                self._plain_tree = self.tree.console is None
            else:  # plain text, without rich
                from kafkasniff.render.plaintree import PlainTree

                self.tree = PlainTree(out, show_secrets=options.show_secrets, full=options.full_values,
                                      topic_names=self.topic_names.by_id)
                self._plain_tree = True

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    cpdef dict event_topics(self, MessageEvent ev):
        """Topics of the message (a response adds its request's) with [records, partitions] for each."""
        return self._resolve(event_mentions(ev))

    cpdef bint wanted(self, ev, dict topics=None) except -1:
        if not self.wanted_apart_from_topics(ev):
            return False
        if self._by_topic and type(ev) is MessageEvent:
            if topics is None:
                topics = self.event_topics(ev)
            return not self.options.topics.isdisjoint(topics)
        return True

    cpdef bint wanted_apart_from_topics(self, ev) except -1:
        if not self._filters:
            return True
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
        if o.errors_only and not (error_names(m) or m.malformed):
            return False
        return True

    cpdef emit(self, ev):
        cdef dict topics = None
        cdef bint message = type(ev) is MessageEvent
        if message and (self._by_topic or self.stats is not None or not self._line_view or
                        learns_or_shows_topics(ev)):
            topics = self.event_topics(ev)
        if not self.wanted(ev, topics):
            return
        self.shown += 1
        if self.stats is not None:
            self.stats.observe(ev, topics)
        if not self._prints_events:
            return
        if self.tree is not None:
            self.tree.show(ev, topics)
        elif self._json_view:
            self.write_bytes(self.json_line(ev, self._show_secrets, topics, self.write_bytes))
        elif message:
            self.write_bytes(message_row(ev, topics))
        else:
            self.write_bytes(event_row(ev, self._show_secrets, topics))

    cpdef write_bytes(self, data):
        """Bytes (or a bytearray) to the output, gathered; OUTPUT_BLOCK or more are written as they are."""
        if len(data) >= OUTPUT_BLOCK:
            if self._pending:
                self.flush()
            self._write_out(data)
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= OUTPUT_BLOCK:
            self.flush()

    cpdef flush(self):
        """Write out what was gathered, and flush the output."""
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
            self._write_out(data)
        self.out.flush()

    cdef _write_out(self, data):
        out = self.out
        binary = getattr(out, "buffer", None)
        if binary is not None:
            out.flush()
            binary.write(data)
        else:
            out.write(data.decode())

    # Parallel decoding: workers `render` events, the parent `deliver`s them in capture order,
    # resolving topic ids, which needs every earlier message of the capture.

    @property
    def renders_apart(self) -> bool:
        """Whether this view can be rendered by workers: one line, JSON, -V and --hex into a file or pipe, --stats alone
        (the workers read what it counts: render, deliver), not --stats beside the messages' JSON or tree."""
        return self.options.view == "line" or (not self.options.stats and (self.options.view == "json" or
                                                                           self._plain_tree))

    cpdef tuple render(self, ev, parts=None):
        """(UTF-8 line, topic mentions) of an event, or None when a filter other than --topic drops it (LEARN_ONLY
        and the mentions, when they name topic ids).

        A JSON line holds TOPICS_PLACEHOLDER, a one-line view's line TOPICS_SLOT, where `deliver` puts the
        resolved topics. A message's tree (-V) goes to `parts` instead, as it is made, and None is returned:
        parts.add((text, mentions or CONTINUED)) for a part of a few lines, parts.add_big(text, mentions or
        CONTINUED) for TREE_PART_BYTES or more (text: a buffer valid during the call); the headline holds
        TOPICS_SLOT (or, when the mentions name no topic id, the topics, which then stand for the mentions) and the
        tree MARK_TOPIC_IDS' marks, for `deliver` to name."""
        if not self.wanted_apart_from_topics(ev):
            if type(ev) is MessageEvent:
                mentions = event_mentions(ev)
                if _teaches(mentions):  # not shown, but its (topic id, name) pairs name ids in later messages
                    return LEARN_ONLY, mentions
            return None
        if self.stats is not None:  # --stats alone: what it counts of the event (a tuple), counted by `deliver`
            counted_item = self._counted(ev, ev.conn.stream if ev.conn is not None else None, True)
            if counted_item is None:
                return None
            mentions = event_mentions(ev) if type(ev) is MessageEvent else None
            if self._by_topic:  # whether it is counted at all depends on its topics' names: all counted in order
                return counted_item, mentions
            if self._apart is None:  # made in the worker: what the parent counted before it forked is not ours
                self._apart = type(self.stats)()
            self._shown_apart += 1
            topics = None
            if mentions and _names_only(mentions):  # final here: counted here, the parent has nothing to name
                topics, mentions = self._resolve(mentions), None
            left = self._apart.count_apart(counted_item, topics, bool(mentions))
            return (left, mentions) if left is not None else None
        mentions = topics = None
        message = type(ev) is MessageEvent
        if message and (self._by_topic or self._json_view or self._plain_tree or learns_or_shows_topics(ev)):
            mentions = event_mentions(ev)
            if _names_only(mentions):  # nothing to learn or look up: the topics are final here
                topics = self._resolve(mentions)
                if self._by_topic and self.options.topics.isdisjoint(topics):
                    return None
        if self._plain_tree:
            if not message:
                return self.tree.event_text(ev).encode(), None
            _Parts(parts, mentions if topics is None else topics).write_tree(
                self.tree, ev, TOPICS_SLOT if topics is None else topics)
            return None
        if self._json_view:
            if message:
                return self._json_apart(ev, mentions, topics, parts)
            return self.json_line(ev, self._show_secrets, None), None
        if topics is not None:
            return message_row(ev, topics), None
        return event_row(ev, self._show_secrets, TOPICS_SLOT), mentions

    cdef tuple _json_apart(self, MessageEvent ev, list mentions, dict topics, parts):
        """A message's JSON on a worker (`topics`: resolved there, or None: TOPICS_PLACEHOLDER for the parent). A big
        message goes to the parent whole (RENDERED_BY_PARENT); one with record batches goes to `parts` as it is
        made, as a tree does: a few KB of compressed records can make hundreds of MB of JSON."""
        if len(ev.payload) >= RENDERED_BY_PARENT:
            return ev, mentions
        if ev.message.batches:
            _Parts(parts, mentions if topics is None else topics).write_json(self, ev, topics)
            return None
        if topics is not None:
            return self.json_line(ev, self._show_secrets, topics), None
        return self.json_line(ev, self._show_secrets, [TOPICS_PLACEHOLDER]), mentions

    def render_end(self) -> list:
        """What a worker renders once it has rendered its last event: with --stats alone, its totals (what
        Stats.count_apart counted there) and how many events it showed."""
        if self._apart is None:
            return []
        return [((*self._apart.totals(), self._shown_apart), None)]

    def write_lines(self, data, long long count) -> None:
        """`count` lines that workers rendered whole (nothing to resolve), back to back, in capture order."""
        self.write_bytes(data)
        self.shown += count

    def deliver(self, rendered: list[tuple[bytes, list | None]]) -> None:
        """Write rendered events, in capture order: (line, mentions) each, (event, mentions) for an event the
        parent renders (RENDERED_BY_PARENT), or a message's parts (render: mentions, topics or CONTINUED)."""
        cdef object line, mentions
        chunks = []
        for line, mentions in rendered:
            if line is LEARN_ONLY:
                self._resolve(mentions)
                continue
            if type(line) is MessageEvent:
                topics = self._kept(mentions)
                if topics is None:
                    continue
                self.write_bytes(b"".join(chunks))
                chunks.clear()
                self.shown += 1
                self.write_bytes(self.json_line(line, self._show_secrets, topics, self.write_bytes))
                continue
            if self._plain_tree or self._json_view:  # a message's text, whole or in parts (render), or another event's
                if mentions is CONTINUED:
                    if self._part_topics is None:  # the message is not shown
                        continue
                    if self._plain_tree:
                        line = self._name_marks(line, self._part_topics)
                elif mentions is not None:  # a message's first part
                    # its topics, final in the worker (a filter has kept them), or resolved here
                    topics = mentions if type(mentions) is dict else self._kept(mentions)
                    self._part_topics = topics
                    if topics is None:
                        continue
                    if self._plain_tree:
                        line = self._name_marks(line, topics)
                    elif type(mentions) is not dict:  # the topics in the JSON's head, the start of its first part
                        line = line.replace(self._placeholder_json, self._dumps(list(topics)), 1)
                    self.shown += 1
                else:
                    self.shown += 1
                if len(line) >= OUTPUT_BLOCK:  # written as it is, not joined first
                    self.write_bytes(b"".join(chunks))
                    chunks.clear()
                    self.write_bytes(line)
                else:
                    chunks.append(line)
                continue
            if type(line) is tuple:  # --stats: what is left to count of an event, or a worker's totals and shown
                topics = self._resolve(mentions) if mentions is not None else None
                if self._by_topic:
                    if topics is None or self.options.topics.isdisjoint(topics):
                        continue
                    self.shown += 1
                elif line[0] == self._stats_totals:
                    self.shown += <long long>line[2]
                self.stats.count(line, topics)
                continue
            if mentions is not None:  # the one-line view's
                topics = self._kept(mentions)
                if topics is None:
                    continue
                line = line.replace(_SLOT_BYTES, topics_row(topics), 1)
            chunks.append(line)
            self.shown += 1
        self.write_bytes(b"".join(chunks))

    cdef dict _kept(self, list mentions):
        """The topics of a message the parent resolves (learning the names it gives), or None when --topic drops it."""
        topics = self._resolve(mentions)
        if self.options.topics and self.options.topics.isdisjoint(topics):
            return None
        return topics

    cdef _name_marks(self, line, dict topics):
        """A worker's text of a message named as the capture has named topics so far (plaintree.name_marks)."""
        return name_marks(line, topics, self.topic_names.by_id) if b"\0" in line else line  # mostly, nothing to name

    cdef dict _resolve(self, list mentions):
        """Mentions from `event_mentions`: the message's, then (after None) its request's, which add names only."""
        if None not in mentions:
            return self.topic_names.resolve(mentions)
        split = mentions.index(None)
        found = self.topic_names.resolve(mentions[:split])
        for name in self.topic_names.resolve(mentions[split + 1:]):
            found.setdefault(name, [0, []])
        return found

    def finish(self) -> None:
        if self.stats is not None:
            if self.options.view == "json":
                import orjson

                self.write_bytes(orjson.dumps(self.stats.to_json()) + b"\n")
            else:
                from kafkasniff.render.stats import print_stats

                self.flush()
                print_stats(self.stats, self.out, self.options.filtered)
        self.flush()


cdef class _Parts:
    """What a parallel worker makes of a message in parts (Output.render: a tree, or JSON with records): its text
    gathered as it is made and handed to the worker's `parts` a TREE_PART_BYTES at a time, the first with the
    message's mentions (a list) or, when they name no topic id, its topics (a dict: the text holds them already)."""

    cdef object parts, mentions
    cdef bytearray text

    def __init__(self, parts, mentions):
        self.parts = parts
        self.mentions = mentions
        self.text = bytearray()

    def write_tree(self, tree, MessageEvent ev, topics):
        tree.write_message(ev, topics, MARK_TOPIC_IDS, self.write)
        self._end()

    def write_json(self, Output output, MessageEvent ev, dict topics):
        self.write(output.json_line(ev, output._show_secrets, [TOPICS_PLACEHOLDER] if topics is None else topics,
                                    self.write))
        self._end()

    def write(self, data) -> None:
        """Bytes, or a view valid during the call (whole lines of a tree, whole batches of JSON)."""
        if not self.text and len(data) >= TREE_PART_BYTES:  # a chunk of the walker's: sent from its buffer
            self._send(data)
            return
        self.text += data
        if len(self.text) >= TREE_PART_BYTES:
            self._send(self.text)
            del self.text[:]

    cdef _send(self, data):
        self.parts.add_big(data, self.mentions)
        self.mentions = CONTINUED

    cdef _end(self):
        if self.text or self.mentions is not CONTINUED:
            self.parts.add((bytes(self.text), self.mentions))


def stdout_gone() -> None:
    """The reader of stdout went away (`| head`): point stdout at /dev/null so exiting is quiet."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
