"""Record batches and legacy message sets: encoder-built, client-built and seed bytes, decoded exactly."""

import gc
import re
import struct
from pathlib import Path

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioDefaultBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from kafkasniff.protocol.compression import CODEC_IDS
from kafkasniff.protocol.fields import Malformed
from kafkasniff.protocol.records import (
    DECOMPRESSED_MESSAGES, DECOMPRESSED_RECORDS, decode_records, records_of, starts_with_checked_batch)
from kafkasniff.protocol.records_encoder import (
    Record, control_record, encode_message, encode_message_set, encode_record, encode_record_batch)

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def decode(buf, **kw):
    return decode_records(buf, 0, len(buf), **kw)


def client_records(buf):
    """kafka-python's own reading of a records buffer."""
    memory = MemoryRecords(buf)
    batches = iter(memory.next_batch, None)
    return [r for batch in batches for r in batch]


def plain(record_fields):
    return [(r.value["offset"], r.value["timestamp"], r.value["key"], r.value["value"], r.value["headers"])
            for r in record_fields]


# --- the seed's Produce v0 message -------------------------------------------

def seed_produce_v0_frame() -> bytes:
    text = (SEEDS / "001_70453c66919b3262.txt").read_text()
    dump = text.split("Hex Dump", 1)[1]
    return bytes(int(h, 16) for h in re.findall(r"0x([0-9A-Fa-f]{2})", dump))


def test_seed_produce_v0_message_decodes_with_valid_crc():
    frame = seed_produce_v0_frame()
    assert len(frame) == 82  # 4-byte size prefix + 78
    (item,) = decode_records(frame, 45, 82)  # the 37-byte message set after "message set size"
    assert (item.type, item.offset, item.length) == ("Message", 45, 37)
    crc = item["crc"]
    assert (crc.offset, crc.length, crc.value, crc.note) == (57, 4, 0x73ACF77C, "valid")
    assert item.value["crc_valid"] and item.value["crc_computed"] == 0x73ACF77C
    assert [(c.name, c.offset, c.length, c.value) for c in item.children] == [
        ("offset", 45, 8, 0), ("message_size", 53, 4, 25), ("crc", 57, 4, 0x73ACF77C),
        ("magic", 61, 1, 0), ("attributes", 62, 1, 0), ("key", 63, 4, None),
        ("value", 67, 15, b"hello world")]
    assert item["attributes"]["codec"].note == "none"
    assert records_of(item) == [item]
    # The encoder writes the very same bytes.
    assert encode_message(magic=0, value=b"hello world") == frame[45:]


# --- legacy message sets -----------------------------------------------------

MESSAGES = [Record(value=b"first"), Record(key=b"k2", value=b"second", timestamp_delta=5),
            Record(key=b"k3", value=None, timestamp_delta=9)]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_encoder_legacy_message_sets(magic, codec):
    buf = encode_message_set(MESSAGES, magic=magic, codec=codec, base_offset=40, timestamp=1_700_000_000_000)
    items = decode(buf)
    assert all(i.value["crc_valid"] and i.value["magic"] == magic and i.value["codec"] == codec for i in items)
    ts = [1_700_000_000_000, 1_700_000_000_005, 1_700_000_000_009] if magic else [None] * 3
    assert plain(r for i in items for r in records_of(i)) == [
        (40, ts[0], None, b"first", []), (41, ts[1], b"k2", b"second", []), (42, ts[2], b"k3", None, [])]
    if codec == "none":
        assert [(i.offset, i.length) for i in items] == [(0, 31 + 8 * magic), (31 + 8 * magic, 34 + 8 * magic),
                                                          (65 + 16 * magic, 28 + 8 * magic)]
    else:
        (wrapper,) = items
        assert wrapper.value["record_count"] == 3 and wrapper.value["base_offset"] == 40
        inner = wrapper["messages"]
        assert inner.type == DECOMPRESSED_MESSAGES and inner.note == "offsets within decompressed bytes"
        value = wrapper["value"]
        assert (inner.offset, inner.length) == (value.offset + 4, value.length - 4)
        # Inner offsets index the decompressed bytes the container carries.
        assert [bytes(inner.value[m.offset:m.end]) for m in inner.children] == [
            encode_message(magic=magic, offset=i if magic else 40 + i, key=m.key, value=m.value,
                           timestamp=1_700_000_000_000 + m.timestamp_delta if magic else -1)
            for i, m in enumerate(MESSAGES)]


