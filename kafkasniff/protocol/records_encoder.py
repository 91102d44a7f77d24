"""Build Kafka record batches (magic 2) and legacy messages (magic 0/1) with valid CRCs.

Used by tests to make exact frames; the decoder in records.py never depends on it.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import crc32c

from kafkasniff.protocol.compression import CODEC_IDS, compress
from kafkasniff.protocol.primitives import write_varint, write_varint_bytes, write_varlong

CONTROL_TYPES = {"abort": 0, "commit": 1}

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # base_offset ... record_count, 61 bytes
_CRC_START = 21  # the batch CRC covers attributes to the end
_LEGACY_PREFIX = struct.Struct(">qiI")  # offset, message_size, crc


@dataclass
class Record:
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_delta: int = 0
    offset_delta: int | None = None  # None: the record's index in the batch
    attributes: int = 0


def control_record(kind: str, coordinator_epoch: int = 0, timestamp_delta: int = 0) -> Record:
    """The single record of a control batch: key (version, type), value (version, coordinator epoch)."""
    return Record(key=struct.pack(">hh", 0, CONTROL_TYPES[kind]),
                  value=struct.pack(">hi", 0, coordinator_epoch),
                  timestamp_delta=timestamp_delta)


def encode_record(rec: Record, offset_delta: int) -> bytes:
    body = b"".join([
        struct.pack(">b", rec.attributes),
        write_varlong(rec.timestamp_delta),
        write_varint(offset_delta),
        write_varint_bytes(rec.key),
        write_varint_bytes(rec.value),
        write_varint(len(rec.headers)),
        *(write_varint_bytes(k.encode()) + write_varint_bytes(v) for k, v in rec.headers),
    ])
    return write_varint(len(body)) + body


def encode_record_batch(records: list[Record], *, base_offset: int = 0, codec: str = "none",
                        partition_leader_epoch: int = -1, log_append_time: bool = False,
                        is_transactional: bool = False, is_control: bool = False,
                        has_delete_horizon: bool = False, base_timestamp: int = 0,
                        max_timestamp: int | None = None, producer_id: int = -1,
                        producer_epoch: int = -1, base_sequence: int = -1,
                        record_count: int | None = None, xerial_snappy: bool = True,
                        compressed_payload: bytes | None = None) -> bytes:
    """`compressed_payload`, when given, is written as the records bytes instead of `records`."""
    deltas = [i if r.offset_delta is None else r.offset_delta for i, r in enumerate(records)]
    codec_id = CODEC_IDS[codec]
    if compressed_payload is not None:
        payload = compressed_payload
    else:
        payload = b"".join(encode_record(r, d) for r, d in zip(records, deltas))
        if codec_id:
            payload = compress(codec_id, payload, xerial_snappy=xerial_snappy)
    attributes = (codec_id | log_append_time << 3 | is_transactional << 4 | is_control << 5
                  | has_delete_horizon << 6)
    if max_timestamp is None:
        max_timestamp = base_timestamp + max((r.timestamp_delta for r in records), default=0)
    header = bytearray(_BATCH_HEADER.pack(
        base_offset, _BATCH_HEADER.size - 12 + len(payload), partition_leader_epoch, 2, 0,
        attributes, max(deltas, default=0), base_timestamp, max_timestamp, producer_id,
        producer_epoch, base_sequence, len(records) if record_count is None else record_count))
    crc = crc32c.crc32c(payload, crc32c.crc32c(header[_CRC_START:]))
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + payload


def encode_message(*, magic: int, offset: int = 0, key: bytes | None = None,
                   value: bytes | None = None, timestamp: int = -1, attributes: int = 0) -> bytes:
    """One legacy message (magic 0 or 1); `timestamp` is written for magic 1 only."""
    body = struct.pack(">bb", magic, attributes)
    if magic >= 1:
        body += struct.pack(">q", timestamp)
    body += _int32_bytes(key) + _int32_bytes(value)
    return _LEGACY_PREFIX.pack(offset, 4 + len(body), zlib.crc32(body)) + body


def encode_message_set(messages: list[Record], *, magic: int, codec: str = "none",
                       base_offset: int = 0, timestamp: int = -1, log_append_time: bool = False,
                       relative_inner_offsets: bool | None = None, xerial_snappy: bool = True,
                       legacy_lz4_checksum: bool | None = None) -> bytes:
    """Legacy messages, one after another; with a codec, one wrapper message holding them.

    Record.timestamp_delta is added to `timestamp` for magic 1. Inner offsets of a
    magic-1 wrapper are relative (0, 1, ...) and the wrapper carries the last absolute
    offset, as Kafka writes them; magic-0 inner offsets are absolute.
    """
    ts_type = log_append_time << 3 if magic >= 1 else 0
    codec_id = CODEC_IDS[codec]
    relative = magic >= 1 if relative_inner_offsets is None else relative_inner_offsets
    inner = b"".join(
        encode_message(magic=magic, offset=(i if (codec_id and relative) else base_offset + i),
                       key=m.key, value=m.value, timestamp=timestamp + m.timestamp_delta,
                       attributes=ts_type)
        for i, m in enumerate(messages))
    if not codec_id:
        return inner
    legacy_lz4 = magic == 0 if legacy_lz4_checksum is None else legacy_lz4_checksum
    wrapped = compress(codec_id, inner, xerial_snappy=xerial_snappy, legacy_lz4_checksum=legacy_lz4)
    return encode_message(magic=magic, offset=base_offset + len(messages) - 1, value=wrapped,
                          timestamp=timestamp, attributes=codec_id | ts_type)


def _int32_bytes(b: bytes | None) -> bytes:
    return struct.pack(">i", -1) if b is None else struct.pack(">i", len(b)) + b
