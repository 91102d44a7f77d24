"""Decode the `records` bytes of Produce and Fetch into Field trees.

The bytes hold record batches (magic 2) or legacy message sets (magic 0 and 1),
one after another; both formats put the magic byte at offset 16 of an item, after
an int64 offset and an int32 length. Every item becomes one Field whose offsets
are absolute in the caller's buffer. Records inside a compressed batch or wrapper
message are decoded from the decompressed bytes: their container Field has a
DECOMPRESSED_* type, carries those bytes as its value, and its children's offsets
point into them.

Nothing here raises on bad bytes: a broken item becomes a "Malformed" Field and
decoding goes on wherever a length field says the next item starts.
"""

from __future__ import annotations

import gc
import struct
import zlib
from contextlib import contextmanager
from functools import cache

import crc32c

from kafkasniff.protocol.compression import (
    MiB, DecompressedTooLarge, DecompressionFailed, codec_name, decompress)
from kafkasniff.protocol.embedded import decode_embedded
from kafkasniff.protocol.encoder import encode_struct
from kafkasniff.protocol.fields import DECOMPRESSED_MESSAGES, DECOMPRESSED_RECORDS, DecodeError, Field, Malformed
from kafkasniff.protocol.primitives import read_bytes, read_varint, read_varint_bytes, read_varlong
from kafkasniff.protocol.schema import data_variant

DEFAULT_MAX_DECOMPRESSED = 64 * MiB
DECOMPRESSED_NOTE = "offsets within decompressed bytes"
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CONTROL_TYPE_NAMES = {0: "ABORT", 1: "COMMIT"}


def _layout(*items: tuple[str, str, str]) -> tuple:
    """(name, wire type, struct, offset) rows for fixed-position header fields."""
    rows, at = [], 0
    for name, wire_type, fmt in items:
        st = struct.Struct(">" + fmt)
        rows.append((name, wire_type, st, at))
        at += st.size
    return tuple(rows)


_PREFIX_LAYOUT = _layout(("offset", "int64", "q"), ("length", "int32", "i"))
_BATCH_LAYOUT = _layout(
    ("base_offset", "int64", "q"), ("batch_length", "int32", "i"),
    ("partition_leader_epoch", "int32", "i"), ("magic", "int8", "b"), ("crc", "uint32", "I"),
    ("attributes", "int16", "h"), ("last_offset_delta", "int32", "i"),
    ("base_timestamp", "int64", "q"), ("max_timestamp", "int64", "q"),
    ("producer_id", "int64", "q"), ("producer_epoch", "int16", "h"),
    ("base_sequence", "int32", "i"), ("record_count", "int32", "i"))
_MESSAGE_LAYOUTS = {
    0: _layout(("offset", "int64", "q"), ("message_size", "int32", "i"), ("crc", "uint32", "I"),
               ("magic", "int8", "b"), ("attributes", "int8", "b")),
    1: _layout(("offset", "int64", "q"), ("message_size", "int32", "i"), ("crc", "uint32", "I"),
               ("magic", "int8", "b"), ("attributes", "int8", "b"), ("timestamp", "int64", "q")),
}
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_BATCH_CRC_FROM = 21  # CRC-32C covers the batch from attributes to the end
_MESSAGE_CRC_FROM = 16  # CRC-32 covers a legacy message from magic to the end
_LEGACY_PREFIX = struct.Struct(">qiIbb")
_INT64 = struct.Struct(">q")


def decode_records(buf, offset: int, end: int, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
                   partial_ok: bool = True) -> list[Field]:
    """One Field per record batch or legacy message in buf[offset:end].

    `max_decompressed` bounds the decompressed bytes of each batch. With
    `partial_ok`, an item cut off by `end` (a Fetch response filled to its size
    limit) is a "PartialBatch"; without it, a "Malformed" one.
    """
    end = min(end, len(buf))
    with _collector_paused():
        return _decode_items(buf, max(offset, 0), end, max_decompressed, partial_ok, nested=False)