def test_magic1_wrapper_inner_offsets_are_relative_to_the_last():
    buf = encode_message_set(MESSAGES, magic=1, codec="gzip", base_offset=8)
    (wrapper,) = decode(buf)
    assert wrapper["offset"].value == 10  # the wrapper carries the last inner offset
    inner = wrapper["messages"].children
    assert [m["offset"].value for m in inner] == [0, 1, 2]
    assert [m["offset"].note for m in inner] == ["absolute offset 8", "absolute offset 9", "absolute offset 10"]
    assert [m.value["offset"] for m in inner] == [8, 9, 10]


def test_magic0_wrapper_inner_offsets_are_absolute():
    buf = encode_message_set(MESSAGES, magic=0, codec="snappy", base_offset=100)
    (wrapper,) = decode(buf)
    assert [m["offset"].value for m in wrapper["messages"].children] == [100, 101, 102]
    assert [m["offset"].note for m in wrapper["messages"].children] == [None] * 3


def test_magic1_log_append_time_wrapper_stamps_its_messages():
    buf = encode_message_set(MESSAGES, magic=1, codec="lz4", timestamp=555, log_append_time=True)
    (wrapper,) = decode(buf)
    assert wrapper["attributes"]["timestamp_type"].note == "LogAppendTime"
    assert [m.value["timestamp"] for m in records_of(wrapper)] == [555, 555, 555]


@pytest.mark.parametrize("magic, codec", [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)])
def test_kafka_python_legacy_builder(magic, codec):
    """kafka-python's own builder (magic-0 lz4 needs the xxhash package, so our encoder covers it)."""
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for i in range(5):
        builder.append(i, timestamp=1_600_000_000_000 + i, key=b"key%d" % i if i % 2 else None,
                       value=b"value %d " % i * 20)
    buf = bytes(builder.build())
    expected = [(r.offset, r.timestamp, r.key, r.value, []) for r in client_records(buf)]
    assert len(expected) == 5
    items = decode(buf)
    assert len(items) == (1 if codec else 5) and all(i.value["crc_valid"] for i in items)
    assert plain(r for i in items for r in records_of(i)) == expected


# --- record batches ----------------------------------------------------------

RECORDS = [
    Record(key=b"k0", value=b"v" * 100, headers=[("trace", b"abc"), ("empty", None)]),
    Record(key=None, value=b"second", timestamp_delta=7),
    Record(key=b"k2", value=None, timestamp_delta=3, offset_delta=5),
]


