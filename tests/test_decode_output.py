"""`kafkasniff decode` views (one line, -V tree, --hex, --json), filters, secrets, errors and progress,
on the project's captures and on conversations built from exact bytes."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import crc32c
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkasniff.cli import main
from kafkasniff.commands.decode import PROGRESS_MIN_BYTES, make_options, wants_progress
from kafkasniff.protocol.encoder import encode_request, encode_response
from kafkasniff.protocol.records_encoder import Record, encode_message_set, encode_record_batch
from kafkasniff.render.oneline import message_line, message_row, topics_row
from kafkasniff.render.output import Output
from kafkasniff.render.tree import TreeView
from kafkasniff.stream.session import MessageEvent, SaslTokenEvent, Session
from kafkasniff.stream.tcp import END_FIN, Endpoint

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
AIOKAFKA = str(CAPTURES / "aiokafka_codecs.pcap")
CONFLUENT = str(CAPTURES / "confluent_codecs.pcap")
CONSUMER_GROUP = str(CAPTURES / "consumer_group.pcap")
TRANSACTIONS = str(CAPTURES / "transactions.pcap")


def decode(*args: str) -> list[str]:
    result = CliRunner().invoke(main, ["decode", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def decode_json(*args: str) -> list[dict]:
    return [json.loads(line) for line in decode("--json", *args)]


def counts(lines: list[dict]) -> dict:
    out: dict = {}
    for d in lines:
        key = (d["api_name"], d["kind"])
        out[key] = out.get(key, 0) + 1
    return out


# ---------------------------------------------------------------- filters, exact counts

# tshark 4.0.17 reads every version aiokafka uses: its per-API message counts over
# aiokafka_codecs.pcap (`-Y kafka -T fields -e kafka.api_key`) are these.
def test_json_api_filters_match_tshark_counts():
    everything = decode_json(AIOKAFKA)
    # Each consumer's long-polling Fetch was in flight when the capture ended: said last, one notice each.
    everything, notices = everything[:-5], everything[-5:]
    assert [(d["notice"], d["text"]) for d in notices] == [
        ("unanswered", "1 request without a response when the capture ended: Fetch v11 corr=6")] * 5
    assert len(everything) == 115
    assert counts(everything) == {
        ("ApiVersions", "request"): 20, ("ApiVersions", "response"): 20, ("Metadata", "request"): 20,
        ("Metadata", "response"): 20, ("Produce", "request"): 5, ("Produce", "response"): 5,
        ("ListOffsets", "request"): 5, ("ListOffsets", "response"): 5, ("Fetch", "request"): 10,
        ("Fetch", "response"): 5}
    assert len(decode_json("--api", "produce", AIOKAFKA)) == 10
    assert len(decode_json("--api", "1", AIOKAFKA)) == 15  # by key: Fetch
    assert len(decode_json("--api", "Metadata", "--api", "ApiVersions", AIOKAFKA)) == 80


def test_json_topic_filter_matches_tshark_frames_with_the_topic():
    # tshark -Y 'kafka.topic_name=="aiokafka-gzip"': 17 Metadata, 2 Produce, 2 ListOffsets, 3 Fetch PDUs
    lines = decode_json("--topic", "aiokafka-gzip", AIOKAFKA)
    assert counts(lines) == {
        ("Metadata", "request"): 1, ("Metadata", "response"): 16, ("Produce", "request"): 1,
        ("Produce", "response"): 1, ("ListOffsets", "request"): 1, ("ListOffsets", "response"): 1,
        ("Fetch", "request"): 2, ("Fetch", "response"): 1}
    assert all("aiokafka-gzip" in d["topics"] for d in lines)
    assert len(decode_json("--topic", "aiokafka-gzip", "--api", "fetch", AIOKAFKA)) == 3


def test_topic_filter_resolves_topic_ids_from_metadata():
    # confluent-kafka fetches with Fetch v16, whose requests and responses carry topic ids only
    lines = decode_json("--topic", "confluent-gzip", CONFLUENT)
    assert counts(lines) == {
        ("Metadata", "request"): 3, ("Metadata", "response"): 4, ("Produce", "request"): 3,
        ("Produce", "response"): 3, ("ListOffsets", "request"): 3, ("ListOffsets", "response"): 3,
        ("Fetch", "request"): 3, ("Fetch", "response"): 3}
    fetch = [d for d in lines if d["api_name"] == "Fetch" and d["kind"] == "response"]
    assert all(d["topics"] == ["confluent-gzip"] for d in fetch)
    assert fetch[0]["body"]["responses"][0]["topic_id"] != "00000000-0000-0000-0000-000000000000"


def test_client_id_stream_and_errors_only_filters():
    # tshark -Y 'kafka.client_id=="aiokafka-producer-1"': ApiVersions twice, Metadata, Produce
    producer = decode_json("--client-id", "aiokafka-producer-1", AIOKAFKA)
    assert counts(producer) == {("ApiVersions", "request"): 2, ("ApiVersions", "response"): 2,
                                ("Metadata", "request"): 1, ("Metadata", "response"): 1,
                                ("Produce", "request"): 1, ("Produce", "response"): 1}
    assert {d["client_id"] for d in producer} == {"aiokafka-producer-1"}
    stream = decode_json("--stream", "8", CONFLUENT)
    assert len(stream) == 21 + 1 and {d["stream"] for d in stream} == {8}  # and its Metadata request unanswered
    assert len(decode_json("--stream", "8", "--stream", "0", CONFLUENT)) == 25 + 1
    (error,) = decode_json("--errors-only", CONSUMER_GROUP)
    assert (error["api_name"], error["kind"], error["errors"]) == ("JoinGroup", "response", ["MEMBER_ID_REQUIRED"])
    assert error["body"]["error_code"] == 79
    assert decode("--errors-only", AIOKAFKA) == []


# ---------------------------------------------------------------- views on a capture


def test_one_line_view():
    lines = decode(CONFLUENT)
    assert len(lines) == 205 + 1  # and the notice of a Metadata request left unanswered when its connection ended
    assert lines[0] == ("08:13:43.753695 #0 127.0.0.1:50638 → 127.0.0.1:9092 ApiVersions v3 request corr=1 "
                        "client='rdkafka' 64B")
    assert lines[1] == "08:13:43.753856 #0 127.0.0.1:50638 ← 127.0.0.1:9092 ApiVersions v3 response corr=1 283B 0.161ms"


def test_json_lines_schema_of_requests_and_responses():
    request, response = [d for d in decode_json("--api", "produce", "--stream", "1", CONFLUENT)
                         if d["correlation_id"] == 2]
    body = request.pop("body")
    assert request == {
        "kind": "request", "ts": 1795421623.758074, "stream": 1, "src": "127.0.0.1:50650",
        "dst": "127.0.0.1:9092", "api_key": 0, "api_name": "Produce", "api_version": 10, "header_version": 2,
        "correlation_id": 2, "client_id": "rdkafka", "size": 280, "topics": ["confluent-none"], "errors": [],
        "malformed": None, "trailing_bytes": 0, "expects_response": True}
    (batch,) = body["topic_data"][0]["partition_data"][0]["records"]
    assert batch == {
        "magic": 2, "codec": "none", "crc_valid": True, "crc_computed": 1419218791, "record_count": 3,
        "base_offset": 0, "producer_id": -1, "is_transactional": False, "is_control": False,
        "records": [
            {"offset": 0, "timestamp": 1795421623757, "key": {"base64": "a2V5LW51bGwtaGVhZGVy", "text": "key-null-header"},
             "value": {"base64": "Y29uZmx1ZW50LWthZmthIG5vbmU6IGhlYWRlciB3aXRob3V0IGEgdmFsdWU=",
                       "text": "confluent-kafka none: header without a value"},
             "headers": [["maybe", None]]},
            {"offset": 1, "timestamp": 1795421623757, "key": {"base64": "bnlja2VsLcO2", "text": "nyckel-ö"},
             "value": {"base64": "Y29uZmx1ZW50LWthZmthIG5vbmU6IHbDpHJkZSDinJMgw7xuw69jb2Rl",
                       "text": "confluent-kafka none: värde ✓ ünïcode"},
             "headers": [["språk", {"base64": "c3ZlbnNrYQ==", "text": "svenska"}]]},
            {"offset": 2, "timestamp": 1795421623757,
             "key": {"base64": "a2V5LXRvbWJzdG9uZQ==", "text": "key-tombstone"}, "value": None, "headers": []}]}
    body = response.pop("body")
    assert response == {
        "kind": "response", "ts": 1795421623.758876, "stream": 1, "src": "127.0.0.1:9092",
        "dst": "127.0.0.1:50650", "api_key": 0, "api_name": "Produce", "api_version": 10, "header_version": 1,
        "correlation_id": 2, "client_id": "rdkafka", "size": 61, "topics": ["confluent-none"], "errors": [],
        "malformed": None, "trailing_bytes": 0, "latency_ms": 0.802, "inferred": False}
    assert body["responses"][0]["partition_responses"][0]["base_offset"] == 0


def test_json_marks_control_records():
    controls = [r["control_type"] for d in decode_json("--api", "fetch", TRANSACTIONS) if d["kind"] == "response"
                for t in d["body"]["responses"] for p in t["partitions"] for b in p["records"] or ()
                for r in b["records"] if "control_type" in r]
    assert sorted(controls) == ["ABORT"] * 6 + ["COMMIT"] * 6


def blocks(lines: list[str]) -> list[list[str]]:
    """Split tree output into one list of lines per event (each starts with its time)."""
    out: list[list[str]] = []
    for line in lines:
        if line[:2].isdigit() and line[2] == ":":
            out.append([])
        out[-1].append(line.rstrip())
    return out


def test_tree_view_shows_header_body_batches_and_records():
    produce = blocks(decode("-V", "--stream", "1", "--api", "produce", CONFLUENT))
    assert len(produce) == 8
    request = next(b for b in produce if "corr=3 " in b[0])
    assert request[:16] == [
        "08:13:43.758093 #1 127.0.0.1:50650 → 127.0.0.1:9092 Produce v10 request corr=3 client='rdkafka' 1018B "
        "confluent-none[0] 1 batch 3 records",
        "├── header  RequestHeader v2",
        "│   ├── RequestApiKey: 0 (Produce)  int16",
        "│   ├── RequestApiVersion: 10  int16",
        "│   ├── CorrelationId: 3  int32",
        "│   └── ClientId: 'rdkafka'  string",
        "└── body  ProduceRequest",
        "    ├── TransactionalId: null  string",
        "    ├── Acks: -1  int16",
        "    ├── TimeoutMs: 30000  int32",
        "    └── TopicData: 1 items  []TopicProduceData",
        "        └── [0]",
        "            ├── Name: 'confluent-none'  string",
        "            └── PartitionData: 1 items  []PartitionProduceData",
        "                └── [0]",
        "                    ├── Index: 0  int32"]
    text = [line.strip(" │├└─") for line in request[16:]]
    assert text[:2] == ["Records: 1 record batch in 969 bytes  records",
                        "record batch (magic 2): codec none, 3 records, base offset 0, CRC valid"]
    assert "crc: 0x3b090e87 (valid)  uint32" in text  # 990449287: CRCs in hex
    assert "base_timestamp: 1795421623756 (2026-11-23T08:13:43.756Z)  int64" in text
    assert text[-14:] == [
        "records  []Record",
        "record offset 0, timestamp 2026-11-23T08:13:43.756Z",
        "key: 'key-0'  bytes",
        "value: 'confluent-kafka none: plain text value' (38 bytes)  bytes",
        "header trace-id: 'trace-0001'",
        "record offset 1, timestamp 2026-11-23T08:13:43.756Z",
        "key: 'key-1'  bytes",
        "value: 'confluent-kafka none: a repetitive value that compresses well. c…' (504 bytes)  bytes",
        "header trace-id: 'trace-0002'",
        "header source: 'kafkasniff'",
        "record offset 2, timestamp 2026-11-23T08:13:43.757Z",
        "key: 0x00 01 fe ff  bytes",
        "value: 0x00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f "
        "… (256 bytes)  bytes",
        "header binary: 0x00 ff"]
    response = next(b for b in produce if "corr=3 " in b[0] and "response" in b[0])
    assert "    │               ├── ErrorCode: 0 (NONE)  int16" in response


def test_tree_view_full_values_and_compressed_batches():
    full = blocks(decode("-V", "--full", "--stream", "1", "--api", "produce", CONFLUENT))
    request = next(b for b in full if "corr=3 " in b[0])
    assert any(("value: '" + "confluent-kafka none: a repetitive value that compresses well. " * 8).rstrip()
               in line for line in request)
    gzip = blocks(decode("-V", "--api", "produce", "--topic", "kafka-python-gzip",
                         str(CAPTURES / "kafka_python_codecs.pcap")))
    text = [line.strip(" │├└─") for line in gzip[0]]
    assert "record batch (magic 2): codec gzip, 3 records, base offset 0, producer id 2, CRC valid" in text
    assert "records: 879 bytes decompressed (offsets within decompressed bytes)" in text


def test_tree_view_shows_control_records():
    text = [line.strip(" │├└─") for line in decode("-V", "--api", "fetch", TRANSACTIONS)]
    assert sum(line.startswith("control record COMMIT offset 1, ") for line in text) == 6
    assert sum(line.startswith("control record ABORT offset 3, ") for line in text) == 6
    assert text.count("Type: 1 (COMMIT)  int16") == 6


def test_hex_view_lists_every_byte_range_at_frame_offsets():
    first = blocks(decode("--hex", "--stream", "0", CONFLUENT))[0]
    rows = [line.split() for line in first[2:]]
    assert first[1].split() == ["offset", "bytes", "field", "type", "value"]
    # Up to 8 bytes of each range are shown, then an ellipsis.
    assert rows == [
        ["0-3", "00", "00", "00", "40", "size", "int32", "64"],
        ["4-5", "00", "12", "header.RequestApiKey", "int16", "18"],
        ["6-7", "00", "03", "header.RequestApiVersion", "int16", "3"],
        ["8-11", "00", "00", "00", "01", "header.CorrelationId", "int32", "1"],
        ["12-20", "00", "07", "72", "64", "6b", "61", "66", "6b", "…", "header.ClientId", "string", "'rdkafka'"],
        ["21", "00", "header._tagged_fields", "tagged_fields", "tag", "count", "/", "tag", "header"],
        ["22-44", "17", "63", "6f", "6e", "66", "6c", "75", "65", "…", "body.ClientSoftwareName", "string",
         "'confluent-kafka-python'"],
        ["45-66", "16", "32", "2e", "31", "36", "2e", "31", "2d", "…", "body.ClientSoftwareVersion", "string",
         "'2.16.1-rdkafka-2.16.0'"],
        ["67", "00", "body._tagged_fields", "tagged_fields", "tag", "count", "/", "tag", "header"]]


# ---------------------------------------------------------------- conversations from exact bytes

CLIENT, SERVER = Endpoint("10.0.0.1", 40000), Endpoint("10.0.0.2", 9092)


def conversation(*frames: tuple[bool, bytes]) -> list:
    """Events of one connection: (from the client?, bytes) in order, then the end of the connection (a FIN)."""
    session = Session(0, (CLIENT, SERVER), client_side=0, from_start=(True, True))
    out, ts = [], 1_700_000_000.0
    for from_client, data in frames:
        ts += 0.001
        out += session.data(0 if from_client else 1, data, ts)
    return out + session.end(ts, END_FIN)


def framed(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def render(events: list, *args: str) -> str:
    """What decode would print for these events with these options."""
    out = io.StringIO()
    flags = {"tree": "-V" in args, "hex_": "--hex" in args, "as_json": "--json" in args, "apis": (),
             "topics": (), "client_ids": (), "streams": (), "errors_only": False, "stats": "--stats" in args,
             "show_secrets": "--show-secrets" in args, "full": "--full" in args}
    output = Output(make_options(**flags), out)
    for ev in events:
        output.emit(ev)
    output.finish()
    return out.getvalue()


METADATA_V1 = encode_request(3, 1, 7, "t", {"Topics": [{"Name": "orders"}]})[4:]


def test_malformed_and_trailing_bytes_in_every_view():
    events = conversation((True, framed(METADATA_V1[:-2])), (True, framed(METADATA_V1 + b"\x01\x02\x03")))
    line = render(events).splitlines()
    assert line[0].endswith("Metadata v1 request corr=7 client='t' 21B "
                            "MALFORMED at byte 19: string length 6 exceeds the 4 bytes left")
    assert line[1].endswith("Metadata v1 request corr=7 client='t' 26B +3 trailing bytes")
    malformed, trailing, unanswered = map(json.loads, render(events, "--json").splitlines())
    assert unanswered["text"] == \
        "1 request without a response when the connection ended: Metadata v1 corr=7"
    assert malformed["malformed"] == {"offset": 19, "reason": "string length 6 exceeds the 4 bytes left"}
    assert (trailing["malformed"], trailing["trailing_bytes"]) == (None, 3)
    tree = render(events, "-V").splitlines()
    assert "MALFORMED at byte 19: string length 6 exceeds the 4 bytes left" in tree
    assert "3 trailing bytes after the body, bytes 27-29: 0x01 02 03" in tree
    hex_rows = [line.split() for line in render(events, "--hex").splitlines()]
    assert any(r[0] == "19-24" and r[-4:] == ["_undecoded", "bytes", "not", "decoded"] for r in hex_rows)
    assert ["27-29", "01", "02", "03", "_trailing", "bytes", "0x01", "02", "03", "(3", "bytes", "after", "the",
            "end", "of", "the", "body)"] in hex_rows


def test_legacy_messages_invalid_crcs_and_malformed_records():
    wrapper = encode_message_set([Record(b"k1", b"v1"), Record(None, b"v2")], magic=1, codec="gzip",
                                 timestamp=1_700_000_000_000)
    damaged = bytearray(encode_record_batch([Record(b"key", b"value", [("h", b"x")])]))
    damaged[-1] ^= 0xFF  # the header value changes; the CRC stays
    cut_short = bytearray(encode_record_batch([Record(b"key", b"value")]))
    cut_short[61] = 0x7E  # the record claims 63 bytes; 14 follow
    struct.pack_into(">I", cut_short, 17, crc32c.crc32c(bytes(cut_short[21:])))
    legacy = encode_request(0, 2, 5, "legacy", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "old", "PartitionData": [{"Index": 0, "Records": wrapper}]}]})
    modern = encode_request(0, 9, 6, "modern", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "new", "PartitionData": [{"Index": 0, "Records": bytes(damaged)},
                                          {"Index": 1, "Records": bytes(cut_short)}]}]})
    events = conversation((True, legacy), (True, modern))
    bad_record_at = modern.index(bytes(cut_short)) + 61  # frame offset: `modern` keeps its size prefix
    text = [line.strip(" │├└─") for line in render(events, "-V").splitlines()]
    assert "Records: 1 legacy message in 118 bytes  records" in text
    assert "message (magic 1): codec gzip, offset 1, timestamp 2023-11-14T22:13:20.000Z, CRC valid" in text
    assert "messages: 74 bytes decompressed (offsets within decompressed bytes)" in text
    assert text.count("message (magic 1): codec none, offset 0, timestamp 2023-11-14T22:13:20.000Z, CRC valid") == 1
    crc = crc32c.crc32c(bytes(damaged[21:]))
    assert f"record batch (magic 2): codec none, 1 records, base offset 0, CRC INVALID (computed 0x{crc:08x})" in text
    assert f"MALFORMED at byte {bad_record_at}: record length 63 does not fit the 14 bytes left" in text
    *produced, unanswered = render(events, "--json").splitlines()
    old, new = (json.loads(line)["body"]["topic_data"][0]["partition_data"] for line in produced)
    assert json.loads(unanswered)["text"] == \
        "2 requests without a response when the connection ended: Produce v2 corr=5, Produce v9 corr=6"
    (message,) = old[0]["records"]
    assert (message["magic"], message["codec"], message["offset"], message["crc_valid"]) == (1, "gzip", 1, True)
    assert [(r["offset"], r["key"], r["value"]["text"]) for r in message["records"]] == [
        (0, {"base64": "azE=", "text": "k1"}, "v1"), (1, None, "v2")]
    assert [b["crc_valid"] for p in new for b in p["records"]] == [False, True]
    assert new[1]["records"][0]["records"] == [
        {"malformed": {"offset": bad_record_at, "reason": "record length 63 does not fit the 14 bytes left"}}]


def test_notices_in_every_view():
    events = conversation((True, framed(METADATA_V1)[:10]))
    (notice,) = events
    assert notice.kind == "skipped"
    assert render(events).endswith("! stream ended inside a frame (6 of 23 bytes) (10 bytes at stream offset 0, c2s)\n")
    assert render(events, "-V") == render(events)
    assert json.loads(render(events, "--json")) == {
        "kind": "notice", "ts": 1700000000.001, "notice": "skipped", "text": "stream ended inside a frame (6 of 23 bytes)",
        "stream": 0, "src": "10.0.0.1:40000", "dst": "10.0.0.2:9092", "direction": "c2s", "stream_offset": 0,
        "size": 10}


def test_a_request_waiting_when_its_connection_ends_is_named_in_every_view_and_one_expecting_no_response_is_not():
    """A Metadata request, then a Produce with acks=0, then the connection's FIN: the Metadata request is left
    without a response, said at the end's time; the Produce waits for none."""
    fire_and_forget = encode_request(0, 9, 8, "t", {"TransactionalId": None, "Acks": 0, "TimeoutMs": 1000,
                                                    "TopicData": []})
    events = conversation((True, framed(METADATA_V1)), (True, fire_and_forget))
    metadata, produce, notice = events
    assert (metadata.expects_response, produce.expects_response) == (True, False)
    text = "1 request without a response when the connection ended: Metadata v1 corr=7"
    line = f"22:13:20.002000 #0 10.0.0.1:40000 ↔ 10.0.0.2:9092 ! {text}\n"
    assert render(events).endswith(f"(no response expected) 21B\n{line}")
    assert render(events, "-V").endswith(f"TopicData: 0 items  []TopicProduceData\n{line}")
    assert render(events, "--hex").endswith(f"tag count / tag header\n{line}")
    assert json.loads(render(events, "--json").splitlines()[-1]) == {
        "kind": "notice", "ts": 1700000000.002, "notice": "unanswered", "text": text, "stream": 0,
        "src": "10.0.0.1:40000", "dst": "10.0.0.2:9092"}
    stats = json.loads(render(events, "--stats", "--json").splitlines()[-1])
    assert (stats["notices"], stats["bytes"]["captured"], stats["bytes"]["messages"]) == ({"unanswered": 1}, 52, 52)
    assert render(events, "--stats").endswith(
        "\n1 unanswered notices\nbytes captured: 52 = 52 in messages + 0 in SASL tokens + 0 skipped + 0 TLS + "
        "0 not Kafka; 0 missing from the capture\n")


