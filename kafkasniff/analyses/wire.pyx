# cython: language_level=3
"""What the analyses read of a message (`Seen`): the bodies of the group and offset APIs as plain values (they
are small and rare), the per-partition numbers of Produce, Fetch and ListOffsets that the analyses read, without
their records (messages.partition_facts: batch headers only, so a Fetch response of thousands of records costs no
more than a few small ones; packed, no object per partition: protocol/packed.pxd reads them), and the (topic id,
name) pairs it teaches.

A Seen is made once per message, where it is decoded, and holds plain values only: `seen` where the analyses run
in the same process, `plain_seen` where it is sent to them (a parallel decode's workers, the Spark pipeline's
decode tasks, which carry them to the one task that runs the analyses over the whole capture: pipeline.analysis),
and `PlainSeens` there.
"""

from __future__ import annotations

from typing import NamedTuple

import orjson

from kafkasniff.protocol.messages cimport Message
from kafkasniff.protocol import _walk
from kafkasniff.protocol.messages import json_body, partition_facts
from kafkasniff.protocol.packed cimport BATCH_WORDS, HEAD_WORDS
from kafkasniff.protocol.topics import TopicNames
from kafkasniff.stream.namedtuples cimport named_tuple
from kafkasniff.stream.session cimport MessageEvent

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 2, 8, 9
HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP = 12, 11, 13, 14
CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT = 68, 76
# APIs whose bodies the analyses read as plain values, and those whose partitions they read as facts. A request
# is read when it is seen only when it changes a group (REQUESTS_READ_ALONE); the others are read with their
# response, which is when the analyses look at them.
BODY_APIS = frozenset({OFFSET_COMMIT, OFFSET_FETCH, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP,
                       CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT})
PARTITION_APIS = frozenset({PRODUCE, FETCH, LIST_OFFSETS})
ANALYSED_APIS = BODY_APIS | PARTITION_APIS
REQUESTS_READ_ALONE = BODY_APIS - {OFFSET_FETCH}
# The facts of Produce, Fetch and ListOffsets (root and partitions) that the analyses read (lag.pyx): only these are
# made, sent to where the analyses run and read back there, a partition's in this order (their slots: lag.pyx finds
# each by name). A fact left out reads as missing.
FACTS_READ = (
    "replica_id", "replica_state.replica_id", "session_epoch", "isolation_level", "fetch_offset",  # Fetch requests
    "error_code", "high_watermark", "last_stable_offset", "records_bytes",  # Fetch responses, Produce requests
    "base_offset",  # Produce responses
    "timestamp", "offset",  # ListOffsets
)
# The packed layout packed.pxd reads is the one partitions.c writes.
if (HEAD_WORDS, BATCH_WORDS) != (_walk.PACKED_HEAD_WORDS, _walk.PACKED_BATCH_WORDS):
    raise ImportError("packed.pxd's layout differs from partitions.c's: rebuild kafkasniff's extensions")


class Asked(NamedTuple):
    """A response's request, as the analyses read it with the response."""

    ts: float
    body: dict | None
    root: dict
    partitions: tuple         # (topics, packed): messages.partition_facts' partitions, topic ids not yet named


class Seen(NamedTuple):
    """One message as the analyses read it. `connection` is anything that tells connections apart (the
    KafkaConnection in one process, the connection id in Spark)."""

    ts: float
    connection: object
    client: tuple             # the client end: (ip, port)
    client_id: str | None
    kind: str
    api_key: int | None
    malformed: bool
    errors: list[int]         # the group APIs' error codes
    body: dict | None         # the group and offset APIs' bodies
    root: dict                # Produce, Fetch and ListOffsets: the root struct's facts
    partitions: tuple         # and their partitions: (topics, packed) of messages.partition_facts (FACTS_READ),
                              # topic ids not yet named
    pairs: list[tuple[str, str]]  # (topic id, name) pairs the message teaches
    request: Asked | None     # a response's request, when captured (and the analyses read the API)


def seen(MessageEvent ev, connection=None):
    """What the analyses read of the message (a Seen); None when they read nothing of it. `connection`: the
    connection's identity (default: ev.conn)."""
    values = _seen_values(ev, connection, False)
    return named_tuple(Seen, values) if values is not None else None


cpdef tuple plain_seen(MessageEvent ev, connection):
    """What `seen` reads of the message as plain tuples (its request and client end too; bodies as their JSON
    text), or None: made where the message is decoded (a parallel decode's workers, the Spark decode tasks) and
    sent, marshalled, to where the analyses run, which make the Seen of it (PlainSeens). orjson reads a body's
    text back in less than half the time marshal takes to read the same dicts, and the worker does not make
    them."""
    return _seen_values(ev, connection, True)