@pytest.mark.parametrize("codec", CODECS)
def test_encoder_batch_each_codec(codec):
    buf = encode_record_batch(RECORDS, codec=codec, base_offset=1000, base_timestamp=1_700_000_000_000,
                              producer_id=77, producer_epoch=3, base_sequence=12, partition_leader_epoch=9)
    (batch,) = decode(buf)
    assert (batch.type, batch.offset, batch.length) == ("RecordBatch", 0, len(buf))
    assert batch.value == {
        "magic": 2, "codec": codec, "crc_valid": True, "crc_computed": struct.unpack_from(">I", buf, 17)[0],
        "record_count": 3, "base_offset": 1000, "producer_id": 77, "is_transactional": False,
        "is_control": False}
    assert [(c.name, c.offset, c.length, c.value) for c in batch.children[:-1]] == [
        ("base_offset", 0, 8, 1000), ("batch_length", 8, 4, len(buf) - 12),
        ("partition_leader_epoch", 12, 4, 9), ("magic", 16, 1, 2), ("crc", 17, 4, batch.value["crc_computed"]),
        ("attributes", 21, 2, CODEC_IDS[codec]), ("last_offset_delta", 23, 4, 5),
        ("base_timestamp", 27, 8, 1_700_000_000_000), ("max_timestamp", 35, 8, 1_700_000_000_007),
        ("producer_id", 43, 8, 77), ("producer_epoch", 51, 2, 3), ("base_sequence", 53, 4, 12),
        ("record_count", 57, 4, 3)]
    assert batch["crc"].note == "valid"
    assert batch["attributes"]["codec"].note == codec
    assert plain(records_of(batch)) == [
        (1000, 1_700_000_000_000, b"k0", b"v" * 100, [["trace", b"abc"], ["empty", None]]),
        (1001, 1_700_000_000_007, None, b"second", []),
        (1005, 1_700_000_000_003, b"k2", None, [])]
    records = batch["records"]
    assert (records.offset, records.length) == (61, len(buf) - 61)
    source = buf if codec == "none" else records.value
    assert records.type == ("[]Record" if codec == "none" else DECOMPRESSED_RECORDS)
    assert records.note == (None if codec == "none" else "offsets within decompressed bytes")
    first = records.children[0]
    # Each record's span re-encodes to the same bytes, wherever it lives.
    base = 61 if codec == "none" else 0
    assert [(r.offset, r.length) for r in records.children] == [(base, 128), (base + 128, 13), (base + 141, 9)]
    assert [bytes(source[r.offset:r.end]) for r in records.children] == [
        encode_record(r, d) for r, d in zip(RECORDS, [0, 1, 5])]
    assert [(c.name, c.offset - base, c.length, c.value, c.note) for c in first.children[:-1]] == [
        ("length", 0, 2, 126, None), ("attributes", 2, 1, 0, None),
        ("timestamp_delta", 3, 1, 0, "timestamp 1700000000000"), ("offset_delta", 4, 1, 0, "offset 1000"),
        ("key", 5, 3, b"k0", None), ("value", 8, 102, b"v" * 100, None)]
    headers = first["headers"]
    assert (headers.offset - base, headers.length) == (110, 18)
    assert [h.to_python() for h in headers.children] == [{"key": "trace", "value": b"abc"},
                                                         {"key": "empty", "value": None}]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("builder_class", [DefaultRecordBatchBuilder, AioDefaultBuilder],
                         ids=["kafka-python", "aiokafka"])
def test_client_built_batches(builder_class, codec):
    """Batches from the clients' own builders, compared with the clients' own reader."""
    builder = builder_class(magic=2, compression_type=CODEC_IDS[codec], is_transactional=1,
                            producer_id=4242, producer_epoch=1, base_sequence=0, batch_size=1 << 22)
    for i in range(300):
        builder.append(i, timestamp=1_650_000_000_000 + i * 3, key=b"key-%d" % i,
                       value=b"payload %d " % i * 30, headers=[("h", b"%d" % i)] if i % 3 else [])
    buf = bytes(builder.build())
    expected = [(r.offset, r.timestamp, r.key, r.value, [list(h) for h in r.headers])
                for r in DefaultRecordBatch(buf)]
    (batch,) = decode(buf)
    assert batch.value["crc_valid"] and batch.value["codec"] == codec
    assert batch.value["is_transactional"] and batch.value["producer_id"] == 4242
    assert batch.value["record_count"] == 300 and batch["records"].note in (None, "offsets within decompressed bytes")
    assert plain(records_of(batch)) == expected


def test_kafka_python_snappy_batch_is_xerial_framed():
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=2, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=1, key=None, value=b"x" * 1000, headers=[])
    buf = bytes(builder.build())
    assert buf[61:69] == b"\x82SNAPPY\x00"
    assert plain(records_of(decode(buf)[0])) == [(0, 1, None, b"x" * 1000, [])]