PASSWORD = b"s3cret-pw"
PROOF = b"dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
NONCE = b"rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"


def sasl_conversations() -> list:
    plain_raw = conversation(
        (True, encode_request(17, 0, 1, "c", {"Mechanism": "PLAIN"})),
        (False, encode_response(17, 0, 1, {"ErrorCode": 0, "Mechanisms": ["PLAIN"]})),
        (True, framed(b"\0alice\0" + PASSWORD)),
        (True, encode_request(18, 0, 2, "c", {})))
    scram = conversation(
        (True, encode_request(17, 1, 1, "c", {"Mechanism": "SCRAM-SHA-256"})),
        (False, encode_response(17, 1, 1, {"ErrorCode": 0, "Mechanisms": ["SCRAM-SHA-256"]})),
        (True, encode_request(36, 2, 2, "c", {"AuthBytes": b"n,,n=alice,r=rOprNGfwEbeRWgbNEkqO"})),
        (False, encode_response(36, 2, 2, {"ErrorCode": 0, "AuthBytes":
                                           b"r=" + NONCE + b",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"})),
        (True, encode_request(36, 2, 3, "c", {"AuthBytes": b"c=biws,r=" + NONCE + b",p=" + PROOF})))
    # Each ends with a request no response answered: a notice says so.
    assert [type(ev).__name__ for ev in plain_raw] == ["MessageEvent", "MessageEvent", "SaslTokenEvent",
                                                       "MessageEvent", "NoticeEvent"]
    assert [type(ev).__name__ for ev in scram] == ["MessageEvent"] * 5 + ["NoticeEvent"]
    return plain_raw + scram


