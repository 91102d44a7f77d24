"""The `records` bytes of Produce and Fetch as Fields: record batches (magic 2) and legacy message sets.

The walker reads them (records.c); this is the Field view that tests, explain and --hex use. Every item
becomes one Field whose offsets are absolute in the caller's buffer. Records inside a compressed batch or
wrapper message are decoded from the decompressed bytes: their container Field has a DECOMPRESSED_* type,
carries those bytes as its value, and its children's offsets point into them. Nothing raises on bad bytes:
a broken item (or a run of them) becomes one "Malformed" Field and reading goes on wherever a length field
says the next item starts.
"""

from __future__ import annotations

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