def test_raw_snappy_batch_as_librdkafka_writes():
    buf = encode_record_batch(RECORDS, codec="snappy", xerial_snappy=False)
    assert buf[61] != 0x82
    assert [r.value["value"] for r in records_of(decode(buf)[0])] == [b"v" * 100, b"second", None]


def test_several_batches_back_to_back_at_an_offset():
    batches = [encode_record_batch([Record(value=b"a%d" % i)], base_offset=i, codec=c)
               for i, c in enumerate(CODECS)]
    prefix = b"\xAA" * 13
    buf = prefix + b"".join(batches) + b"\xBB" * 5
    items = decode_records(buf, 13, len(buf) - 5)
    assert [i.offset for i in items] == [13 + sum(map(len, batches[:k])) for k in range(5)]
    assert [r.value["value"] for i in items for r in records_of(i)] == [b"a0", b"a1", b"a2", b"a3", b"a4"]


def test_log_append_time_records_take_max_timestamp():
    buf = encode_record_batch(RECORDS, base_timestamp=100, max_timestamp=999, log_append_time=True)
    (batch,) = decode(buf)
    assert batch["attributes"]["timestamp_type"].note == "LogAppendTime"
    assert [r.value["timestamp"] for r in records_of(batch)] == [999, 999, 999]


@pytest.mark.parametrize("kind, type_name", [("commit", "COMMIT"), ("abort", "ABORT")])
def test_control_batches(kind, type_name):
    buf = encode_record_batch([control_record(kind, coordinator_epoch=17)], base_offset=50, is_control=True,
                              is_transactional=True, producer_id=9, producer_epoch=2)
    (batch,) = decode(buf)
    assert batch.value["is_control"] and batch.value["is_transactional"]
    assert batch["attributes"]["is_control"].value is True
    (record,) = batch["records"].children
    key, value = record["key"], record["value"]
    assert key.type == "ControlRecordKey" and value.type == "ControlRecordValue"
    # record @61: length, attributes, timestamp_delta, offset_delta, key length @65, key @66..69,
    # value length @70, value @71..76
    assert [(c.name, c.offset, c.length, c.value, c.note) for c in key.children] == [
        ("Version", 66, 2, 0, None), ("Type", 68, 2, CONTROL_TYPES[kind], type_name)]
    assert [(c.name, c.offset, c.length, c.value) for c in value.children] == [
        ("Version", 71, 2, 0), ("CoordinatorEpoch", 73, 4, 17)]
    assert record.value["key"] == struct.pack(">hh", 0, CONTROL_TYPES[kind])


CONTROL_TYPES = {"abort": 0, "commit": 1}


def test_short_control_key_is_noted_not_fatal():
    buf = encode_record_batch([Record(key=b"\x00", value=None)], is_control=True)
    (record,) = decode(buf)[0]["records"].children
    assert record["key"].note == "control record key needs 4 bytes"
    assert record["value"].note == "control record value needs 6 bytes"


# --- checksums ---------------------------------------------------------------

@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_flipping_a_byte_invalidates_the_batch_crc(codec):
    buf = bytearray(encode_record_batch(RECORDS, codec=codec))
    assert decode(bytes(buf))[0].value["crc_valid"]
    buf[30] ^= 0x01  # inside base_timestamp: covered by the CRC, harmless to decoding
    (batch,) = decode(bytes(buf))
    computed = crc32c.crc32c(bytes(buf[21:]))
    assert batch.value["crc_valid"] is False and batch.value["crc_computed"] == computed
    assert batch["crc"].note == f"INVALID (computed 0x{computed:08x})"
    assert len(records_of(batch)) == 3


def test_flipping_a_byte_invalidates_a_legacy_crc():
    frame = bytearray(seed_produce_v0_frame()[45:])
    frame[-1] ^= 0x20  # "hello worlD"
    (item,) = decode(bytes(frame))
    assert not item.value["crc_valid"] and item["crc"].note.startswith("INVALID (computed 0x")
    assert item.value["value"] == b"hello worlD"


# --- truncation and malformed input ------------------------------------------