SECRET_FORMS = [PASSWORD.decode(), PASSWORD.hex(" ")[:23], PROOF.decode(), PROOF[:8].hex(" ")]


@pytest.mark.parametrize("view", [(), ("--json",), ("-V",), ("--hex",), ("--hex", "--full")])
def test_sasl_secrets_are_masked_in_every_view_unless_asked(view):
    events = sasl_conversations()
    masked = render(events, *view)
    assert [form for form in SECRET_FORMS if form in masked] == []
    assert "********" in masked
    assert "alice" in masked  # user names are not secret
    shown = render(events, *view, "--show-secrets")
    assert PASSWORD.decode() in shown
    assert (PROOF.decode() in shown) == bool(view)  # the one-line view shows no message bodies


def test_hex_view_masks_the_bytes_of_secrets():
    token = next(ev for ev in sasl_conversations() if type(ev) is SaslTokenEvent)
    rows = [line.split() for line in render([token], "--hex").splitlines()[1:]]
    assert rows == [
        ["offset", "bytes", "field", "type", "value"],
        ["0-3", "00", "00", "00", "10", "size", "int32", "16"],
        ["4", "token.authorization_id", "string", "''"],  # empty: no bytes
        ["4", "00", "token", "sasl_token", "length", "prefix", "or", "token", "syntax"],
        ["5-9", "61", "6c", "69", "63", "65", "token.username", "string", "'alice'"],
        ["10", "00", "token", "sasl_token", "length", "prefix", "or", "token", "syntax"],
        ["11-19", "••", "••", "••", "••", "••", "••", "••", "••", "…", "token.password", "secret", "********"]]
    shown = [line.split() for line in render([token], "--hex", "--show-secrets").splitlines()[1:]]
    assert shown[-1] == ["11-19", "73", "33", "63", "72", "65", "74", "2d", "70", "…", "token.password", "secret",
                         "'s3cret-pw'"]