@contextmanager
def _collector_paused():
    """Record trees hold no reference cycles, yet the cyclic collector kept scanning the
    many new Fields: it took three quarters of the time on a 100k-record Fetch."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def records_of(item: Field) -> list[Field]:
    """The record-level Fields of one decoded item: a batch's records, a plain legacy
    message itself, or the inner messages of a compressed wrapper."""
    if item.type == "RecordBatch":
        return [r for r in item["records"].children if r.type == "Record"]
    if item.type == "Message":
        if item.value["codec"] == "none":
            return [item]
        inner = item.child("messages")
        return [m for m in inner.children if m.type == "Message"] if inner is not None else []
    return []


def _decode_items(buf, pos: int, end: int, limit: int, partial_ok: bool, nested: bool) -> list[Field]:
    items = []
    while pos < end:
        try:
            item, pos = _decode_item(buf, pos, end, limit, partial_ok, nested)
        except Exception as exc:  # the contract is to never raise; a decoder bug still shows
            items.append(_malformed(pos, end, pos, f"internal decoder error: {exc!r}"))
            break
        items.append(item)
    return items


def _decode_item(buf, pos: int, end: int, limit: int, partial_ok: bool, nested: bool):
    present = end - pos
    if present < 12:
        return _partial(buf, pos, end, None, partial_ok), end
    (size,) = struct.unpack_from(">i", buf, pos + 8)
    if size < 0:
        return _malformed(pos, end, pos + 8, f"length {size} is negative"), end
    item_end = pos + 12 + size
    if item_end > end:
        return _partial(buf, pos, end, 12 + size, partial_ok), end
    if size < 5:
        return _malformed(pos, item_end, pos + 8, f"length {size} leaves no room for a magic byte"), item_end
    magic = _int8(buf[pos + 16])
    if magic == 2:
        return _decode_batch(buf, pos, item_end, limit), item_end
    if magic in (0, 1):
        return _decode_message(buf, pos, item_end, magic, limit, nested), item_end
    return _malformed(pos, item_end, pos + 16, f"unknown magic {magic}"), item_end


def _int8(b: int) -> int:
    return (b ^ 0x80) - 0x80


def _malformed(start: int, end: int, at: int, reason: str) -> Field:
    return Field("malformed", "Malformed", start, end - start, Malformed(at, reason), None,
                 f"offset {at}: {reason}")


def _header_fields(buf, pos: int, end: int, layout) -> list[Field]:
    """The fixed header fields that lie wholly before `end`."""
    fields = []
    for name, wire_type, st, rel in layout:
        at = pos + rel
        if at + st.size > end:
            break
        fields.append(Field(name, wire_type, at, st.size, st.unpack_from(buf, at)[0]))
    return fields


def _partial(buf, pos: int, end: int, total: int | None, partial_ok: bool) -> Field:
    present = end - pos
    if not partial_ok:
        reason = (f"item needs {total} bytes, {present} present" if total is not None
                  else f"{present} bytes are too few for an item header")
        return _malformed(pos, end, pos, reason)
    magic = _int8(buf[pos + 16]) if present > 16 else None
    layout = _BATCH_LAYOUT if magic == 2 else _MESSAGE_LAYOUTS.get(magic, _PREFIX_LAYOUT)
    note = (f"partial batch: {present} of {total} bytes present" if total is not None
            else f"partial batch: {present} bytes present, length unreadable")
    return Field("partial_batch", "PartialBatch", pos, present,
                 {"magic": magic, "bytes_present": present, "bytes_total": total},
                 _header_fields(buf, pos, end, layout), note)


def _crc_note(stored: int, computed: int) -> str:
    return "valid" if stored == computed else f"INVALID (computed 0x{computed:08X})"


# --- record batches (magic 2) ------------------------------------------------

def _decode_batch(buf, pos: int, end: int, limit: int) -> Field:
    if end - pos < _BATCH_HEADER.size:
        return _malformed(pos, end, pos + 8,
                          f"batch_length {end - pos - 12} is below the {_BATCH_HEADER.size - 12}-byte header")
    (base_offset, _, _, _, crc, attributes, _, base_timestamp, max_timestamp, producer_id, _, _,
     record_count) = _BATCH_HEADER.unpack_from(buf, pos)
    children = _header_fields(buf, pos, end, _BATCH_LAYOUT)
    computed = crc32c.crc32c(memoryview(buf)[pos + _BATCH_CRC_FROM:end])
    children[4].note = _crc_note(crc, computed)
    children[5].children = _batch_attribute_fields(attributes, pos + _BATCH_CRC_FROM)
    codec = attributes & 7
    is_control = bool(attributes & 0x20)
    context = _BatchContext(base_offset, base_timestamp,
                            max_timestamp if attributes & 0x08 else None, is_control)
    children.append(_batch_records(buf, pos + _BATCH_HEADER.size, end, codec, limit, context, record_count))
    value = {"magic": 2, "codec": codec_name(codec), "crc_valid": crc == computed,
             "crc_computed": computed, "record_count": record_count, "base_offset": base_offset,
             "producer_id": producer_id, "is_transactional": bool(attributes & 0x10),
             "is_control": is_control}
    return Field("record_batch", "RecordBatch", pos, end - pos, value, children)


def _batch_attribute_fields(attributes: int, at: int) -> list[Field]:
    codec = attributes & 7
    ts_type = (attributes >> 3) & 1
    return [
        Field("codec", "bits", at, 2, codec, note=codec_name(codec)),
        Field("timestamp_type", "bits", at, 2, ts_type, note=TIMESTAMP_TYPES[ts_type]),
        Field("is_transactional", "bits", at, 2, bool(attributes & 0x10)),
        Field("is_control", "bits", at, 2, bool(attributes & 0x20)),
        Field("has_delete_horizon", "bits", at, 2, bool(attributes & 0x40)),
    ]


class _BatchContext:
    """What every record of a batch needs from the batch header."""

    __slots__ = ("base_offset", "base_timestamp", "log_append_time", "is_control")

    def __init__(self, base_offset: int, base_timestamp: int, log_append_time: int | None,
                 is_control: bool):
        self.base_offset = base_offset
        self.base_timestamp = base_timestamp
        self.log_append_time = log_append_time  # with LogAppendTime every record has max_timestamp
        self.is_control = is_control


def _batch_records(buf, start: int, end: int, codec: int, limit: int, context: _BatchContext,
                   record_count: int) -> Field:
    if codec == 0:
        records, note = _decode_record_list(buf, start, end, context, record_count)
        return Field("records", "[]Record", start, end - start, None, records, note)
    try:
        data = decompress(codec, memoryview(buf)[start:end], limit)
    except DecompressedTooLarge as exc:
        return Field("records", DECOMPRESSED_RECORDS, start, end - start, None, [],
                     f"{exc}; records not shown")
    except DecompressionFailed as exc:
        return Field("records", DECOMPRESSED_RECORDS, start, end - start, None, [],
                     f"decompression failed: {exc}")
    records, note = _decode_record_list(memoryview(data), 0, len(data), context, record_count)
    note = DECOMPRESSED_NOTE if note is None else f"{DECOMPRESSED_NOTE}; {note}"
    return Field("records", DECOMPRESSED_RECORDS, start, end - start, data, records, note)


def _decode_record_list(buf, pos: int, end: int, context: _BatchContext, record_count: int):
    records = []
    decoded = 0
    while pos < end:
        start = pos
        try:
            length, body = _small_varint(buf, pos, end)
            if length < 0 or length > end - body:
                raise DecodeError(start, f"record length {length} does not fit the {end - body} bytes left")
        except DecodeError as exc:
            records.append(_malformed(start, end, exc.offset, exc.reason))
            break
        pos = body + length
        try:
            records.append(_decode_record(buf, start, body, pos, context))
            decoded += 1
        except DecodeError as exc:
            records.append(_malformed(start, pos, exc.offset, exc.reason))
    note = None if decoded == record_count else f"record_count is {record_count} but {decoded} records decoded"
    return records, note


def _small_varint(buf, pos: int, end: int, read_any=read_varint):
    """A zig-zag varint or varlong, with a fast path for the one-byte values that
    dominate record fields (a Fetch can hold 100k records)."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    return read_any(buf, pos, end)


