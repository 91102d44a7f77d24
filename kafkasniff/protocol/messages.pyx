"""Decode one Kafka frame (header + body) into a `Message`.

Input is the frame's bytes after its 4-byte size prefix, given as a buffer and a [pos, end) range so every
offset is absolute within that buffer. Every message is summarized (ids, error codes, topic mentions, record
counts: see walker.summarize); unless skimmed (`skim=True`: what the stream layer asks for) it also gets its
Field trees (`with_fields` gives them later, `field_trees` without keeping them), and `--json` writes the body
straight from the bytes (`json_body`). Nothing here raises on bad bytes: the result
carries a `Malformed` verdict (and, with fields, the fields read up to the failure), and any bytes left after
a complete body as a `trailing` field.
"""

from typing import Iterator

from kafkasniff.protocol import _walk, walker
from kafkasniff.protocol.quirks cimport response_version_fallbacks
from kafkasniff.protocol.quirks import request_header_version, response_header_version
from kafkasniff.protocol.embedded import EMBEDDED_ROLES
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.program import program_for
from kafkasniff.protocol.schema import api_name, apis, header_variant, is_flexible, message_variant, version_range

REQUEST, RESPONSE = "request", "response"
cdef long long MAX_DECOMPRESSED = walker.DEFAULT_MAX_DECOMPRESSED
cdef object _summarize = _walk.summarize  # once per message: no module lookup
cdef object _partition_facts = _walk.partition_facts


cdef class Message:
    """A decoded frame: what the stream layer and the views read (fields declared in messages.pxd)."""

    def __init__(self, str kind, api_key: int | None, api_version: int | None, Py_ssize_t offset, Py_ssize_t end):
        self.kind = kind
        self.api_key = api_key
        self.api_version = api_version
        self.api_name = api_name(api_key) if api_key is not None else None
        self.errors = []
        self.mentions = []
        self.offset = offset
        self.end = end

    @property
    def size(self) -> int:
        return self.end - self.offset

    @property
    def complete(self) -> bool:
        """Decoded to the last byte with nothing missing or left over."""
        return _complete(self)

    def fields(self) -> Iterator[Field]:
        for f in (self.header, self.body, self.trailing):
            if f is not None:
                yield f

    def __repr__(self) -> str:
        state = f" MALFORMED@{self.malformed.offset}: {self.malformed.reason}" if self.malformed else ""
        return (f"<{self.kind} {self.api_name} v{self.api_version} corr={self.correlation_id} "
                f"size={self.size}{state}>")


cdef inline bint _complete(Message m):
    return m.malformed is None and m.trailing is None


cdef class _Layout:
    """What (kind, API key, version) alone decides about a message: header version, programs, any problem."""

    cdef readonly str api_name
    cdef readonly object header_version, header, body, problem
    cdef readonly tuple programs

    def __init__(self, str kind, int key, int version):
        self.api_name = api_name(key)
        body = message_variant(key, kind, version)
        flexible = body is not None and is_flexible(body, version)
        self.header_version = _HEADER_VERSION[kind](key, version, flexible)
        self.header = program_for(header_variant(kind, self.header_version), self.header_version, "header")
        self.problem = _version_problem(key, version, kind)  # why the body cannot be decoded at this version
        self.body = None
        if self.problem is None:
            roles = EMBEDDED_ROLES.get((key, kind), ())
            self.body = program_for(body, version, "body", roles)
        self.programs = (self.header,) if self.body is None else (self.header, self.body)


# Layouts of the versions Kafka defines, made once each; a (key, version) it does not define gets a layout made
# for the message, so that bytes naming endless made-up versions do not grow the cache.
cdef dict _request_layouts = {}, _response_layouts = {}  # by (API key << 16 | version): no tuple to make and hash


cdef _Layout _layout(str kind, int key, int version):
    cdef dict layouts = _request_layouts if kind == REQUEST else _response_layouts
    cache_key = (key << 16) | (version & 0xFFFF)
    cdef _Layout layout = layouts.get(cache_key)
    if layout is None:
        layout = _Layout(kind, key, version)
        if layout.problem is None:
            layouts[cache_key] = layout
    return layout