def test_hex_view_masks_secret_bytes_inside_sasl_authenticate():
    final = [ev for ev in sasl_conversations() if type(ev) is MessageEvent][-1]
    payload = encode_request(36, 2, 3, "c", {"AuthBytes": b"c=biws,r=" + NONCE + b",p=" + PROOF})[4:]
    assert final.payload == payload
    styled = TreeView(io.StringIO(), hex_=True, full=True).render(final)
    text = styled.plain
    mask_at = text.index("********")  # a secret's value is drawn in magenta on a terminal
    assert [span.style for span in styled.spans if span.start <= mask_at < span.end] == ["magenta"]
    proof_row = next(line.split() for line in text.splitlines() if "body.AuthBytes.proof" in line)
    start = 4 + payload.index(PROOF)
    assert proof_row == [f"{start}-{start + len(PROOF) - 1}", *["••"] * len(PROOF), "body.AuthBytes.proof",
                         "secret", "********"]
    assert PROOF.hex(" ")[:11] not in text
    nonce_row = next(line.split() for line in text.splitlines() if "body.AuthBytes.nonce" in line)
    assert nonce_row[1:-3] == NONCE.hex(" ").split()  # what is not secret keeps its bytes


def test_tree_view_prints_each_event_as_it_comes():
    events = conversation((True, framed(METADATA_V1)), (True, framed(METADATA_V1)))
    out = io.StringIO()
    output = Output(make_options(tree=True, hex_=False, as_json=False, apis=(), topics=(), client_ids=(),
                                 streams=(), errors_only=False, stats=False, show_secrets=False, full=False), out)
    output.emit(events[0])
    first = out.getvalue()
    assert first.startswith("22:13:20.001000 #0 10.0.0.1:40000 → 10.0.0.2:9092 Metadata v1 request corr=7")
    assert "            └── Name: 'orders'  string\n" in first
    output.emit(events[1])
    assert out.getvalue().startswith(first) and len(out.getvalue()) == 2 * len(first)