def _decode_record(b, start: int, body: int, end: int, context: _BatchContext) -> Field:
    if body >= end:
        raise DecodeError(body, "record has no attributes byte")
    ts_at = body + 1
    ts_delta, od_at = _small_varint(b, ts_at, end, read_varlong)
    offset_delta, key_at = _small_varint(b, od_at, end)
    key, value_at = read_varint_bytes(b, key_at, end)
    value, headers_at = read_varint_bytes(b, value_at, end)
    header_count, pos = _small_varint(b, headers_at, end)
    if header_count < 0:
        raise DecodeError(headers_at, f"header count {header_count} is negative")
    headers = []
    header_fields = []
    for _ in range(header_count):
        header_at = pos
        raw_key, hv_at = read_varint_bytes(b, pos, end)
        if raw_key is None:
            raise DecodeError(header_at, "header key is null")
        try:
            header_key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError(header_at, "header key is not valid UTF-8") from None
        header_value, pos = read_varint_bytes(b, hv_at, end)
        headers.append([header_key, header_value])
        header_fields.append(Field("header", "Header", header_at, pos - header_at, None, [
            Field("key", "string", header_at, hv_at - header_at, header_key),
            Field("value", "bytes", hv_at, pos - hv_at, header_value)]))
    if pos != end:
        raise DecodeError(pos, f"{end - pos} bytes left over after the record's headers")

    offset = context.base_offset + offset_delta
    timestamp = context.log_append_time
    if timestamp is None:
        timestamp = context.base_timestamp + ts_delta
    key_field = Field("key", "bytes", key_at, value_at - key_at, key)
    value_field = Field("value", "bytes", value_at, headers_at - value_at, value)
    if context.is_control:
        _annotate_control(key_field, value_field, key, value)
    return Field("record", "Record", start, end - start,
                 {"offset": offset, "timestamp": timestamp, "key": key, "value": value, "headers": headers},
                 [Field("length", "varint", start, body - start, end - body),
                  Field("attributes", "int8", body, 1, _int8(b[body])),
                  Field("timestamp_delta", "varlong", ts_at, od_at - ts_at, ts_delta, note=f"timestamp {timestamp}"),
                  Field("offset_delta", "varint", od_at, key_at - od_at, offset_delta, note=f"offset {offset}"),
                  key_field, value_field,
                  Field("headers", "[]Header", headers_at, pos - headers_at, None, header_fields)])


