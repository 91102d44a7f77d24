"""Consumer-protocol bytes inside JoinGroup and SyncGroup decode with their schemas."""

import base64
import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from pcapkit import TcpConversation, write_pcap

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


def assignment(version: int, topic: bytes, partitions: list[int]) -> bytes:
    """ConsumerProtocolAssignment bytes with the topic name's bytes as given (UTF-8 or not)."""
    entry = struct.pack(">h", len(topic)) + topic + struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
    return struct.pack(">hi", version, 1) + entry + struct.pack(">i", -1)  # user data: null


def sync_group_capture(path: Path, assignment_bytes: bytes) -> Path:
    """A "consumer" group of one member, m: it joins (generation 1, its own leader), then its SyncGroup v5
    request and the response carry `assignment_bytes`."""
    meta = subscription(0, {"Topics": ["orders"]})
    join = {"GroupId": "g", "SessionTimeoutMs": 10000, "RebalanceTimeoutMs": 10000, "MemberId": "m",
            "ProtocolType": "consumer", "Protocols": [{"Name": "range", "Metadata": meta}]}
    joined = {"GenerationId": 1, "ProtocolName": "range", "Leader": "m", "MemberId": "m",
              "Members": [{"MemberId": "m", "Metadata": meta}]}
    sync = {"GroupId": "g", "GenerationId": 1, "MemberId": "m", "ProtocolType": "consumer",
            "ProtocolName": "range", "Assignments": [{"MemberId": "m", "Assignment": assignment_bytes}]}
    synced = {"ProtocolType": "consumer", "ProtocolName": "range", "Assignment": assignment_bytes}
    conversation = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092))
    conversation.send(True, encode_request(11, 5, 1, "c", join)).send(False, encode_response(11, 5, 1, joined))
    conversation.send(True, encode_request(14, 5, 2, "c", sync)).send(False, encode_response(14, 5, 2, synced))
    return write_pcap(path, conversation.close())


# The bytes of a "consumer" group's assignment that its schema cannot read: shown as bytes in every view (a
# partial struct hid where they went wrong), and the group analyses read no assignment from them.
UNREADABLE = {
    "cut short": assignment(0, b"orders", [0, 1])[:-9],
    "topic not UTF-8": assignment(0, b"\x90rders", [0, 1]),
    "more partitions than bytes": assignment(0, b"orders", [0, 1])[:14] + struct.pack(">i", 1 << 30) + b"\0" * 12,
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_consumer_assignment_bytes_the_schema_cannot_read_stay_bytes(case, tmp_path):
    raw = UNREADABLE[case]
    frame = encode_request(14, 5, 1, "c", {"GroupId": "g", "ProtocolType": "consumer", "ProtocolName": "range",
                                           "Assignments": [{"MemberId": "m", "Assignment": raw}]})
    field = decode_request(frame, 4).body["Assignments"].children[0]["Assignment"]
    assert field.children is None and field.value == raw

    capture = sync_group_capture(tmp_path / "sync.pcap", raw)
    lines = [json.loads(line) for line in run("decode", "--json", "--api", "SyncGroup", capture).splitlines()]
    assert [e["body"]["assignments"][0]["assignment"]["base64"] for e in lines if e["kind"] == "request"] == \
        [base64.b64encode(raw).decode()]
    assert [e["body"]["assignment"]["base64"] for e in lines if e["kind"] == "response"] == \
        [base64.b64encode(raw).decode()]
    tree = run("decode", "-V", "--api", "SyncGroup", capture)
    shown = "Assignment: 0x" + " ".join(f"{b:02x}" for b in raw) + "  bytes"
    assert tree.count(shown) == 2 and "AssignedPartitions" not in tree
    groups = json.loads(run("groups", "--json", capture))
    [generation] = groups[0]["generations"]
    assert [(member["member_id"], member["assignment"]) for member in generation["members"]] == [("m", None)]
    stats = json.loads(run("decode", "--stats", "--json", capture).splitlines()[-1])
    assert [(api["api_name"], api["requests"], api["responses"]) for api in stats["apis"]] == \
        [("JoinGroup", 1, 1), ("SyncGroup", 1, 1)]


def test_consumer_assignment_bytes_left_over_are_a_newer_versions_and_the_struct_is_shown(tmp_path):
    raw = assignment(0, b"orders", [0, 1]) + b"\x00\x07later"
    lines = [json.loads(line) for line in
             run("decode", "--json", "--api", "SyncGroup", sync_group_capture(tmp_path / "s.pcap", raw)).splitlines()]
    assert lines[0]["body"]["assignments"][0]["assignment"] == {
        "version": 0, "assigned_partitions": [{"topic": "orders", "partitions": [0, 1]}], "user_data": None}


def run(*args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output
