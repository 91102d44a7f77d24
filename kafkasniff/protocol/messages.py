"""Decode one Kafka frame (header + body) into a `Message`.

Input is the frame's bytes after its 4-byte size prefix, given as a buffer and a [pos, end) range so every
offset is absolute within that buffer. Every message is summarized (ids, error codes, topic mentions, record
counts: see walker.summarize); unless skimmed (`skim=True`: what the stream layer asks for) it also gets its
Field trees (`with_fields` gives them later, `field_trees` without keeping them), and `--json` writes the body
straight from the bytes (`json_body`). Nothing here raises on bad bytes: the result
carries a `Malformed` verdict (and, with fields, the fields read up to the failure), and any bytes left after
a complete body as a `trailing` field.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Iterator

from kafkasniff.protocol import quirks, walker
from kafkasniff.protocol.embedded import EMBEDDED_ROLES
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.program import program_for
from kafkasniff.protocol.schema import api_name, apis, header_variant, is_flexible, message_variant, version_range

REQUEST, RESPONSE = "request", "response"


class Message:
    __slots__ = ("kind", "api_key", "api_version", "api_name", "header_version", "correlation_id", "client_id",
                 "acks", "throttle_time_ms", "errors", "mentions", "batches", "records", "suspicion", "header",
                 "body", "body_offset", "malformed", "trailing", "offset", "end", "sasl_mechanism")

    def __init__(self, kind: str, api_key: int | None, api_version: int | None, offset: int, end: int):
        self.kind = kind
        self.api_key = api_key
        self.api_version = api_version
        self.api_name = api_name(api_key) if api_key is not None else None
        self.header_version: int | None = None
        self.correlation_id: int | None = None
        self.client_id: str | None = None
        self.acks: int | None = None                 # Produce requests: whether a response will come
        self.throttle_time_ms: int | None = None     # responses
        self.errors: list[int] = []                  # non-zero error codes, in wire order
        # [topic name or None, topic id or None, data records, [partitions]] per struct naming a topic
        self.mentions: list[list] = []
        self.batches = 0                             # record batches (or legacy messages) in the body
        self.records = 0                             # data records in them, by their headers
        self.suspicion = 0                           # implausible values: unknown error codes, illegal nulls, ...
        self.header: Field | None = None            # the Field trees, when asked for
        self.body: Field | None = None
        self.body_offset: int | None = None          # where the body starts, when the header was read
        self.malformed: Malformed | None = None
        self.trailing: Field | None = None
        self.offset = offset
        self.end = end
        self.sasl_mechanism: str | None = None       # SaslAuthenticate: the mechanism its session agreed

    @property
    def size(self) -> int:
        return self.end - self.offset

    @property
    def complete(self) -> bool:
        """Decoded to the last byte with nothing missing or left over."""
        return self.malformed is None and self.trailing is None

    def fields(self) -> Iterator[Field]:
        for f in (self.header, self.body, self.trailing):
            if f is not None:
                yield f

    def __repr__(self) -> str:
        state = f" MALFORMED@{self.malformed.offset}: {self.malformed.reason}" if self.malformed else ""
        return (f"<{self.kind} {self.api_name} v{self.api_version} corr={self.correlation_id} "
                f"size={self.size}{state}>")


class _Layout:
    """What (kind, API key, version) alone decides about a message: header version, programs, any problem."""

    __slots__ = ("header_version", "header", "body", "problem", "programs")

    def __init__(self, kind: str, key: int, version: int):
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


_layout = cache(_Layout)


def _version_problem(api_key: int, api_version: int, kind: str) -> str | None:
    if api_key not in apis():
        return f"unknown API key {api_key}"
    if message_variant(api_key, kind, api_version) is None:
        lo, hi = version_range(api_key, kind)
        return f"{api_name(api_key)} v{api_version} is not a version Kafka defines (v{lo}-v{hi})"
    return None


_HEADER_VERSION = {REQUEST: quirks.request_header_version, RESPONSE: quirks.response_header_version}
_KEY_AND_VERSION = struct.Struct(">hh").unpack_from


def decode_request(buf, pos: int = 0, end: int | None = None, *, skim: bool = False) -> Message:
    end = len(buf) if end is None else min(end, len(buf))
    if end - pos < 4:
        msg = Message(REQUEST, None, None, pos, end)
        msg.malformed = Malformed(pos, f"request header needs 4 bytes, {max(end - pos, 0)} present")
        return msg
    api_key, api_version = _KEY_AND_VERSION(buf, pos)
    return _decode(Message(REQUEST, api_key, api_version, pos, end), buf, skim)


def decode_response(buf, api_key: int, api_version: int, pos: int = 0, end: int | None = None, *,
                    skim: bool = False) -> Message:
    end = len(buf) if end is None else min(end, len(buf))
    return _decode(Message(RESPONSE, api_key, api_version, pos, end), buf, skim)


def decode_response_for_request(buf, api_key: int, api_version: int, pos: int = 0, end: int | None = None, *,
                                skim: bool = False) -> Message:
    """Decode a response at its request's version, honouring Kafka's version fallbacks."""
    first = None
    for version in quirks.response_version_fallbacks(api_key, api_version):
        msg = decode_response(buf, api_key, version, pos, end, skim=skim)
        if msg.complete:
            return msg
        first = first or msg
    return first


def _decode(msg: Message, buf, skim: bool) -> Message:
    """Summarize header and body, and unless skimming make their Field trees; the header version follows
    from the body's (key, version)."""
    layout = _layout(msg.kind, msg.api_key, msg.api_version)
    msg.header_version = layout.header_version
    found = walker.summarize(layout.programs, buf, msg.offset, msg.end)
    msg.correlation_id = found.correlation_id
    msg.client_id = found.client_id
    msg.acks = found.acks
    msg.throttle_time_ms = found.throttle_time_ms
    msg.errors = found.errors
    msg.mentions = found.mentions
    msg.batches = found.batches
    msg.records = found.records
    msg.suspicion = found.suspicion
    header_end, body_end = found.stops[0], found.stops[-1]
    if header_end >= 0 and layout.body is not None:
        msg.body_offset = header_end
    if found.malformed is not None:
        msg.malformed = found.malformed
    elif layout.problem is not None:
        msg.malformed = Malformed(msg.offset, layout.problem)
    elif body_end < msg.end:
        msg.trailing = Field("_trailing", "bytes", body_end, msg.end - body_end, bytes(buf[body_end:msg.end]), None,
                             f"{msg.end - body_end} bytes after the end of the body")
    if not skim:
        with_fields(msg, buf)
    return msg


def field_trees(msg: Message, buf, ctx=None, record_limit: int = 0) -> tuple[Field | None, Field | None]:
    """The message's header and body as Field trees (body None when the header could not be read or the
    version is unknown); `ctx` reads SASL tokens (sasl.TokenReader). Views that hold a whole tree set a
    `record_limit`: records past it are counted in one RecordsNotShown Field, not made."""
    if msg.api_key is None:
        return None, None
    layout = _layout(msg.kind, msg.api_key, msg.api_version)
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


def record_rows(msg: Message, buf) -> list[tuple]:
    """A tuple per record the message carries (walker.RECORD_ROW), in wire order."""
    if msg.body_offset is None or not msg.batches:
        return []
    return walker.record_rows(_layout(msg.kind, msg.api_key, msg.api_version).body, buf, msg.body_offset, msg.end)


def tree_text(msg: Message, buf, limit: int | None, show_secrets: bool, spans: bool, ctx=None,
              topic_names: dict | None = None, write=None) -> tuple[bytes, bytes | None]:
    """The message's header and body as -V tree lines (see walker.text_tree); empty when the API is unknown."""
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