@cache
def _embedded_size(schema: str) -> int:
    """Bytes of a data schema's version 0 with default values: its int16 version and fixed fields."""
    return 2 + len(encode_struct(data_variant(schema, 0), 0, {}))


def _annotate_control(key_field: Field, value_field: Field, key: bytes | None, value: bytes | None) -> None:
    """A control record's key is a ControlRecordTypeSchema, its value an EndTxnMarker: Kafka data schemas,
    each an int16 version and then the schema's fields, decoded from the generated table."""
    for field, raw, schema, kind in ((key_field, key, "ControlRecordTypeSchema", "ControlRecordKey"),
                                     (value_field, value, "EndTxnMarker", "ControlRecordValue")):
        fields, _ = decode_embedded(raw or b"", 0, len(raw or b""), schema)
        if len(fields) < 2:
            field.note = f"control record {field.name} needs {_embedded_size(schema)} bytes"
            continue
        at = field.end - len(raw)
        for f in fields:
            f.offset += at
        field.type, field.children = kind, fields
    if key_field.children:
        control_type = key_field["Type"]
        control_type.note = CONTROL_TYPE_NAMES.get(control_type.value, "unknown")


# --- legacy messages (magic 0 and 1) -----------------------------------------

def _decode_message(buf, pos: int, end: int, magic: int, limit: int, nested: bool) -> Field:
    layout = _MESSAGE_LAYOUTS[magic]
    header_end = pos + layout[-1][3] + layout[-1][2].size
    if header_end + 8 > end:  # + int32 key length + int32 value length
        return _malformed(pos, end, pos + 8,
                          f"message_size {end - pos - 12} is below the {header_end + 8 - pos - 12}-byte "
                          f"minimum for magic {magic}")
    offset, _, crc, _, attributes = _LEGACY_PREFIX.unpack_from(buf, pos)
    timestamp = _INT64.unpack_from(buf, pos + 18)[0] if magic == 1 else None
    children = _header_fields(buf, pos, end, layout)
    computed = zlib.crc32(memoryview(buf)[pos + _MESSAGE_CRC_FROM:end])
    children[2].note = _crc_note(crc, computed)
    codec = attributes & 7
    children[4].children = _message_attribute_fields(attributes, pos + 17, magic)
    try:
        key, value_at = read_bytes(buf, header_end, end)
        value, value_end = read_bytes(buf, value_at, end)
    except DecodeError as exc:
        return _malformed(pos, end, exc.offset, exc.reason)
    children.append(Field("key", "bytes", header_end, value_at - header_end, key))
    value_field = Field("value", "bytes", value_at, value_end - value_at, value)
    children.append(value_field)
    note = f"{end - value_end} bytes left over after the value" if value_end != end else None
    facts = {"magic": magic, "codec": codec_name(codec), "crc_valid": crc == computed,
             "crc_computed": computed, "record_count": 1, "base_offset": offset, "producer_id": -1,
             "is_transactional": False, "is_control": False,
             "offset": offset, "timestamp": timestamp, "key": key, "value": value, "headers": []}
    if codec:
        if nested:
            value_field.note = "nested compressed message (Kafka rejects these); not decompressed"
        elif value is None:
            value_field.note = "compressed wrapper message without a value"
        else:
            inner = _wrapper_contents(buf, value_at + 4, value_end, codec, limit, magic, offset,
                                      timestamp if attributes & 0x08 and magic == 1 else None)
            children.append(inner)
            messages = [m for m in inner.children if m.type == "Message"]
            facts["record_count"] = len(messages)
            if messages:
                facts["base_offset"] = messages[0].value["offset"]
    return Field("message", "Message", pos, end - pos, facts, children, note)