def _version_problem(api_key: int, api_version: int, kind: str) -> str | None:
    if api_key not in apis():
        return f"unknown API key {api_key}"
    if message_variant(api_key, kind, api_version) is None:
        lo, hi = version_range(api_key, kind)
        return f"{api_name(api_key)} v{api_version} is not a version Kafka defines (v{lo}-v{hi})"
    return None


_HEADER_VERSION = {REQUEST: request_header_version, RESPONSE: response_header_version}


cdef inline int _int16_at(buf, Py_ssize_t at):
    cdef int value = (<int>buf[at] << 8) | <int>buf[at + 1]
    return value - 65536 if value >= 32768 else value


def decode_request(buf, Py_ssize_t pos=0, end=None, *, bint skim=False) -> Message:
    cdef Py_ssize_t stop = len(buf) if end is None else min(end, len(buf))
    return _request(buf, pos, stop, skim)


cdef Message skim_request(bytes payload):
    return _request(payload, 0, len(payload), True)


cdef Message _request(buf, Py_ssize_t pos, Py_ssize_t stop, bint skim):
    cdef Message msg
    if stop - pos < 4:
        msg = Message(REQUEST, None, None, pos, stop)
        msg.malformed = Malformed(pos, f"request header needs 4 bytes, {max(stop - pos, 0)} present")
        return msg
    return _decode(REQUEST, _int16_at(buf, pos), _int16_at(buf, pos + 2), buf, pos, stop, skim)


def decode_response(buf, int api_key, int api_version, Py_ssize_t pos=0, end=None, *, bint skim=False) -> Message:
    cdef Py_ssize_t stop = len(buf) if end is None else min(end, len(buf))
    return _decode(RESPONSE, api_key, api_version, buf, pos, stop, skim)


def response_schemas(versions) -> list:
    """The schemas (header and body programs) of response (API key, version)s Kafka defines, for screen_responses."""
    return [(<_Layout>_layout(RESPONSE, key, version)).programs for key, version in versions]


def screen_responses(list schemas, buf, Py_ssize_t pos, Py_ssize_t end, long long steps_allowed) -> tuple[list, int]:
    """Which of the response schemas (response_schemas) consume the bytes exactly: a walk per schema that makes
    nothing, to rank many schemas before decoding any. The walks take a step per value, at most `steps_allowed`
    in all, in order. Gives ([(index in schemas, suspicion)], how many were tried); suspicion counts
    implausible values as the summary does."""
    return _walk.screen(schemas, buf, pos, min(end, len(buf)), steps_allowed)


def decode_response_for_request(buf, int api_key, int api_version, Py_ssize_t pos=0, end=None, *,
                                bint skim=False) -> Message:
    """Decode a response at its request's version, honouring Kafka's version fallbacks."""
    cdef Py_ssize_t stop = len(buf) if end is None else min(end, len(buf))
    return _response(buf, api_key, api_version, pos, stop, skim)


cdef Message skim_response(bytes payload, int api_key, int api_version):
    return _response(payload, api_key, api_version, 0, len(payload), True)


cdef Message _response(buf, int api_key, int api_version, Py_ssize_t pos, Py_ssize_t stop, bint skim):
    cdef Message msg, first = None
    for version in response_version_fallbacks(api_key, api_version):
        msg = _decode(RESPONSE, api_key, version, buf, pos, stop, skim)
        if _complete(msg):
            return msg
        if first is None:
            first = msg
    return first


cdef Message _decode(str kind, int api_key, int api_version, buf, Py_ssize_t pos, Py_ssize_t end, bint skim):
    """Summarize header and body, and unless skimming make their Field trees; the header version follows
    from the body's (key, version)."""
    cdef _Layout layout = _layout(kind, api_key, api_version)
    cdef Message msg = Message.__new__(Message)
    msg.kind = kind
    msg.api_key = api_key
    msg.api_version = api_version
    msg.api_name = layout.api_name
    msg.offset = pos
    msg.end = end
    msg.header_version = layout.header_version
    # What the header and body hold (summary.c): stop offsets of each program, (offset, reason) where decoding
    # failed or None, and the values the stream layer and the one-line view need.
    cdef tuple found = _summarize(layout.programs, buf, pos, end, MAX_DECOMPRESSED)
    stops, failure, msg.correlation_id, msg.client_id, msg.acks, msg.throttle_time_ms, msg.errors, \
        msg.mentions, msg.batches, msg.records, msg.suspicion = found
    header_end, body_end = stops[0], stops[-1]
    if header_end >= 0 and layout.body is not None:
        msg.body_offset = header_end
    if failure is not None:
        msg.malformed = Malformed(*failure)
    elif layout.problem is not None:
        msg.malformed = Malformed(pos, layout.problem)
    elif body_end < end:
        msg.trailing = Field("_trailing", "bytes", body_end, end - body_end, bytes(buf[body_end:end]), None,
                             f"{end - body_end} bytes after the end of the body")
    if not skim:
        with_fields(msg, buf)
    return msg


