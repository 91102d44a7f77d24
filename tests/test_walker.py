"""The walker's builders tell one story: on every frame of every capture, and on the same frames cut short and
with bytes overwritten, the summary (pairing, filters, the one-line view), the Field tree (--hex, explain),
the JSON body (--json) and the text tree (-V) agree on where decoding stopped and why, on ids, error codes and
topics, and on every value (the JSON and the text against renderings of the Field tree, tests/json_oracle.py
and tests/tree_oracle.py).

Mutations use a fixed seed, so a failure repeats.
"""

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from json_oracle import field_json
from tree_oracle import Oracle
from kafkasniff.capture.files import open_capture
from kafkasniff.protocol import _walk
from kafkasniff.protocol.messages import (all_versions, decode_request, decode_response, decode_response_for_request,
                                          json_body, tree_text)
from kafkasniff.protocol.program import ROLES
from kafkasniff.protocol.walker import JSON_FLUSH_BYTES
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.session import MessageEvent
from tests.capture_manifest import CAPTURES_DIR, capture_names

MUTATIONS_PER_FRAME = 12


def _frames():
    """(payload, request key and version or None) of every message in every capture, one per distinct shape."""
    seen, frames = set(), []
    for name in capture_names():
        with open_capture(str(CAPTURES_DIR / f"{name}.pcap")) as reader:
            for ev in Analyzer().run(reader.segments()):
                if type(ev) is not MessageEvent:
                    continue
                m = ev.message
                request = (ev.request.message.api_key, ev.request.message.api_version) if ev.request else None
                shape = (m.kind, m.api_key, m.api_version, len(ev.payload))
                if shape not in seen:
                    seen.add(shape)
                    frames.append((ev.payload, request))
    return frames


FRAMES = _frames()


def _decode(data: bytes, request, skim: bool):
    if request is None:
        return decode_request(data, skim=skim)
    return decode_response_for_request(data, *request, skim=skim)


def _schema_fields(f):
    """The Fields of the message's own schema: not records, not schemas embedded in bytes."""
    yield f
    if f.type not in ("bytes", "records"):
        for c in f.children or ():
            yield from _schema_fields(c)


def _role_values(body, role: str) -> list:
    """Values of the Fields with a role, in wire order."""
    found = [f for f in _schema_fields(body) if f.role == role]
    return [f.value for f in sorted(found, key=lambda f: f.offset)]


def assert_builders_agree(data: bytes, request) -> None:
    full, summary = _decode(data, request, False), _decode(data, request, True)
    assert (summary.api_key, summary.api_version, summary.correlation_id, summary.client_id) == \
        (full.api_key, full.api_version, full.correlation_id, full.client_id)
    assert summary.malformed == full.malformed
    assert (summary.trailing and summary.trailing.offset) == (full.trailing and full.trailing.offset)
    assert summary.errors == full.errors
    if full.body is None:
        assert json_body(summary, data) is None
        if full.header is not None:
            text, _ = tree_text(summary, data, 64, False, False)
            assert text.decode().splitlines() == Oracle().tree(full.header, full.header_version, None)
        return
    assert full.errors == [code for code in _role_values(full.body, "errorCode") if code]
    named = [name for name in _role_values(full.body, "topicName") if name is not None]
    assert [m[0] for m in full.mentions if m[0] is not None] == named
    assert json.loads(json_body(summary, data)) == field_json(full.body)
    text, _ = tree_text(summary, data, 64, False, False)
    assert text.decode().splitlines() == Oracle().tree(full.header, full.header_version, full.body)
    if summary.batches:
        assert record_rows(summary, data) == _rows_from_fields(full.body)


def _cuts(size: int) -> range:
    return range(size) if size <= 300 else range(0, size, size // 97)


@pytest.mark.parametrize("index", range(len(FRAMES)))
def test_every_real_frame_whole_cut_and_mutated(index):
    payload, request = FRAMES[index]
    assert_builders_agree(payload, request)
    for cut in _cuts(len(payload)):
        assert_builders_agree(payload[:cut], request)
    rng = random.Random(index)
    for _ in range(MUTATIONS_PER_FRAME):
        data = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        assert_builders_agree(bytes(data), request)


_LAYOUTS = [(kind, key, version) for kind in ("request", "response") for key, version in all_versions(kind)]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_LAYOUTS), st.binary(max_size=200))
def test_random_bytes_at_every_layout(layout, body):
    kind, key, version = layout
    if kind == "request":
        assert_builders_agree(key.to_bytes(2, "big") + version.to_bytes(2, "big") + body, None)
    else:
        assert_builders_agree(body, (key, version))


