"""The skim behind the one-line view gives exactly the full decoder's verdicts, on every frame of every capture.

Each real frame is checked as captured, cut short at every length, and with bytes overwritten (a fixed seed,
so a failure repeats): the skim must find the same malformed offset and reason, the same trailing bytes,
the same ids and the same non-zero error codes, in order, as the full decoder did up to the same point.
"""

import random

import pytest

from kafkasniff.capture.files import open_capture
from kafkasniff.protocol.encoder import encode_request, encode_response
from kafkasniff.protocol.entities import error_codes
from kafkasniff.protocol.messages import _layout, decode_request, decode_response, decode_response_for_request
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


def _decode_both(data: bytes, request):
    if request is None:
        return decode_request(data), decode_request(data, skim=True)
    return decode_response_for_request(data, *request), decode_response_for_request(data, *request, skim=True)


def _errors(full):
    if full.body is None:
        return []
    return [(f.name, f.value) for _, f in full.body.walk() if f.type == "int16" and f.note and f.value]


def assert_skim_agrees(data: bytes, request) -> None:
    full, skim = _decode_both(data, request)
    assert (skim.api_key, skim.api_version, skim.correlation_id, skim.client_id) == \
        (full.api_key, full.api_version, full.correlation_id, full.client_id)
    assert skim.malformed == full.malformed
    assert (skim.trailing and skim.trailing.offset) == (full.trailing and full.trailing.offset)
    assert [e for e in skim.skimmed or () if e[0] != "Acks"] == _errors(full)


def skim_end(data: bytes, full) -> int:
    """Where the C interpreter's walk ends on a frame the full decoder read whole (REFUSED if it refused)."""
    program = _layout(full.kind, full.api_key, full.api_version).skim_program(full.api_version)
    return program.run(data, 0, len(data), [])


def test_the_captures_hold_many_shapes():
    assert len(FRAMES) > 150
    assert len({(request or (None,))[0] for _, request in FRAMES}) > 20


@pytest.mark.parametrize("index", range(len(FRAMES)))
def test_skim_agrees_on_real_frames_whole_cut_and_mutated(index):
    payload, request = FRAMES[index]
    assert_skim_agrees(payload, request)
    full, _ = _decode_both(payload, request)
    assert full.complete
    assert skim_end(payload, full) == len(payload)  # read in C, not refused and left to the full decoder
    for cut in range(len(payload) if len(payload) < 400 else 0, 0, -1):
        assert_skim_agrees(payload[:cut], request)
    rng = random.Random(index)
    for _ in range(MUTATIONS_PER_FRAME):
        frame = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            frame[rng.randrange(len(frame))] = rng.choice((0, 1, 2, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        assert_skim_agrees(bytes(frame), request)


def test_only_header_ids_and_produce_acks_are_kept_as_values():
    """A body field named like a header field (DescribeGroups members have a ClientId) is no error code."""
    frame = encode_response(15, 5, 7, {"Groups": [{
        "ErrorCode": 0, "GroupId": "g", "GroupState": "Stable", "ProtocolType": "consumer", "ProtocolData": "range",
        "Members": [{"MemberId": "m", "ClientId": "rdkafka", "ClientHost": "/127.0.0.1", "MemberMetadata": b"",
                     "MemberAssignment": b""}]}]}, size_prefix=False)
    msg = decode_response(frame, 15, 5, skim=True)
    assert (msg.correlation_id, msg.complete, msg.skimmed, error_codes(msg)) == (7, True, [], [])
    produce = encode_request(0, 9, 42, "prod1", {"Acks": 0, "TimeoutMs": 30000, "TopicData": []}, size_prefix=False)
    msg = decode_request(produce, skim=True)
    assert (msg.correlation_id, msg.client_id, msg.skimmed) == (42, "prod1", [("Acks", 0)])
