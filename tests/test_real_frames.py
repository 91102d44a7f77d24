"""Frames from real clients talking to a real broker, decoded and checked against what the clients sent."""

import struct

import pytest

from clients import Message, produce_confluent, produce_kafka_python
from broker import BROKER_TO_CLIENT, CLIENT_TO_BROKER
from kafkasniff.protocol.messages import decode_request, decode_response_for_request

MESSAGES = [
    Message(b"k1", b"first value", (("trace", b"abc"),)),
    Message(None, b"no key here"),
    Message(b"k3", "ünïcödé".encode(), (("a", b"1"), ("b", b"2"))),
    # Clients send a batch uncompressed when compression would not make it smaller.
    Message(b"k4", b"compress me " * 400),
]


def conversations(recorded):
    """(request Message, response Message) pairs of every connection, matched by correlation id."""
    assert recorded.wait_closed()
    pairs = []
    for conn in recorded.connections:
        requests = {}
        for frame in recorded.frames(conn, CLIENT_TO_BROKER):
            msg = decode_request(frame, 4)
            assert msg.complete, msg
            assert msg.body.end == len(frame)
            requests[msg.correlation_id] = msg
        for frame in recorded.frames(conn, BROKER_TO_CLIENT):
            correlation_id = struct.unpack_from(">i", frame, 4)[0]
            req = requests.pop(correlation_id)
            resp = decode_response_for_request(frame, req.api_key, req.api_version, 4)
            assert resp.complete, (req, resp)
            pairs.append((req, resp))
        assert all(r.api_name == "Produce" and r.body["Acks"].value == 0 for r in requests.values())
    return pairs


def produced_records(pairs, topic):
    out = []
    for req, _ in pairs:
        if req.api_name != "Produce":
            continue
        for t in req.body["TopicData"].children:
            assert t["Name"].value == topic
            for p in t["PartitionData"].children:
                for batch in p["Records"].children:
                    assert batch.type == "RecordBatch" and batch.value["crc_valid"]
                    out += [(batch.value["codec"], r.value) for r in batch["records"].children]
    return out


def as_sent(m: Message):
    return (m.key, m.value, [[k, v] for k, v in m.headers])


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_kafka_python_frames_field_by_field(recorded_broker, unique_name, codec):
    topic = unique_name("kp")
    recorded_broker.create_topic(topic, 1)
    produce_kafka_python(recorded_broker.bootstrap, topic, [m for m in MESSAGES], codec=codec)
    pairs = conversations(recorded_broker)
    first = pairs[0][0]
    assert (first.api_name, first.header_version) == ("ApiVersions", 2)
    assert first.client_id.startswith("kafka-python-producer")
    assert first.body["ClientSoftwareName"].value == "kafka-python"
    assert first.body["ClientSoftwareVersion"].value == "3.0.12"
    # The ApiVersions response header is v0 even for a flexible version.
    assert pairs[0][1].header_version == 0 and pairs[0][1].body["ErrorCode"].value == 0
    produce = [(q, r) for q, r in pairs if q.api_name == "Produce"]
    assert produce
    for req, resp in produce:
        assert req.body["Acks"].value == -1 and req.body["TimeoutMs"].value == 30000
        partition = resp.body["Responses"].children[0]["PartitionResponses"].children[0]
        assert partition["ErrorCode"].value == 0 and partition["ErrorCode"].note == "NONE"
    records = produced_records(pairs, topic)
    assert {c for c, _ in records} == {codec}
    assert [(r["key"], r["value"], r["headers"]) for _, r in records] == [as_sent(m) for m in MESSAGES]
    assert [r["offset"] for _, r in records] == [0, 1, 2, 3]


def test_confluent_kafka_frames_field_by_field(recorded_broker, unique_name):
    topic = unique_name("ck")
    recorded_broker.create_topic(topic, 1)
    produce_confluent(recorded_broker.bootstrap, topic, [m for m in MESSAGES], codec="lz4")
    pairs = conversations(recorded_broker)
    versions = [q for q, _ in pairs if q.api_name == "ApiVersions"]
    assert versions and versions[0].body["ClientSoftwareName"].value == "confluent-kafka-python"
    assert "2.16" in versions[0].body["ClientSoftwareVersion"].value
    metadata = [q for q, _ in pairs if q.api_name == "Metadata"]
    assert any(topic in [t["Name"].value for t in q.body["Topics"].children or ()] for q in metadata)
    records = produced_records(pairs, topic)
    assert {c for c, _ in records} == {"lz4"}
    assert [(r["key"], r["value"], r["headers"]) for _, r in records] == [as_sent(m) for m in MESSAGES]