def test_fields_made_by_the_walker_carry_the_roles_of_the_generated_table():
    # ListOffsets v0 response: one topic "a", partition 0 with error 3 and no offsets
    msg = decode_response(bytes.fromhex("00000007" "00000001" "0001" "61" "00000001" "00000000" "0003" "00000000"),
                          2, 0)
    assert msg.complete
    assert [f.role for _, f in msg.body.walk() if f.role] == ["topicName", "partition", "errorCode"]
    assert {"topicName", "partition", "errorCode", "records", "checksum"} <= set(ROLES)


@pytest.mark.parametrize("words, problem", [
    ([9, 0, 0], "unknown op"),
    ([1, 42, 0, 0], "FIXED"),            # no such kind
    ([1, 0, 0, 5], "FIXED"),             # no such name
    ([4, 0, 0, 0, 0, 0, 99, 1, 0, 0, 0], "ARRAY"),  # element length past the end
    ([6, 0, 0, 1, 0, 0, 0], "misplaced tagged section"),
])
def test_a_program_is_checked_when_made(words, problem):
    from array import array

    with pytest.raises(ValueError, match=problem):
        _walk.Program(array("i", words), ("a",), (b'"a":',), 0, 0)


def _rows_from_fields(body) -> list[tuple]:
    """What the Spark records table held when it was made from the Field tree."""
    from kafkasniff.protocol.records import records_of

    out = []

    def walk(f, topic, topic_id, partition):
        if not f.type.startswith("[]"):
            for c in f.children or ():
                if c.role == "topicName" and c.type == "string":
                    topic = c.value
                elif c.role == "topicId":
                    topic_id = c.value
                elif c.role == "partition" and c.type == "int32":
                    partition = c.value
        for c in f.children or ():
            if c.type == "records" and c.children is not None:
                for item in c.children:
                    if item.type not in ("RecordBatch", "Message"):
                        continue
                    batch = item.value
                    for record in records_of(item):
                        r = record.value
                        ts = r["timestamp"]
                        out.append((topic, topic_id, partition, _int64_or_none(r["offset"]),
                                    _int64_or_none(ts * 1000) if ts is not None and ts >= 0 else None,
                                    None if r["key"] is None else len(r["key"]),
                                    None if r["value"] is None else len(r["value"]), len(r["headers"]),
                                    batch["codec"], batch["magic"], batch["producer_id"], batch["is_transactional"],
                                    batch["is_control"], batch["crc_valid"] and r.get("crc_valid", True)))
            elif c.type != "records" and c.children:
                walk(c, topic, topic_id, partition)

    walk(body, None, None, None)
    return out


def _int64_or_none(value: int) -> int | None:
    """The table's rule: a value past 64 bits (base + delta, on hostile input) is null (and so is -2**63, which
    stands for null)."""
    return value if -2**63 < value < 2**63 else None


def _legacy_produce(magic: int, codec: str) -> bytes:
    from kafkasniff.protocol.encoder import encode_request
    from kafkasniff.protocol.records_encoder import Record, encode_message_set

    records = [Record(key=b"k1", value=b"first", timestamp_delta=0), Record(key=None, value=b"second")]
    message_set = encode_message_set(records, magic=magic, codec=codec, base_offset=40, timestamp=1_700_000_000_000)
    return encode_request(0, 2, 9, "legacy", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "old", "PartitionData": [{"Index": 3, "Records": message_set}]}]}, size_prefix=False)


def record_rows(msg, payload, every: int = 3) -> list[tuple]:
    """The message's records as the Spark records table has them (record_columns' chunks of at most `every`, a
    tuple per record in _rows_from_fields' order: group values, then the record's, nulls as None)."""
    from array import array

    from kafkasniff.protocol.messages import record_columns
    from kafkasniff.protocol.walker import NULL_INT32, NULL_INT64, RECORD_COLUMNS

    rows = []

    def emit(count, groups, *data):
        assert 0 < count <= every
        columns = {}
        for (name, code), column in zip(RECORD_COLUMNS, data):
            values = array(code, column)
            assert len(values) == count
            null = NULL_INT64 if code == "q" else NULL_INT32 if name in ("key_size", "value_size") else None
            columns[name] = [None if v == null else v for v in values]
        for i in range(count):
            topic, topic_id, partition, codec, magic, producer_id, transactional, control = \
                groups[columns["group"][i]]
            rows.append((topic, topic_id, partition, columns["offset"][i], columns["timestamp"][i],
                         columns["key_size"][i], columns["value_size"][i], columns["header_count"][i], codec, magic,
                         producer_id, transactional, control, columns["crc_valid"][i] == 1))

    assert record_columns(msg, payload, emit, every) == len(rows)
    return rows