def test_views_into_a_pipe_start_without_rich():
    """rich takes ~20 ms to import, a fifth of a small capture's decode: one line, JSON, -V into a file or pipe (the
    tree in plain text) and --stats --json do without it; -V --hex and the --stats tables are drawn with it."""
    script = ("import sys; from kafkasniff.cli import main\n"
              "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
              "sys.stderr.write(str(sorted({m.split('.')[0] for m in sys.modules} & {'rich'})))\n")
    capture = str(CAPTURES / "consumer_group.pcap")
    for view, imported in [((), "[]"), (("--json",), "[]"), (("-V",), "[]"), (("--stats", "--json"), "[]"),
                           (("-V", "--hex"), "['rich']"), (("--stats",), "['rich']")]:
        done = subprocess.run([sys.executable, "-c", script, "decode", *view, capture], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, check=True)
        assert done.stdout.count("\n") > (0 if "--stats" in view else 50)
        assert done.stderr == imported, view


# ---------------------------------------------------------------- unreadable captures


def decode_failure(path) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["decode", str(path)])
    return result.exit_code, result.stdout, result.stderr


def test_unreadable_captures_fail_with_one_clear_line(tmp_path):
    (tmp_path / "empty.pcap").write_bytes(b"")
    (tmp_path / "notes.pcap").write_text("Kafka notes, not a capture\n")
    assert decode_failure(tmp_path) == (2, "", f"kafkasniff: {tmp_path}: is a directory; give a capture file "
                                               "inside it\n")
    assert decode_failure(tmp_path / "empty.pcap") == (
        2, "", f"kafkasniff: {tmp_path}/empty.pcap: file too short to be a capture (0 bytes); give a file written by "
               "tcpdump, tshark, dumpcap or Wireshark\n")
    assert decode_failure(tmp_path / "notes.pcap") == (
        2, "", f"kafkasniff: {tmp_path}/notes.pcap: file is not a pcap or pcapng capture (starts with 4b61666b); "
               "give a file written by tcpdump, tshark, dumpcap or Wireshark\n")
    assert decode_failure(tmp_path / "missing.pcap") == (
        2, "", f"kafkasniff: {tmp_path}/missing.pcap: no such file; check the path\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied(tmp_path):
    path = tmp_path / "locked.pcap"
    shutil.copy(AIOKAFKA, path)
    path.chmod(0)
    assert decode_failure(path) == (
        2, "", f"kafkasniff: {path}: permission denied; make the file readable for this user (or run as its owner)\n")


def test_truncated_capture_prints_what_came_before_the_cut_then_warns(tmp_path):
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(Path(TRANSACTIONS).read_bytes()[:30000])
    result = CliRunner().invoke(main, ["decode", str(cut)])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == decode(TRANSACTIONS)[:102]
    assert result.stderr == (f"kafkasniff: warning: {cut}: capture ends inside the record at byte 29921 "
                             "(63 of 548 bytes; file truncated?)\n")


# ---------------------------------------------------------------- progress bar


def test_progress_only_on_a_terminal_and_for_long_files():
    main_fd, tty_fd = pty.openpty()
    with os.fdopen(tty_fd, "w") as tty, open(os.devnull, "w") as devnull:
        assert wants_progress(tty, PROGRESS_MIN_BYTES)
        assert not wants_progress(tty, PROGRESS_MIN_BYTES - 1)
        assert not wants_progress(devnull, 10 * PROGRESS_MIN_BYTES)
    os.close(main_fd)


def long_capture(tmp_path) -> Path:
    """confluent_codecs.pcap with its packets repeated 4 times (the repeats are retransmissions)."""
    data = Path(CONFLUENT).read_bytes()
    path = tmp_path / "long.pcap"
    path.write_bytes(data + data[24:] * 3)
    assert path.stat().st_size >= PROGRESS_MIN_BYTES
    return path


def read_all(fd: int) -> bytes:
    out = b""
    while select.select([fd], [], [], 10)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        out += chunk
    return out


def test_progress_bar_draws_on_a_terminal_stderr_and_leaves_stdout_alone(tmp_path):
    path = long_capture(tmp_path)
    main_fd, tty_fd = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kafkasniff", "decode", "--stats", str(path)],
                            stdout=subprocess.PIPE, stderr=tty_fd, env={**os.environ, "TERM": "xterm"})
    os.close(tty_fd)
    drawn = read_all(main_fd)
    stdout = proc.communicate(timeout=60)[0].decode()
    os.close(main_fd)
    assert proc.returncode == 0
    assert b"long.pcap" in drawn and "━".encode() in drawn
    assert "long.pcap" not in stdout and "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━" not in stdout
    assert stdout.splitlines()[0].strip() == "per API (latency in ms)"


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kafkasniff", "decode", "--stats", str(long_capture(tmp_path))],
                            capture_output=True, timeout=60)
    assert result.returncode == 0 and result.stderr == b""


