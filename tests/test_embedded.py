"""Consumer-protocol bytes inside JoinGroup and SyncGroup decode with their schemas."""

import json
import struct
from pathlib import Path

from click.testing import CliRunner

from kafkasniff.cli import main
from kafkasniff.protocol.encoder import encode_request, encode_response, encode_struct
from kafkasniff.protocol.messages import decode_request, decode_response
from kafkasniff.protocol.schema import data_variant

CAPTURES = Path(__file__).resolve().parent.parent / "captures"


def subscription(version: int, values: dict) -> bytes:
    return struct.pack(">h", version) + encode_struct(data_variant("ConsumerProtocolSubscription", version),
                                                      version, values)


def test_join_group_request_consumer_subscription_v1_with_owned_partitions():
    meta = subscription(1, {"Topics": ["orders", "audit"], "UserData": b"\x01\x02",
                            "OwnedPartitions": [{"Topic": "orders", "Partitions": [0, 2]}]})
    frame = encode_request(11, 5, 9, "c", {"GroupId": "g", "ProtocolType": "consumer",
                                           "Protocols": [{"Name": "range", "Metadata": meta}]})
    msg = decode_request(frame, 4)
    assert msg.complete
    metadata = msg.body["Protocols"].children[0]["Metadata"]
    assert metadata.note == "ConsumerProtocolSubscription"
    assert metadata["Version"].value == 1
    assert [t.value for t in metadata["Topics"].children] == ["orders", "audit"]
    owned = metadata["OwnedPartitions"].children[0]
    assert owned["Topic"].value == "orders" and [p.value for p in owned["Partitions"].children] == [0, 2]
    # The embedded fields sit inside the bytes field: offsets point into the frame.
    assert metadata["Version"].offset == metadata.end - len(meta)
    assert frame[metadata["Version"].offset:metadata["Version"].offset + 2] == b"\x00\x01"


def test_other_protocol_types_stay_bytes():
    meta = subscription(0, {"Topics": ["t"]})
    frame = encode_request(11, 5, 9, "c", {"GroupId": "g", "ProtocolType": "connect",
                                           "Protocols": [{"Name": "default", "Metadata": meta}]})
    metadata = decode_request(frame, 4).body["Protocols"].children[0]["Metadata"]
    assert metadata.children is None and metadata.value == meta


def test_sync_group_v0_response_without_protocol_type_decodes_only_when_exact():
    assignment = struct.pack(">h", 0) + encode_struct(
        data_variant("ConsumerProtocolAssignment", 0), 0,
        {"AssignedPartitions": [{"Topic": "t", "Partitions": [1]}], "UserData": None})
    good = decode_response(encode_response(14, 0, 1, {"Assignment": assignment}), 14, 0, 4)
    assert good.body["Assignment"].note == "ConsumerProtocolAssignment"
    odd = decode_response(encode_response(14, 0, 1, {"Assignment": b"\x00\x00\xff"}), 14, 0, 4)
    assert odd.body["Assignment"].children is None


def test_real_consumer_group_assignment_from_capture():
    result = CliRunner().invoke(main, ["decode", "--json", "--api", "SyncGroup", str(CAPTURES / "consumer_group.pcap")])
    assert result.exit_code == 0
    responses = [json.loads(line) for line in result.output.splitlines() if '"response"' in line]
    assert responses
    for r in responses:
        assert r["body"]["assignment"]["assigned_partitions"] == [{"topic": "group-topic", "partitions": [0, 1, 2]}]