def test_truncated_last_batch_is_partial():
    first = encode_record_batch(RECORDS, base_offset=0)
    second = encode_record_batch(RECORDS, base_offset=3, codec="gzip")
    buf = first + second[:30]
    items = decode(buf)
    assert [i.type for i in items] == ["RecordBatch", "PartialBatch"]
    partial = items[1]
    assert (partial.offset, partial.length) == (len(first), 30)
    assert partial.note == f"partial batch: 30 of {len(second)} bytes present"
    assert partial.value == {"magic": 2, "bytes_present": 30, "bytes_total": len(second)}
    assert [(c.name, c.value) for c in partial.children] == [
        ("base_offset", 3), ("batch_length", len(second) - 12), ("partition_leader_epoch", -1), ("magic", 2),
        ("crc", struct.unpack_from(">I", second, 17)[0]), ("attributes", 1), ("last_offset_delta", 5)]
    (strict,) = decode(second[:30], partial_ok=False)
    assert strict.type == "Malformed" and strict.note == f"offset 0: item needs {len(second)} bytes, 30 present"


def test_cut_inside_the_length_field():
    buf = encode_record_batch(RECORDS)[:10]
    (partial,) = decode(buf)
    assert partial.type == "PartialBatch" and partial.note == "partial batch: 10 bytes present, length unreadable"
    assert [c.name for c in partial.children] == ["offset"]


def test_truncated_legacy_message_is_partial():
    buf = encode_message_set(MESSAGES, magic=1)
    (first, second, third) = decode(buf[:-10])
    assert third.type == "PartialBatch" and third.value["magic"] == 1
    assert [c.name for c in third.children] == ["offset", "message_size", "crc", "magic", "attributes", "timestamp"]


def test_bytes_after_a_legacy_value_are_noted():
    message = bytearray(encode_message(magic=1, key=b"k", value=b"v", timestamp=3) + b"\0\0")
    struct.pack_into(">i", message, 8, len(message) - 12)
    (item,) = decode(bytes(message))
    assert item.note == "2 bytes left over after the value" and item.value["value"] == b"v"
    assert item["crc"].note.startswith("INVALID")  # the CRC was computed without the extra bytes


def test_unknown_magic_is_malformed_and_decoding_goes_on():
    bad = bytearray(encode_record_batch(RECORDS))
    bad[16] = 3
    good = encode_record_batch([Record(value=b"ok")], base_offset=9)
    items = decode(bytes(bad) + good)
    assert [i.type for i in items] == ["Malformed", "RecordBatch"]
    assert (items[0].offset, items[0].length, items[0].note) == (0, len(bad), "offset 16: unknown magic 3")
    assert items[0].value == Malformed(16, "unknown magic 3")
    assert items[1].offset == len(bad) and records_of(items[1])[0].value["value"] == b"ok"


def test_negative_length_stops_with_malformed():
    buf = struct.pack(">qi", 0, -5) + b"\0" * 20
    (item,) = decode(buf)
    assert (item.type, item.length, item.note) == ("Malformed", 32, "offset 8: length -5 is negative")


def test_corrupt_record_is_malformed_and_the_next_record_still_decodes():
    records_bytes = bytearray(encode_record(RECORDS[1], 0) + encode_record(RECORDS[0], 1))
    records_bytes[5] = 0x7F  # the first record's value length becomes -64
    buf = encode_record_batch([], record_count=2, compressed_payload=bytes(records_bytes))
    (batch,) = decode(buf)
    kids = batch["records"].children
    assert [k.type for k in kids] == ["Malformed", "Record"]
    assert kids[0].note == "offset 66: length -64 is negative"
    assert (kids[0].offset, kids[0].length) == (61, 13)
    assert kids[1].value["value"] == b"v" * 100
    assert batch["records"].note == "record_count is 2 but 1 records decoded"