def _message_attribute_fields(attributes: int, at: int, magic: int) -> list[Field]:
    codec = attributes & 7
    fields = [Field("codec", "bits", at, 1, codec, note=codec_name(codec))]
    if magic == 1:
        ts_type = (attributes >> 3) & 1
        fields.append(Field("timestamp_type", "bits", at, 1, ts_type, note=TIMESTAMP_TYPES[ts_type]))
    return fields


def _wrapper_contents(buf, start: int, end: int, codec: int, limit: int, magic: int,
                      wrapper_offset: int, log_append_time: int | None) -> Field:
    try:
        data = decompress(codec, memoryview(buf)[start:end], limit)
    except DecompressedTooLarge as exc:
        return Field("messages", DECOMPRESSED_MESSAGES, start, end - start, None, [], f"{exc}; records not shown")
    except DecompressionFailed as exc:
        return Field("messages", DECOMPRESSED_MESSAGES, start, end - start, None, [],
                     f"decompression failed: {exc}")
    inner = _decode_items(memoryview(data), 0, len(data), limit, partial_ok=False, nested=True)
    messages = [m for m in inner if m.type == "Message"]
    shift = wrapper_offset - messages[-1].value["offset"] if magic == 1 and messages else -1
    if shift >= 0:
        # Inner offsets of a magic-1 wrapper are relative and the wrapper holds the last absolute
        # one; like Kafka, keep them as they are when that would make offsets negative (some
        # producers write wrapper offset 0).
        for m in messages:
            m.value["offset"] += shift
            m.value["base_offset"] = m.value["offset"]
            m["offset"].note = f"absolute offset {m.value['offset']}"
    if log_append_time is not None:
        for m in messages:
            m.value["timestamp"] = log_append_time
    return Field("messages", DECOMPRESSED_MESSAGES, start, end - start, data, inner, DECOMPRESSED_NOTE)