cdef tuple _seen_values(MessageEvent ev, connection, bint plain):
    """The values of the message's Seen, its request an Asked or (plain) a tuple; None when the analyses read
    nothing of it."""
    # Compiled: it runs for every message of --stats, --top, --metrics-port, lag and the Spark decode tasks, and
    # reads the event's and message's C fields directly.
    cdef Message m = ev.message
    cdef MessageEvent request = ev.request
    cdef list mentions = m.mentions
    cdef object pairs = _NONE
    cdef bint is_response = m.kind == "response"
    if mentions:
        pairs = [(topic_id, name) for name, topic_id, _, _ in mentions if name is not None and topic_id is not None]
    api_key = m.api_key
    cdef bint read = api_key in (ANALYSED_APIS if is_response else REQUESTS_READ_ALONE)
    if not read and not pairs:
        return None
    body, root, found = _read(ev, plain) if read else _NOTHING_READ
    if not is_response:
        client_id, asked = m.client_id, None
        if read:  # a request read alone: its response reads it again (_request_read)
            ev.analysed = (plain, (body, root, found))
    elif request is None:
        client_id, asked = None, None
    else:
        client_id = request.message.client_id
        if read:
            asked = (request.ts, *_request_read(request, plain))
            if not plain:
                asked = named_tuple(Asked, asked)
        else:
            asked = None
    client = ev.conn.client
    return (ev.ts, ev.conn if connection is None else connection, tuple(client) if plain else client, client_id,
            m.kind, api_key, m.malformed is not None, m.errors if api_key in BODY_APIS else _NONE, body, root, found,
            pairs, asked)


cdef class PlainSeens:
    """Makes the Seens of plain_seen's tuples, given in capture order (a parallel decode's merging thread, the Spark
    task of the whole capture). A request read alone (a group API's) comes before its response, whose request
    carries the same body text: it is read once."""

    cdef dict _requests  # body text of a request read alone -> the body, until its response comes

    def __cinit__(self):
        self._requests = {}

    def seen(self, tuple plain):
        """The Seen of what plain_seen gave."""
        # Every value named (no slices to unpack): it runs once per Seen where the analyses run.
        cdef tuple request = plain[12]
        text = plain[8]
        body = _body(text)
        if request is None:
            if body is not None and plain[4] == "request":
                self._keep(text, body)
            asked = None
        else:
            asked_text = request[1]
            asked_body = self._requests.pop(asked_text, None) if asked_text is not None else None
            if asked_body is None:
                asked_body = _body(asked_text)
            asked = named_tuple(Asked, (request[0], asked_body, request[2], request[3]))
        return named_tuple(Seen, (plain[0], plain[1], plain[2], plain[3], plain[4], plain[5], plain[6], plain[7],
                           body, plain[9], plain[10], plain[11], asked))

    cdef void _keep(self, text, body) except *:
        self._requests[text] = body
        if len(self._requests) > MAX_WAITING_REQUESTS:  # requests whose response was not captured: the oldest go
            del self._requests[next(iter(self._requests))]


# Requests read alone whose bodies wait for their responses, at most (a group API's response comes within a
# rebalance's time: hundreds at once in a busy capture).
MAX_WAITING_REQUESTS = 10_000


cdef object _body(text):
    return orjson.loads(text) if text is not None else None


# A Seen is made for most messages of `--stats` and `lag` (named_tuple: without the named tuple's Python
# constructor); what it holds is never changed, so the empty parts can be shared.
_NONE: tuple = ()
_NO_FACTS: dict = {}
NO_PARTITIONS = ((), b"")
_NOTHING_READ = (None, _NO_FACTS, NO_PARTITIONS)


cdef tuple _request_read(MessageEvent request, bint plain):
    """What _read gives of a response's request: what its own Seen read, when it was read alone (once: it has one
    response), else read now."""
    kept = request.analysed
    if kept is not None:
        request.analysed = None
        if kept[0] == plain:
            return kept[1]
    return _read(request, plain)


cdef tuple _read(MessageEvent ev, bint plain):
    """(body, root facts, partitions) of what the analyses read of the message, the body as its JSON text when
    `plain`; nothing when it is malformed."""
    cdef Message m = ev.message
    if m.malformed is None:
        if m.api_key in BODY_APIS:
            text = json_body(m, ev.payload)
            return text if plain else _body(text), _NO_FACTS, NO_PARTITIONS
        if m.api_key in PARTITION_APIS:
            root, topics, packed = partition_facts(m, ev.payload, FACTS_READ)
            return None, root, (topics, packed)
    return _NOTHING_READ


def topic_of(entry: dict, names: TopicNames) -> str | None:
    """The topic a JSON struct names: by name, else by its id (named when the capture said which)."""
    for key in ("name", "topic"):
        if entry.get(key):
            return entry[key]
    topic_id = entry.get("topic_id")
    return names.by_id.get(topic_id, topic_id) if topic_id else None
