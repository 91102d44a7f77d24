"""The decode pipeline (capture -> TCP -> sessions -> messages) on the project's own captures,
checked against their manifests: what the clients produced and what the consumers read back."""

from __future__ import annotations

from functools import cache

import pytest

from capture_manifest import capture_names, load_capture, matches_bytes, tls_capture_names
from kafkasniff.capture.files import open_capture
from kafkasniff.protocol.messages import with_fields
from kafkasniff.protocol.records import records_of
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.session import MessageEvent, NoticeEvent

# TLS captures decrypted with their key logs must decode exactly as plaintext ones do.
CAPTURES = capture_names() + tls_capture_names()

# Requests whose response never came: in each case the client closed the connection first
# (tshark shows its FIN, and no response with that correlation id): aiokafka's and
# kafka-python's consumers leave a long-polling Fetch behind, librdkafka a Metadata request.
# Where the broker had not closed its side too (nor been reset) when the capture stopped, the capture ended
# the connection. (stream, request as the `unanswered` notice names it, what ended while it waited)
UNANSWERED = {
    "aiokafka_codecs": {(stream, "Fetch v11 corr=6", "capture") for stream in (3, 7, 11, 15, 19)},
    "confluent_codecs": {(8, "Metadata v12 corr=11", "connection")},
    "consumer_group": {(3, "Fetch v12 corr=12", "capture")},
    "port_19092": {(8, "Metadata v12 corr=10", "connection")},
    "consumer_lag": {(5, "Metadata v12 corr=122", "connection")},
    "rebalance_confluent_kafka": {(2, "Metadata v12 corr=53", "connection"),
                                  (12, "Metadata v12 corr=22", "connection")},
    "tls/tls12_suites": {(15, "Fetch v11 corr=6", "connection")},
}


@cache
def events(name: str) -> tuple:
    """Every event of the capture, its messages with their Field trees, without any port hint. TLS captures:
    decrypted with their key logs, the TLS notices (bytes around the plaintext) left out and checked."""
    capture = load_capture(name)
    keylog = KeyLog([str(capture.keylog)]) if capture.keylog else None
    with open_capture(capture.pcap) as reader:
        out = tuple(Analyzer(keylog=keylog).run(reader.segments()))
        assert reader.warnings == []
    if keylog is not None:
        notices = [ev for ev in out if type(ev) is NoticeEvent and ev.kind == "tls"]
        assert {(ev.kind, ev.text) for ev in notices} == {("tls", "TLS: handshake, record headers and authentication tags")}
        out = tuple(ev for ev in out if not (type(ev) is NoticeEvent and ev.kind == "tls"))
    for ev in out:
        if type(ev) is MessageEvent:
            with_fields(ev.message, ev.payload)
    return out


def message_events(name: str) -> list[MessageEvent]:
    return [ev for ev in events(name) if type(ev) is MessageEvent]


def messages(name: str, api: str, kind: str) -> list[MessageEvent]:
    return [ev for ev in message_events(name) if ev.message.api_name == api and ev.message.kind == kind]


def batches(records_field) -> list:
    return [item for item in records_field.children or () if item.type in ("RecordBatch", "Message")]


def record_facts(record) -> tuple:
    v = record.value
    return v["key"], v["value"], tuple((k, h) for k, h in v["headers"])


def topic_ids(name: str) -> dict[str, str]:
    """Topic id -> name from the Metadata responses of the capture."""
    out = {}
    for ev in messages(name, "Metadata", "response"):
        for topic in ev.message.body["Topics"].children:
            topic_id = topic.child("TopicId")
            if topic_id is not None:
                out[topic_id.value] = topic["Name"].value
    return out


def produced(name: str) -> dict[tuple[str, int, int], tuple]:
    """(topic, partition, offset the broker acknowledged) -> (key, value, headers, codec, transactional)."""
    out = {}
    for response in messages(name, "Produce", "response"):
        base_offsets = {(t["Name"].value, p["Index"].value): p["BaseOffset"].value
                        for t in response.message.body["Responses"].children
                        for p in t["PartitionResponses"].children}
        for topic in response.request.message.body["TopicData"].children:
            for partition in topic["PartitionData"].children:
                key = (topic["Name"].value, partition["Index"].value)
                (batch,) = batches(partition["Records"])  # one batch per partition in every capture
                for record in records_of(batch):
                    delta = record.value["offset"] - batch.value["base_offset"]
                    out[key + (base_offsets[key] + delta,)] = record_facts(record) + (
                        batch.value["codec"], batch.value["is_transactional"])
    return out


