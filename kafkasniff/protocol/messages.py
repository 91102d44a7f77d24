"""Decode one Kafka frame (header + body) into a `Message`.

Input is the frame's bytes after its 4-byte size prefix, given as a buffer and
a [pos, end) range so every Field offset is absolute within that buffer.
Nothing here raises on bad bytes: the result carries a `Malformed` verdict with
the fields decoded up to the point of failure, and any bytes left after a
complete body as a `trailing` field.
"""

from __future__ import annotations

from typing import Iterator

from kafkasniff.protocol import quirks
from kafkasniff.protocol.embedded import expand_embedded
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.interpreter import RecordsExpander, decode_struct
from kafkasniff.protocol.primitives import read_int16
from kafkasniff.protocol.schema import (api_name, apis, header_variant, is_flexible, message_variant,
                                        version_range)

REQUEST, RESPONSE = "request", "response"


class Message:
    __slots__ = ("kind", "api_key", "api_version", "api_name", "header_version", "correlation_id",
                 "client_id", "header", "body", "malformed", "trailing", "offset", "end")

    def __init__(self, kind: str, api_key: int | None, api_version: int | None, offset: int, end: int):
        self.kind = kind
        self.api_key = api_key
        self.api_version = api_version
        self.api_name = api_name(api_key) if api_key is not None else None
        self.header_version: int | None = None
        self.correlation_id: int | None = None
        self.client_id: str | None = None
        self.header: Field | None = None
        self.body: Field | None = None
        self.malformed: Malformed | None = None
        self.trailing: Field | None = None
        self.offset = offset
        self.end = end

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


def _decode_body(msg: Message, buf, pos: int, end: int, expand_records: RecordsExpander | None) -> None:
    variant = message_variant(msg.api_key, msg.kind, msg.api_version)
    body, err = decode_struct(variant, msg.api_version, buf, pos, end, "body", expand_records)
    msg.body = body
    if err is not None:
        msg.malformed = Malformed(err.offset, err.reason)
        return
    expand_embedded(msg, buf)
    if body.end < end:
        msg.trailing = Field("_trailing", "bytes", body.end, end - body.end, bytes(buf[body.end:end]), None,
                             f"{end - body.end} bytes after the end of the body")


def _version_problem(api_key: int, api_version: int, kind: str) -> str | None:
    if api_key not in apis():
        return f"unknown API key {api_key}"
    if message_variant(api_key, kind, api_version) is None:
        lo, hi = version_range(api_key, kind)
        return f"{api_name(api_key)} v{api_version} is not a version Kafka defines (v{lo}-v{hi})"
    return None


def decode_request(buf, pos: int = 0, end: int | None = None,
                   expand_records: RecordsExpander | None = None) -> Message:
    end = len(buf) if end is None else min(end, len(buf))
    try:
        api_key, _ = read_int16(buf, pos, end)
        api_version, _ = read_int16(buf, pos + 2, end)
    except Exception:
        msg = Message(REQUEST, None, None, pos, end)
        msg.malformed = Malformed(pos, f"request header needs 4 bytes, {end - pos} present")
        return msg
    return _decode(Message(REQUEST, api_key, api_version, pos, end), buf, expand_records)


def decode_response(buf, api_key: int, api_version: int, pos: int = 0, end: int | None = None,
                    expand_records: RecordsExpander | None = None) -> Message:
    end = len(buf) if end is None else min(end, len(buf))
    return _decode(Message(RESPONSE, api_key, api_version, pos, end), buf, expand_records)


_HEADER_VERSION = {REQUEST: quirks.request_header_version, RESPONSE: quirks.response_header_version}


def _decode(msg: Message, buf, expand_records: RecordsExpander | None) -> Message:
    """Header, then body; the header version follows from the body's (key, version)."""
    key, version, kind = msg.api_key, msg.api_version, msg.kind
    variant = message_variant(key, kind, version)
    flexible = variant is not None and is_flexible(variant, version)
    msg.header_version = _HEADER_VERSION[kind](key, version, flexible)
    header, err = decode_struct(header_variant(kind, msg.header_version), msg.header_version,
                                buf, msg.offset, msg.end, "header")
    msg.header = header
    if (f := header.child("CorrelationId")) is not None:
        msg.correlation_id = f.value
    if (f := header.child("ClientId")) is not None:
        msg.client_id = f.value
    if err is not None:
        msg.malformed = Malformed(err.offset, err.reason)
    elif (problem := _version_problem(key, version, kind)) is not None:
        msg.malformed = Malformed(msg.offset, problem)
    else:
        _decode_body(msg, buf, header.end, msg.end, expand_records)
    return msg


def decode_response_for_request(buf, api_key: int, api_version: int, pos: int = 0, end: int | None = None,
                                expand_records: RecordsExpander | None = None) -> Message:
    """Decode a response at its request's version, honouring Kafka's version fallbacks."""
    first = None
    for version in quirks.response_version_fallbacks(api_key, api_version):
        msg = decode_response(buf, api_key, version, pos, end, expand_records)
        if msg.complete:
            return msg
        first = first or msg
    return first


def all_versions(kind: str) -> Iterator[tuple[int, int]]:
    for key in sorted(apis()):
        lo, hi = version_range(key, kind)
        for v in range(lo, hi + 1):
            if message_variant(key, kind, v) is not None:
                yield key, v

