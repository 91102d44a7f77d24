"""Kafka's exceptions to its schema rules, each checked on exact bytes."""

from kafkasniff.protocol import quirks
from kafkasniff.protocol.encoder import encode_request, encode_response
from kafkasniff.protocol.messages import decode_request, decode_response, decode_response_for_request


def test_api_versions_response_header_is_v0_even_when_flexible():
    frame = encode_response(18, 3, 7, {"ErrorCode": 0, "ApiKeys": [{"ApiKey": 0, "MinVersion": 0, "MaxVersion": 9}]})
    # size, correlation id, then the body's error code directly: no header tag byte.
    assert frame[4:8] == b"\x00\x00\x00\x07" and frame[8:10] == b"\x00\x00"
    msg = decode_response(frame, 18, 3, 4)
    assert msg.header_version == 0 and msg.complete
    assert msg.body["ApiKeys"].children[0]["MaxVersion"].value == 9


def test_other_flexible_responses_use_header_v1():
    msg = decode_response(encode_response(3, 12, 7, {}), 3, 12, 4)
    assert msg.header_version == 1 and msg.header["_tagged_fields"].value == 0


def test_controlled_shutdown_v0_request_has_no_client_id():
    frame = encode_request(7, 0, 5, "ignored", {"BrokerId": 3})
    assert frame == bytes.fromhex("0000000c" "0007" "0000" "00000005" "00000003")
    msg = decode_request(frame, 4)
    assert (msg.header_version, msg.client_id, msg.body["BrokerId"].value) == (0, None, 3)
    assert decode_request(encode_request(7, 1, 5, "c", {"BrokerId": 3}), 4).header_version == 1


def test_client_id_keeps_int16_length_in_flexible_header_v2():
    frame = encode_request(3, 12, 1, "abc", {"Topics": None})
    assert frame[12:17] == b"\x00\x03abc"   # int16 length, not a compact varint
    assert frame[17] == 0                  # then the header's empty tagged-field section
    assert decode_request(frame, 4).client_id == "abc"


def test_api_versions_v0_fallback_when_the_broker_does_not_support_the_request_version():
    # A broker answers an unsupported ApiVersions v5 with a v0 body: UNSUPPORTED_VERSION and its ranges.
    frame = encode_response(18, 0, 1, {"ErrorCode": 35, "ApiKeys": [{"ApiKey": 18, "MinVersion": 0, "MaxVersion": 3}]})
    msg = decode_response_for_request(frame, 18, 5, 4)
    assert msg.complete and msg.api_version == 0
    assert msg.body["ErrorCode"].note == "UNSUPPORTED_VERSION"


def test_api_versions_v0_response_with_a_4_byte_trailer():
    frame = encode_response(18, 0, 1, {"ErrorCode": 0, "ApiKeys": []}) + b"\x00\x00\x00\x00"
    msg = decode_response(frame, 18, 0, 4)
    assert msg.malformed is None
    assert (msg.trailing.offset, msg.trailing.length) == (len(frame) - 4, 4)


def test_acks_zero_produce_expects_no_response():
    assert not quirks.expects_response(0, 9, 0)
    assert quirks.expects_response(0, 9, 1) and quirks.expects_response(0, 9, -1)
    assert quirks.expects_response(3, 12, None)


def test_raw_sasl_only_after_sasl_handshake_v0():
    assert quirks.starts_raw_sasl(17, 0)
    assert not quirks.starts_raw_sasl(17, 1)