@pytest.mark.parametrize("views, given", [(["-V", "--json"], "-V"), (["--hex", "--json"], "--hex"),
                                          (["-V", "--hex", "--json"], "--hex")])
def test_a_view_given_with_json_is_a_clear_error(views, given):
    result = CliRunner().invoke(main, ["decode", *views, CONFLUENT])
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", f"kafkasniff: {given} and --json are two views, shown one at a time: pick one of them\n")


def test_stats_goes_with_any_view_and_hex_with_v():
    """--stats adds its summary to a view (README), and --hex implies -V: neither is a conflict."""
    assert json.loads(decode("--stats", "--json", CONFLUENT)[-1])["kind"] == "stats"
    assert decode("--stats", "-V", CONFLUENT)[:30] == decode("-V", CONFLUENT)[:30]
    assert decode("-V", "--hex", CONFLUENT) == decode("--hex", CONFLUENT)


def test_unknown_api_name_is_a_clear_error():
    result = CliRunner().invoke(main, ["decode", "--api", "Produse", CONFLUENT])
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", "kafkasniff: --api: unknown API 'Produse'; `kafkasniff apis` lists the names and keys\n")


def test_one_line_names_topics_partitions_batches_and_records_of_produce_and_fetch():
    """Fetch v16 names its topics by id only: the line shows the name the capture's Metadata gave that id."""
    lines = CliRunner().invoke(main, ["decode", CONFLUENT]).output.splitlines()
    fetches = [json.loads(line) for line in CliRunner().invoke(main, ["decode", "--json", "--api", "fetch", CONFLUENT])
               .output.splitlines()]
    request = next(f for f in fetches if f["kind"] == "request" and f["api_version"] == 16)
    assert "topic" not in request["body"]["topics"][0] and request["topics"] == ["confluent-none"]
    line = next(line for line in lines if f"Fetch v16 request corr={request['correlation_id']} " in line
                and f"#{request['stream']} " in line)
    partitions = [p["partition"] for p in request["body"]["topics"][0]["partitions"]]
    assert line.endswith(f" {request['size']}B confluent-none[{','.join(map(str, partitions))}]")
    big = next(line for line in lines if "Fetch v16 response" in line and "1049966B" in line)
    assert big.endswith(" confluent-none[2,1,0] 3 batches 6 records")
    metadata = next(line for line in lines if "Metadata v12 response" in line)
    assert "confluent-none" not in metadata  # only APIs that carry records name their topics