def test_garbage_compressed_records_are_noted():
    buf = encode_record_batch([], codec="zstd", record_count=1, compressed_payload=b"not zstd at all")
    records = decode(buf)[0]["records"]
    assert records.children == [] and records.note == "decompression failed: zstd: Unknown frame descriptor"


def test_configurable_bound():
    buf = encode_record_batch([Record(value=bytes(5000))], codec="gzip")
    note = decode(buf, max_decompressed=4096)[0]["records"].note
    assert note == "decompressed size exceeds 4096 bytes limit; records not shown"
    assert len(records_of(decode(buf, max_decompressed=8192)[0])) == 1


def test_collector_state_is_restored():
    buf = encode_record_batch(RECORDS)
    assert gc.isenabled()
    decode(buf)
    assert gc.isenabled()
    gc.disable()
    try:
        decode(buf)
        assert not gc.isenabled()
    finally:
        gc.enable()


# --- never raises ------------------------------------------------------------

SAMPLES = [
    encode_record_batch(RECORDS, codec=c) for c in CODECS
] + [encode_message_set(MESSAGES, magic=m, codec=c) for m in (0, 1) for c in ("none", "gzip", "snappy", "lz4")] + [
    encode_record_batch([control_record("commit")], is_control=True)]


def check_tiling(items, start, end):
    """Top-level items cover buf[start:end] exactly, in order, and no decoder bug surfaced."""
    pos = start
    for item in items:
        assert item.offset == pos and item.length > 0
        pos = item.end
        for _, f in item.walk():
            assert not (f.note or "").count("internal decoder error"), f.note
    assert pos == end


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_never_raise(data):
    check_tiling(decode(data), 0, len(data))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLES), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       st.integers(0, 400), st.booleans())
def test_mutated_batches_never_raise(sample, flips, cut, partial_ok):
    buf = bytearray(sample * 2)
    for at, byte in flips:
        buf[at % len(buf)] = byte
    end = max(len(buf) - cut, 0)
    check_tiling(decode_records(bytes(buf), 0, end, partial_ok=partial_ok), 0, end)


def kafka_python_records(magic: int) -> bytes:
    """Two records as kafka-python's producer frames them: a batch (magic 2) or a legacy message set."""
    if magic == 2:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i in range(2):
            builder.append(i, timestamp=1_600_000_000_000 + i, key=None, value=b"value %d" % i, headers=[])
    else:
        builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
        for i in range(2):
            builder.append(i, timestamp=1_600_000_000_000 + i, key=None, value=b"value %d" % i)
    return bytes(builder.build())


@pytest.mark.parametrize("magic", [0, 1, 2])
def test_a_checked_batch_is_told_from_a_frame_by_its_checksum(magic):
    """What a search for a frame boundary asks of a candidate's bytes (framing's judge): a record batch or legacy
    message whose checksum holds is records, at the start of the bytes only, whole only, and not with one bit
    changed under its checksum (the first item's: the one asked about)."""
    records = kafka_python_records(magic)
    padded = b"\x07" * 5 + records + b"\x00" * 3  # the records inside more bytes, as in a response
    assert starts_with_checked_batch(padded, 5, len(padded))
    assert starts_with_checked_batch(records, 0, len(records))
    assert not starts_with_checked_batch(padded, 4, len(padded))  # not at its start
    assert not starts_with_checked_batch(padded, 5, 5 + 30)  # the first item cut short
    flipped = bytearray(records)
    flipped[12 + int.from_bytes(records[8:12], "big") - 1] ^= 1  # the first item's last byte
    assert not starts_with_checked_batch(flipped, 0, len(flipped))


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.integers(0, 40), st.sampled_from([0, 1, 2]))
def test_any_bytes_are_judged_without_raising(data, pos, magic):
    """Length fields claiming anything (negative, past the end) and bytes too short are answered, not raised on:
    the bytes are a checked batch only when its checksum holds."""
    data = bytearray(data)
    if len(data) > pos + 16:
        data[pos + 16] = magic  # most examples then reach the checksum
    assert starts_with_checked_batch(data, pos, len(data)) in (True, False)
