"""The walker's Python side: what the C walk (`_walk`) asks of Python, and the calls the rest of the package makes.

The walk runs a program (program.py) over bytes with one builder per view:

- `summarize` (called by messages.pyx): ids, error codes, topics and record counts, no objects per field
  (pairing, filters, one line);
- `field_tree`: the Field tree (-V, --hex, explain);
- `json_body`: the body as JSON text (--json), records included, in the same pass;
- `partition_facts` (messages.partition_facts): per partition, its numbers and record batch headers, packed
  (the analyses: lag, latency).

It calls back here only for what is rare or belongs to Python: names of error codes, decompression (cramjam,
bounded per batch and per message), checksums (crc32c, zlib), programs of embedded schemas (the consumer
protocol inside JoinGroup and SyncGroup, control records), SASL tokens, and float formatting.
"""

from __future__ import annotations

import zlib
from functools import cache

from kafkasniff.protocol import _walk, compression
from kafkasniff.protocol.compression import RECENT_BATCHES, MiB, DecompressedTooLarge, DecompressionFailed
from kafkasniff.protocol.errors import error_name
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.program import program_for
from kafkasniff.protocol.schema import data_variant, data_version_range
from kafkasniff.protocol.topics import topic_text

# Decompressed bytes one record batch, and one message in all, may produce: what is beyond is not shown.
DEFAULT_MAX_DECOMPRESSED = 64 * MiB
# Where JSON text is handed to its writer, between whole record batches.
JSON_FLUSH_BYTES = 1 << 20

# Schemas carried inside bytes fields, in the order of walk.h's enum embedded.
EMBEDDED_SCHEMAS = ("ConsumerProtocolSubscription", "ConsumerProtocolAssignment", "ControlRecordTypeSchema",
                    "EndTxnMarker")


def embedded_program(which: int, version: int) -> _walk.Program | None:
    """An embedded schema at the version its bytes give; like Kafka, a newer version is read with the newest
    schema known (fields are only ever appended)."""
    schema = EMBEDDED_SCHEMAS[which]
    lo, hi = data_version_range(schema)
    if version < lo:
        return None
    return program_for(data_variant(schema, min(version, hi)), min(version, hi), schema)


def embedded_size(which: int) -> int:
    """Bytes of an embedded schema's version 0 with default values: its int16 version and fixed fields."""
    from kafkasniff.protocol.encoder import encode_struct

    schema = EMBEDDED_SCHEMAS[which]
    return 2 + len(encode_struct(data_variant(schema, 0), 0, {}))


def float_json(value: float) -> bytes:
    import orjson

    return orjson.dumps(value)


_walk.set_hooks({
    "field_type": Field, "malformed_type": Malformed, "error_name": error_name, "decompress": RECENT_BATCHES.decompress,
    "decompression_failed": DecompressionFailed, "too_large": DecompressedTooLarge, "embedded": embedded_program,
    "embedded_size": embedded_size, "crc32c": lambda data: compression.crc32c(data), "crc32": zlib.crc32,
    "float_json": float_json, "topic_text": topic_text,
})


def field_tree(program: _walk.Program, buf, pos: int, end: int, ctx=None, limit: int = DEFAULT_MAX_DECOMPRESSED,
               record_limit: int = 0) -> tuple[Field, Malformed | None]:
    """The Field tree of one struct in buf[pos:end], and where and why it stopped, if it did. Past
    `record_limit` records (0: no limit), the rest of a records list is one RecordsNotShown Field."""
    root, _, failure = _walk.field_tree(program, buf, pos, end, ctx, limit, record_limit)
    return root, Malformed(*failure) if failure is not None else None


def json_body(program: _walk.Program, buf, pos: int, end: int, ctx=None, write=None, prefix: int = 4,
              limit: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """The struct at buf[pos:end] as JSON text. With `write`, whole record batches go to write(bytes) as the
    text grows, and the rest is returned. `prefix` is added to frame offsets in malformed records."""
    return _walk.json_body(program, buf, pos, end, ctx, write, JSON_FLUSH_BYTES, prefix, limit)


# What record_columns hands on (rows.c): what the records of a batch share (a group each), and a column per record
# value, as (name, array typecode): native-endian, NULL_INT64 / NULL_INT32 where the value is null (or, for offsets
# and timestamps, past 64 bits).
RECORD_GROUP = ("topic", "topic_id", "partition", "codec", "magic", "producer_id", "is_transactional", "is_control")
RECORD_COLUMNS = (("offset", "q"), ("timestamp", "q"), ("key_size", "i"), ("value_size", "i"), ("header_count", "i"),
                  ("crc_valid", "B"), ("group", "i"))
NULL_INT64, NULL_INT32 = _walk.NULL_INT64, _walk.NULL_INT32


def record_columns(program: _walk.Program, buf, pos: int, end: int, emit, every: int,
                   limit: int = DEFAULT_MAX_DECOMPRESSED) -> int:
    """The records of the body at buf[pos:end], read in one pass and handed on in chunks of at most `every`:
    emit(count, [RECORD_GROUP tuple], RECORD_COLUMNS' bytes...), timestamps in microseconds. Returns how many."""
    return _walk.record_columns(program, buf, pos, end, limit, emit, every)


# The words of each record batch in partition_facts' packed partitions (partitions.c), in order.
BATCH_FACTS = ("base_offset", "last_offset_delta", "record_count", "is_control", "max_timestamp")


# Where -V text is handed to its writer, between lines.
TEXT_FLUSH_BYTES = 1 << 18
MARK_TOPIC_IDS = True  # text_tree's topic_names, for a parallel worker (see there)


def text_tree(roots: tuple, buf, limit: int | None, show_secrets: bool, spans: bool, ctx=None,
              topic_names: dict | None = None, write=None,
              decompress_limit: int = DEFAULT_MAX_DECOMPRESSED) -> tuple[bytes, bytes | None]:
    """The -V tree lines of a message's header and body: roots are ((program, type text, pos, end), ...).
    Values are cut to `limit` characters (None: whole). With `spans`, styles come as int32 triples (start,
    end, style) over the text. `topic_names` (topic id -> name) names topics given by id only, or, as
    MARK_TOPIC_IDS, marks each such id (NUL, the id, NUL) for a parallel decode's parent to name in capture
    order. With `write`, text goes to write(text, spans) as it grows; the rest is returned."""
    return _walk.text_tree(roots, buf, -1 if limit is None else limit, show_secrets, spans, ctx, _api_names(),
                           topic_names, write, TEXT_FLUSH_BYTES, decompress_limit)


@cache
def _api_names() -> dict[int, str]:
    from kafkasniff.protocol.schema import apis

    return {key: api["name"] for key, api in apis().items()}


def records_fields(buf, pos: int, end: int, limit: int = DEFAULT_MAX_DECOMPRESSED, partial_ok: bool = True,
                   record_limit: int = 0) -> list[Field]:
    return _walk.records_fields(buf, pos, end, limit, partial_ok, record_limit)


def records_json(buf, pos: int, end: int, prefix: int = 4, limit: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    return _walk.records_json(buf, pos, end, prefix, limit)
