"""The `records` bytes of Produce and Fetch as Fields: record batches (magic 2) and legacy message sets.

The walker reads them (records.c); this is the Field view that tests, explain and --hex use. Every item
becomes one Field whose offsets are absolute in the caller's buffer. Records inside a compressed batch or
wrapper message are decoded from the decompressed bytes: their container Field has a DECOMPRESSED_* type,
carries those bytes as its value, and its children's offsets point into them. Nothing raises on bad bytes:
a broken item (or a run of them) becomes one "Malformed" Field and reading goes on wherever a length field
says the next item starts.
"""

from __future__ import annotations

import zlib

from kafkasniff.protocol import compression
from kafkasniff.protocol.fields import DECOMPRESSED_MESSAGES, DECOMPRESSED_RECORDS, Field  # noqa: F401 (theirs)
from kafkasniff.protocol.walker import DEFAULT_MAX_DECOMPRESSED, records_fields

DECOMPRESSED_NOTE = "offsets within decompressed bytes"  # the same words as records.c


def decode_records(buf, offset: int, end: int, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
                   partial_ok: bool = True) -> list[Field]:
    """One Field per record batch or legacy message in buf[offset:end].

    `max_decompressed` bounds the decompressed bytes of each batch, and of all of them together. With
    `partial_ok`, an item cut off by `end` (a Fetch response filled to its size limit) is a "PartialBatch";
    without it, a "Malformed" one.
    """
    end = min(end, len(buf))
    return records_fields(buf, max(offset, 0), end, max_decompressed, partial_ok)


def starts_with_checked_batch(buf, pos: int, end: int) -> bool:
    """Whether buf[pos:end] begins with a whole record batch (magic 2) or legacy message (magic 0 or 1) whose
    checksum holds. Such bytes are the records of a Produce or Fetch: a size prefix read in front of them (the
    records field's length, in versions where it is an int32) may claim exactly the bytes to the message's end,
    and a batch whose base offset is 0 reads as correlation id 0 and a response that fits (SaslAuthenticate v0:
    an error code, a string and bytes). A checksum holds by chance once in 4 billion."""
    end = min(end, len(buf))
    if end - pos < _LEGACY_MIN_BYTES:
        return False
    length = int.from_bytes(buf[pos + 8:pos + 12], "big", signed=True)  # after the base offset
    magic = buf[pos + 16]
    if magic == 2:
        if not _BATCH_MIN_LENGTH <= length <= end - pos - 12:
            return False
        return int.from_bytes(buf[pos + 17:pos + 21], "big") == compression.crc32c(buf[pos + 21:pos + 12 + length])
    if magic in (0, 1):
        if not _LEGACY_MIN_LENGTH <= length <= end - pos - 12:
            return False
        return int.from_bytes(buf[pos + 12:pos + 16], "big") == zlib.crc32(buf[pos + 16:pos + 12 + length])
    return False


# The shortest of each: a batch's header after its length (49 bytes), a legacy message after its size (checksum,
# magic, attributes, and the lengths of a null key and value: 14 bytes); a legacy message's first 17 bytes hold its
# magic.
_BATCH_MIN_LENGTH = 49
_LEGACY_MIN_LENGTH = 14
_LEGACY_MIN_BYTES = 12 + _LEGACY_MIN_LENGTH


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