def fetched(name: str) -> dict[tuple[str, int, int], tuple]:
    """(topic, partition, offset) -> (key, value, headers) of every data record in Fetch responses."""
    names = topic_ids(name)
    out = {}
    for response in messages(name, "Fetch", "response"):
        for topic in response.message.body["Responses"].children:
            topic_name = topic["Topic"].value if topic.child("Topic") else names[topic["TopicId"].value]
            for partition in topic["Partitions"].children:
                for batch in batches(partition["Records"]):
                    if batch.value["is_control"]:
                        continue
                    for record in records_of(batch):
                        where = (topic_name, partition["PartitionIndex"].value, record.value["offset"])
                        facts = record_facts(record)
                        assert out.setdefault(where, facts) == facts, f"{where} fetched twice, differently"
    return out


def all_batches(name: str) -> list:
    out = []
    for ev in message_events(name):
        body = ev.message.body
        for _path, f in body.walk() if body is not None else ():
            if f.type == "records" and f.children is not None:
                out.extend(batches(f))
    return out


@pytest.mark.parametrize("name", CAPTURES)
def test_every_frame_decodes_and_every_request_is_answered(name):
    """Every request is answered but those UNANSWERED, which one `unanswered` notice per connection names."""
    evs = message_events(name)
    notices = [ev for ev in events(name) if type(ev) is not MessageEvent]  # no raw SASL tokens, no other notice
    assert {(ev.conn.stream, ev.kind, ev.direction, ev.size, ev.text) for ev in notices} == {
        (stream, "unanswered", "c2s", 0, f"1 request without a response when the {end} ended: {request}")
        for stream, request, end in UNANSWERED.get(name, ())}
    assert len(notices) == len(UNANSWERED.get(name, ()))
    assert evs
    assert [ev.message for ev in evs if not ev.message.complete] == []
    requests = [ev for ev in evs if ev.message.kind == "request"]
    responses = [ev for ev in evs if ev.message.kind == "response"]
    assert all(ev.expects_response for ev in requests)  # every client here produces with acks != 0
    assert [ev for ev in responses if ev.inferred or ev.request is None] == []
    for ev in responses:
        assert ev.request.conn is ev.conn
        assert ev.request.message.correlation_id == ev.message.correlation_id
        assert ev.request.message.api_key == ev.message.api_key
        assert ev.latency_ms >= 0
    answered = {id(ev.request) for ev in responses}
    assert len(answered) == len(responses)
    unanswered = {(ev.conn.stream, f"{ev.message.api_name} v{ev.message.api_version} corr={ev.message.correlation_id}")
                  for ev in requests if id(ev) not in answered}
    assert unanswered == {(stream, request) for stream, request, _ in UNANSWERED.get(name, ())}
    assert len(responses) == len(requests) - len(unanswered)


@pytest.mark.parametrize("name", [n for n in CAPTURES if load_capture(n).manifest["produced"]])
def test_produced_records_equal_the_manifest(name):
    capture = load_capture(name)
    expected = {(p.topic, p.partition, p.offset): (p.key, p.value, p.headers) for p in capture.produced()}
    seen = produced(name)
    assert {where: facts[:3] for where, facts in seen.items()} == expected
    for p in capture.produced():
        codec, transactional = seen[p.topic, p.partition, p.offset][3:]
        # Clients leave a batch uncompressed when compressing would not make it smaller.
        assert codec in (p.codec, "none")
        assert transactional == (p.transaction is not None)


@pytest.mark.parametrize("name", [n for n in CAPTURES if load_capture(n).manifest["produced"]])
def test_codecs_seen_are_the_manifest_codecs(name):
    wanted, seen = {}, {}
    for p in load_capture(name).produced():
        wanted.setdefault(p.topic, set()).add(p.codec)
    for (topic, _partition, _offset), facts in produced(name).items():
        seen.setdefault(topic, set()).add(facts[3])
    assert seen.keys() == wanted.keys()
    for topic in wanted:
        # The configured codec is on the wire; batches too small to gain from it go uncompressed.
        assert wanted[topic] <= seen[topic] <= wanted[topic] | {"none"}, topic