def field_trees(msg: Message, buf, ctx=None, record_limit: int = 0) -> tuple[Field | None, Field | None]:
    """The message's header and body as Field trees (body None when the header could not be read or the
    version is unknown); `ctx` reads SASL tokens (sasl.TokenReader). Views that hold a whole tree set a
    `record_limit`: records past it are counted in one RecordsNotShown Field, not made."""
    if msg.api_key is None:
        return None, None
    cdef _Layout layout = _layout(msg.kind, msg.api_key, msg.api_version)
    header, _ = walker.field_tree(layout.header, buf, msg.offset, msg.end)
    body = None
    if msg.body_offset is not None:
        body, _ = walker.field_tree(layout.body, buf, msg.body_offset, msg.end, ctx, record_limit=record_limit)
    return header, body


def with_fields(msg: Message, buf, ctx=None, record_limit: int = 0) -> Message:
    """Give the message its Field trees (see field_trees), kept on it."""
    if msg.header is None:
        msg.header, msg.body = field_trees(msg, buf, ctx, record_limit)
    return msg


def json_body(msg: Message, buf, ctx=None, write=None) -> bytes | None:
    """The body as JSON text (None when the header could not be read or the version is unknown)."""
    if msg.body_offset is None:
        return None
    body = _layout(msg.kind, msg.api_key, msg.api_version).body
    return walker.json_body(body, buf, msg.body_offset, msg.end, ctx, write)


def record_columns(msg: Message, buf, emit, every: int) -> int | None:
    """The records the message carries, in wire order, handed on as columns in chunks (walker.record_columns); how
    many, None when it carries no record batches."""
    if msg.body_offset is None or not msg.batches:
        return None
    return walker.record_columns(_layout(msg.kind, msg.api_key, msg.api_version).body, buf, msg.body_offset, msg.end,
                                 emit, every)


def partition_facts(msg: Message, buf, tuple wanted) -> tuple[dict, tuple, bytes]:
    """The body's root facts, its partitions' (topic, topic id) pairs and its partitions packed: their facts
    `wanted` names (fixed-width fields by snake_case name), in its order, and their record batches' headers
    (walker.BATCH_FACTS), records not read (partitions.c says how; packed.pxd reads them). Nothing when there is
    no body."""
    if msg.body_offset is None:
        return {}, (), b""
    root, topics, packed = _partition_facts(_layout(msg.kind, msg.api_key, msg.api_version).body, buf,
                                            msg.body_offset, msg.end, walker.DEFAULT_MAX_DECOMPRESSED, wanted)
    return root or {}, topics, packed


def tree_text(msg: Message, buf, limit: int | None, show_secrets: bool, spans: bool, ctx=None,
              topic_names=None, write=None) -> tuple[bytes, bytes | None]:
    """The message's header and body as -V tree lines (see walker.text_tree: topic_names is a dict or
    MARK_TOPIC_IDS); empty when the API is unknown."""
    if msg.api_key is None:
        return b"", b"" if spans else None
    layout = _layout(msg.kind, msg.api_key, msg.api_version)
    roots = [(layout.header, f"{layout.header.type} v{layout.header_version}", msg.offset, msg.end)]
    if msg.body_offset is not None:
        roots.append((layout.body, layout.body.type, msg.body_offset, msg.end))
    return walker.text_tree(tuple(roots), buf, limit, show_secrets, spans, ctx, topic_names, write)


def all_versions(kind: str) -> Iterator[tuple[int, int]]:
    for key in sorted(apis()):
        lo, hi = version_range(key, kind)
        for v in range(lo, hi + 1):
            if message_variant(key, kind, v) is not None:
                yield key, v