@pytest.mark.parametrize("index", [i for i, (payload, request) in enumerate(FRAMES)
                                   if _decode(payload, request, True).batches])
def test_spark_record_rows_are_the_records_of_the_field_tree(index):
    payload, request = FRAMES[index]
    full = _decode(payload, request, False)
    assert record_rows(full, payload) == _rows_from_fields(full.body) != []


@pytest.mark.parametrize("magic, codec", [(0, "none"), (1, "none"), (0, "gzip"), (1, "gzip"), (1, "snappy")])
def test_spark_record_rows_of_legacy_message_sets(magic, codec):
    payload = _legacy_produce(magic, codec)
    full = decode_request(payload)
    rows = record_rows(full, payload)
    assert rows == _rows_from_fields(full.body)
    assert [(topic, partition, offset, key, value, row_codec) for topic, _, partition, offset, _, key, value, _,
            row_codec, *_ in rows] == [("old", 3, 40, 2, 5, codec), ("old", 3, 41, None, 6, codec)]


def _big_records_message() -> tuple[MessageEvent, int]:
    """The first message of confluent_codecs.pcap whose records make more JSON than one write takes."""
    with open_capture(str(CAPTURES_DIR / "confluent_codecs.pcap")) as reader:
        for ev in Analyzer().run(reader.segments()):
            if type(ev) is MessageEvent and ev.message.records and len(ev.payload) > JSON_FLUSH_BYTES:
                return ev
    raise AssertionError("no big message with records")


@pytest.mark.parametrize("view", ["json", "tree"])
def test_a_failed_write_ends_the_walk_with_its_own_exception(view):
    """Once, the walk closed what it had opened after `write` raised (BrokenPipeError: `| head`), and flushed
    again with the exception pending: `decode --json | head -1` ended in a SystemError traceback."""
    ev = _big_records_message()
    calls = []

    def write(*text):
        calls.append(len(text[0]))
        raise BrokenPipeError("the reader went away")

    with pytest.raises(BrokenPipeError, match="the reader went away"):
        if view == "json":
            json_body(ev.message, ev.payload, None, write)
        else:
            tree_text(ev.message, ev.payload, None, False, False, None, None, write)
    assert len(calls) == 1


def test_tree_text_hands_write_a_view_that_is_released_when_write_returns():
    """The text chunks are views of the walker's buffer, not copies (records-heavy -V writes hundreds of MB): what
    write keeps of one cannot read the buffer once it is reused, and the chunks joined are the text made whole."""
    ev = _big_records_message()
    kept, chunks = [], []

    def write(text, spans):
        kept.append(text)
        chunks.append(bytes(text))

    rest, _ = tree_text(ev.message, ev.payload, None, False, False, None, None, write)
    whole, _ = tree_text(ev.message, ev.payload, None, False, False, None, None)
    assert chunks and b"".join(chunks) + rest == whole
    assert all(type(view) is memoryview for view in kept)
    with pytest.raises(ValueError, match="released"):
        bytes(kept[0])


def _value_around_the_widths(rng: random.Random, length: int) -> bytes:
    """Printable ASCII of `length` bytes with perhaps a quote, a backslash or an unprintable byte at a random place:
    the text builder scans values 16 and 8 bytes at a time and shows 64 characters, so lengths around those
    and a mark at any place, first and last included, are where it could go wrong."""
    data = bytearray(rng.choice(b"abc xyz{}:,0189") for _ in range(length))
    for _ in range(rng.randint(0, 2)):
        if length:
            data[rng.randrange(length)] = rng.choice(b"'\"\\\t\x7f\x1f\x80\xc3")
    return bytes(data)


def test_record_keys_and_values_are_shown_as_values_shows_them():
    from kafkasniff.protocol.encoder import encode_request
    from kafkasniff.protocol.records_encoder import Record, encode_record_batch

    rng = random.Random(13)
    lengths = [n for n in range(0, 80)] + [127, 128, 129, 200]
    records = [Record(_value_around_the_widths(rng, rng.choice(lengths)), _value_around_the_widths(rng, n),
                      [("h", _value_around_the_widths(rng, rng.choice(lengths)))]) for n in lengths * 6]
    frame = encode_request(0, 9, 6, "values", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": encode_record_batch(records)}]}]})
    assert_builders_agree(frame[4:], None)