@pytest.mark.parametrize("name", [n for n in CAPTURES if load_capture(n).manifest.get("consumed")])
def test_fetched_records_equal_what_was_produced_and_consumed(name):
    capture = load_capture(name)
    seen = fetched(name)
    made = {where: facts[:3] for where, facts in produced(name).items()}
    assert seen == made  # the consumers read every produced record back, and nothing else
    consumed = capture.manifest["consumed"]
    assert len(consumed) == len(made)
    for entry in consumed:
        key, value, headers = seen[entry["topic"], entry["partition"], entry["offset"]]
        assert matches_bytes(entry["key"], key)
        assert matches_bytes(entry["value"], value)
        assert [h["key"] for h in entry["headers"]] == [k for k, _ in headers]
        assert all(matches_bytes(h["value"], v) for h, (_, v) in zip(entry["headers"], headers))


# Record batches per capture, produced and fetched, control batches included (tshark 4.0, which
# reads aiokafka's Produce v7 and Fetch v11, also counts 30 batch CRCs in aiokafka_codecs.pcap).
BATCHES = {"admin": 0, "aiokafka_codecs": 30, "confluent_codecs": 32, "consumer_group": 6,
           "kafka_python_api_versions": 20, "kafka_python_codecs": 30, "port_19092": 8, "transactions": 36,
           # produced once, fetched by each group that reads it (in rebalance_aiokafka one batch is fetched twice)
           "consumer_lag": 120, "rebalance_aiokafka": 25, "rebalance_confluent_kafka": 24,
           "rebalance_kafka_python": 24,
           "tls/tls12_suites": 20, "tls/tls13_suites": 12}


@pytest.mark.parametrize("name", CAPTURES)
def test_every_crc_is_valid(name):
    found = all_batches(name)
    assert len(found) == BATCHES[name]
    assert [b for b in found if not b.value["crc_valid"]] == []


def test_transactions_show_commit_and_abort_control_batches():
    names = topic_ids("transactions")
    markers = {}
    for ev in messages("transactions", "Fetch", "response"):
        for topic in ev.message.body["Responses"].children:
            topic_name = topic["Topic"].value if topic.child("Topic") else names[topic["TopicId"].value]
            for partition in topic["Partitions"].children:
                for batch in batches(partition["Records"]):
                    if batch.value["is_control"]:
                        (record,) = records_of(batch)
                        where = (topic_name, partition["PartitionIndex"].value, record.value["offset"])
                        markers[where] = record["key"]["Type"].note
    # Each producer writes one record to each of 3 partitions per transaction: commits the first
    # transaction (data at offset 0, marker at 1), aborts the second (data at 2, marker at 3).
    assert markers == {(topic, partition, offset): kind
                       for topic in ("tx-confluent-kafka", "tx-kafka-python") for partition in range(3)
                       for offset, kind in ((1, "COMMIT"), (3, "ABORT"))}


def test_pinned_api_versions_show_older_protocol_versions():
    versions = {}
    for ev in events("kafka_python_api_versions"):
        m = ev.message
        if m.kind == "request" and m.api_name in ("Produce", "Fetch"):
            topics = m.body["TopicData" if m.api_name == "Produce" else "Topics"].children
            for topic in topics:
                name = topic["Name" if m.api_name == "Produce" else "Topic"].value
                versions.setdefault(name, set()).add((m.api_name, m.api_version))
    # kafka-python's api_version pin -> the Produce and Fetch versions it speaks
    assert versions == {
        "api-0-11": {("Produce", 3), ("Fetch", 5)},
        "api-1-0": {("Produce", 5), ("Fetch", 6)},
        "api-2-0": {("Produce", 6), ("Fetch", 8)},
        "api-2-5": {("Produce", 8), ("Fetch", 11)},
        "api-3-0": {("Produce", 9), ("Fetch", 12)},
    }
    api_versions = {m.api_version for m in (ev.message for ev in events("kafka_python_api_versions"))
                    if m.api_name == "ApiVersions"}
    assert api_versions == {1, 2, 3}


def test_port_19092_decodes_without_a_port_hint():
    evs = message_events("port_19092")
    assert len(evs) == 59
    assert {ev.conn.server.port for ev in evs} == {19092}
    assert all(ev.message.kind == ("request" if ev.src.port != 19092 else "response") for ev in evs)
