"""Random and mutated frames never crash the decoder, and lengths never allocate past the bytes present."""

import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkasniff.protocol.encoder import encode_request, encode_response
from kafkasniff.protocol.messages import decode_request, decode_response

REAL_FRAMES = [
    encode_request(0, 9, 42, "prod1", {"Acks": -1, "TimeoutMs": 30000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": b"\x00" * 70}]}]}, size_prefix=False),
    encode_request(3, 12, 7, "c1", {"Topics": [{"Name": "orders"}], "AllowAutoTopicCreation": True},
                   size_prefix=False),
    encode_response(3, 12, 7, {"Brokers": [{"NodeId": 1, "Host": "localhost", "Port": 9092}],
                               "Topics": [{"Name": "orders", "Partitions": [{"PartitionIndex": 0}]}]},
                    size_prefix=False),
    encode_request(18, 3, 1, "c1", {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}, size_prefix=False),
]
FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(msg, data):
    assert msg.end == len(data)
    if msg.malformed:
        assert 0 <= msg.malformed.offset <= len(data)
        assert msg.malformed.reason


@FAST
@given(st.binary(max_size=300))
def test_random_bytes_as_request(data):
    check(decode_request(data), data)


@FAST
@given(st.binary(max_size=300), st.integers(0, 94), st.integers(0, 18))
def test_random_bytes_as_response(data, key, version):
    check(decode_response(data, key, version), data)


@FAST
@given(st.sampled_from(range(len(REAL_FRAMES))), st.data())
def test_mutated_real_frames(i, draw):
    frame = bytearray(REAL_FRAMES[i])
    for _ in range(draw.draw(st.integers(1, 6))):
        pos = draw.draw(st.integers(0, len(frame) - 1))
        frame[pos] = draw.draw(st.integers(0, 255))
    cut = draw.draw(st.integers(0, len(frame)))
    data = bytes(frame[:cut])
    check(decode_request(data), data)
    check(decode_response(data, 3, 12), data)


def test_huge_length_fields_do_not_allocate():
    # Counts and lengths near 2^31 with only a few bytes behind them.
    frames = [
        bytes.fromhex("0003000c" "00000007" "0002" "6331" "00" "ffffffff07"),  # Metadata v12: compact topics count
        bytes.fromhex("00030000" "00000001" "0001" "61" "7fffffff"),          # Metadata v0: topics count
        bytes.fromhex("00000000" "00000001" "0001" "61" "0001" "00000000" "7fffffff"),  # Produce v0: topics count
        bytes.fromhex("00000000" "00000001" "0001" "61" "0001" "00000000" "00000001"
                      "0001" "74" "00000001" "00000000" "7fffffff"),          # Produce v0: records length
    ]
    tracemalloc.start()
    for data in frames:
        msg = decode_request(data)
        assert msg.malformed is not None and "exceeds" in msg.malformed.reason
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000
