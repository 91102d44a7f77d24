"""Decode one Kafka frame (header + body) into a `Message`.

Input is the frame's bytes after its 4-byte size prefix, given as a buffer and
a [pos, end) range so every Field offset is absolute within that buffer.
Nothing here raises on bad bytes: the result carries a `Malformed` verdict with
the fields decoded up to the point of failure, and any bytes left after a
complete body as a `trailing` field.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Iterator

from kafkasniff.protocol import quirks
from kafkasniff.protocol.embedded import expand_embedded
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.interpreter import RecordsExpander, decode_struct
from kafkasniff.protocol._skim import run as run_skim
from kafkasniff.protocol.skim import REFUSED, SkimProgram, header_value_count, kept_values, skim_program
from kafkasniff.protocol.schema import (Variant, api_name, apis, header_variant, is_flexible, message_variant,
                                        version_range)

REQUEST, RESPONSE = "request", "response"


class Message:
    __slots__ = ("kind", "api_key", "api_version", "api_name", "header_version", "correlation_id",
                 "client_id", "header", "body", "skimmed", "malformed", "trailing", "offset", "end")

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
        # When skimmed instead of decoded: (name, value) of non-zero error codes and Acks, in order.
        self.skimmed: list[tuple[str, int]] | None = None
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

    def value(self, name: str):
        """A top-level body value, whether the body was decoded or skimmed."""
        if self.body is not None:
            f = self.body.child(name)
            return f.value if f is not None else None
        for skimmed_name, v in self.skimmed or ():
            if skimmed_name == name:
                return v
        return None

    def fields(self) -> Iterator[Field]:
        for f in (self.header, self.body, self.trailing):
            if f is not None:
                yield f

    def __repr__(self) -> str:
        state = f" MALFORMED@{self.malformed.offset}: {self.malformed.reason}" if self.malformed else ""
        return (f"<{self.kind} {self.api_name} v{self.api_version} corr={self.correlation_id} "
                f"size={self.size}{state}>")


class _Layout:
    """What (kind, API key, version) alone decides about a message."""

    __slots__ = ("header_version", "header", "body", "problem", "header_values", "_skim_program")

    def __init__(self, kind: str, key: int, version: int):
        body = message_variant(key, kind, version)
        flexible = body is not None and is_flexible(body, version)
        self.header_version = _HEADER_VERSION[kind](key, version, flexible)
        self.header = header_variant(kind, self.header_version)
        self.problem = _version_problem(key, version, kind)  # why the body cannot be decoded at this version
        self.body = body if self.problem is None else None
        self.header_values = header_value_count(self.header, self.header_version)  # skim values from the header
        self._skim_program: SkimProgram | None = None

    def skim_program(self, version: int) -> SkimProgram:
        """Header, then body unless there is a problem: assembled on first use (the full decoder needs none)."""
        if self._skim_program is None:
            self._skim_program = skim_program(self.header, self.header_version, self.body, version)
        return self._skim_program


_layout = cache(_Layout)


def _decode_body(msg: Message, buf, pos: int, end: int, variant: Variant,
                 expand_records: RecordsExpander | None) -> None:
    body, err = decode_struct(variant, msg.api_version, buf, pos, end, "body", expand_records)
    msg.body = body
    if err is not None:
        msg.malformed = Malformed(err.offset, err.reason)
        return
    expand_embedded(msg, buf)
    _trailing(msg, buf, body.end, end)


def _trailing(msg: Message, buf, body_end: int, end: int) -> None:
    if body_end < end:
        msg.trailing = Field("_trailing", "bytes", body_end, end - body_end, bytes(buf[body_end:end]), None,
                             f"{end - body_end} bytes after the end of the body")


def _version_problem(api_key: int, api_version: int, kind: str) -> str | None:
    if api_key not in apis():
        return f"unknown API key {api_key}"
    if message_variant(api_key, kind, api_version) is None:
        lo, hi = version_range(api_key, kind)
        return f"{api_name(api_key)} v{api_version} is not a version Kafka defines (v{lo}-v{hi})"
    return None


def decode_request(buf, pos: int = 0, end: int | None = None,
                   expand_records: RecordsExpander | None = None, skim: bool = False) -> Message:
    end = len(buf) if end is None else min(end, len(buf))
    if end - pos < 4:
        msg = Message(REQUEST, None, None, pos, end)
        msg.malformed = Malformed(pos, f"request header needs 4 bytes, {max(end - pos, 0)} present")
        return msg
    api_key, api_version = _KEY_AND_VERSION(buf, pos)
    return _decode(Message(REQUEST, api_key, api_version, pos, end), buf, expand_records, skim)


def decode_response(buf, api_key: int, api_version: int, pos: int = 0, end: int | None = None,
                    expand_records: RecordsExpander | None = None, skim: bool = False) -> Message:
    end = len(buf) if end is None else min(end, len(buf))
    return _decode(Message(RESPONSE, api_key, api_version, pos, end), buf, expand_records, skim)


_HEADER_VERSION = {REQUEST: quirks.request_header_version, RESPONSE: quirks.response_header_version}
_KEY_AND_VERSION = struct.Struct(">hh").unpack_from


def _decode(msg: Message, buf, expand_records: RecordsExpander | None, skim: bool) -> Message:
    """Header, then body; the header version follows from the body's (key, version).

    With skim, no Field tree is built: the structure is checked all the same, and
    only the values a one-line summary needs are kept (see skim.py).
    """
    layout = _layout(msg.kind, msg.api_key, msg.api_version)
    msg.header_version = layout.header_version
    if skim:
        _skim(msg, buf, layout)
    else:
        _decode_fields(msg, buf, layout, expand_records)
    return msg


def _decode_fields(msg: Message, buf, layout: _Layout, expand_records: RecordsExpander | None) -> None:
    header, err = decode_struct(layout.header, layout.header_version, buf, msg.offset, msg.end, "header")
    msg.header = header
    for c in header.children:
        if c.name == "CorrelationId":
            msg.correlation_id = c.value
        elif c.name == "ClientId":
            msg.client_id = c.value
    if err is not None:
        msg.malformed = Malformed(err.offset, err.reason)
    elif layout.problem is not None:
        msg.malformed = Malformed(msg.offset, layout.problem)
    else:
        _decode_body(msg, buf, header.end, msg.end, layout.body, expand_records)


def _skim(msg: Message, buf, layout: _Layout) -> None:
    found: list = []
    program = layout.skim_program(msg.api_version)
    body_end = run_skim(program.ops, program.names, buf, msg.offset, msg.end, found)
    if body_end == REFUSED:
        _skim_by_decoding(msg, buf, layout)
        return
    count = layout.header_values
    for name, value in found[:count]:
        if name == "CorrelationId":
            msg.correlation_id = value
        else:
            msg.client_id = value
    if layout.problem is not None:
        msg.malformed = Malformed(msg.offset, layout.problem)
        return
    msg.skimmed = found[count:]
    _trailing(msg, buf, body_end, msg.end)


def _skim_by_decoding(msg: Message, buf, layout: _Layout) -> None:
    """The skim refused the bytes: the full decoder says where and why, and gives the values a skim keeps."""
    _decode_fields(msg, buf, layout, None)
    if msg.body is not None:
        msg.skimmed = kept_values(msg.body)
    msg.header = msg.body = None


def decode_response_for_request(buf, api_key: int, api_version: int, pos: int = 0, end: int | None = None,
                                expand_records: RecordsExpander | None = None, skim: bool = False) -> Message:
    """Decode a response at its request's version, honouring Kafka's version fallbacks."""
    first = None
    for version in quirks.response_version_fallbacks(api_key, api_version):
        msg = decode_response(buf, api_key, version, pos, end, expand_records, skim)
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