@settings(max_examples=300, deadline=None)
@given(ts=st.floats(min_value=0, max_value=4e9), latency=st.floats(min_value=-1e6, max_value=1e16),
       correlation_id=st.integers(-2**31, 2**31 - 1), batches=st.integers(0, 10**12),
       records=st.integers(0, 10**12), client_id=st.text(max_size=12))
def test_one_line_numbers_and_texts_are_written_as_python_formats_them(ts, latency, correlation_id, batches,
                                                                        records, client_id):
    # The one-line view writes its UTF-8 bytes itself (digits, thousands separators, milliseconds): each piece
    # must read exactly as Python's own formatting would have it.
    request, response = conversation((True, framed(METADATA_V1)),
                                     (False, framed(encode_response(3, 1, 7, {"Brokers": [], "Topics": []})[4:])))
    for ev in (request, response):
        ev.ts = ts
        ev.message.correlation_id = correlation_id
        ev.message.batches, ev.message.records = batches, records
    request.message.client_id = client_id
    response.latency_ms = latency
    micros = round(ts * 1e6)
    clock = time.strftime("%H:%M:%S", time.gmtime(micros // 10**6)) + f".{micros % 10**6:06d}"
    counts = (f" {batches:,} {'batch' if batches == 1 else 'batches'} {records:,} {'record' if records == 1 else 'records'}"
              if batches else "")
    assert message_line(request) == (f"{clock} #0 10.0.0.1:40000 → 10.0.0.2:9092 Metadata v1 request "
                                     f"corr={correlation_id} client={client_id!r} {len(METADATA_V1)}B{counts}")
    assert message_line(response) == (f"{clock} #0 10.0.0.1:40000 ← 10.0.0.2:9092 Metadata v1 response "
                                      f"corr={correlation_id} {response.message.end - response.message.offset}B "
                                      f"{latency:.3f}ms{counts}")
    assert message_row(response) == (message_line(response) + "\n").encode()


@settings(max_examples=200, deadline=None)
@given(topics=st.dictionaries(st.text(min_size=1, max_size=8),
                              st.lists(st.integers(-1, 2**31 - 1), max_size=30), max_size=4))
def test_topics_of_a_line_show_each_partition_once_and_at_most_twelve(topics):
    def expected(partitions: list[int]) -> str:
        distinct = list(dict.fromkeys(partitions))
        more = f",…+{len(distinct) - 12}" if len(distinct) > 12 else ""
        return f"[{','.join(map(str, distinct[:12]))}{more}]" if distinct else ""

    resolved = {name: [0, partitions] for name, partitions in topics.items()}
    shown = {name: name if name.isprintable() else repr(name) for name in topics}  # a damaged capture's, escaped
    assert topics_row(resolved) == "".join(f" {shown[name]}{expected(p)}" for name, p in topics.items()).encode()
