"""`kafkasniff explain` on what users paste: tshark -x and tcpdump -x/-X/-XX dumps of whole packets (the
link, IP and TCP headers are left out), and --api-key/--api-version that do not fit the bytes."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import crc32c
import pytest
from click.testing import CliRunner

import pcapkit
from capture_manifest import CAPTURES_DIR
from kafkasniff.cli import main
from kafkasniff.protocol.encoder import encode_request
from kafkasniff.protocol.records_encoder import Record, encode_record_batch
from kafkasniff.render.hexinput import parse_hex_blocks
from loopback import connection_frames

# consumer_group.pcap: the packets of its first connection's Metadata v12 request (with the handshake before)
CAPTURE = CAPTURES_DIR / "consumer_group.pcap"
METADATA = connection_frames("consumer_group", 0)[2][1]


def explain(*args: str, text: str | None = None) -> tuple[dict, str]:
    result = CliRunner().invoke(main, ["explain", "--json", *args], input=text)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def dump(args: list[str]) -> str:
    if shutil.which(args[0]) is None:
        pytest.skip(f"{args[0]} is not installed")
    return subprocess.run(args, capture_output=True, check=True, text=True).stdout


def tool_dump(tool: str, path: Path, *options: str) -> str:
    if tool == "tshark":
        return dump(["tshark", "-r", str(path), "-x", *options])
    return dump(["tcpdump", "-n", "-r", str(path), *options])


def first_packets(count: int, tmp_path: Path) -> Path:
    return pcapkit.write_pcap(tmp_path / "first.pcap", pcapkit.read_packets(CAPTURE)[:count])


METADATA_PACKET = 7  # the handshake, ApiVersions request, ACK, response, ACK, then the Metadata request


@pytest.mark.parametrize("tool, options, headers", [
    ("tshark", [], "Ethernet, IPv4, TCP headers, 66 bytes"),
    ("tcpdump", ["-x"], "IPv4, TCP headers, 52 bytes"),
    ("tcpdump", ["-X"], "IPv4, TCP headers, 52 bytes"),
    ("tcpdump", ["-XX"], "Ethernet, IPv4, TCP headers, 66 bytes"),
], ids=["tshark-x", "tcpdump-x", "tcpdump-X", "tcpdump-XX"])
def test_a_dumped_packet_is_explained_as_the_kafka_bytes_it_carries(tmp_path, tool, options, headers):
    path = pcapkit.write_pcap(tmp_path / "one.pcap", [pcapkit.read_packets(CAPTURE)[METADATA_PACKET]])
    assert pcapkit.tcp_of(pcapkit.read_packets(path)[0].frame).data == METADATA
    got, note = explain(text=tool_dump(tool, path, *options))
    assert got == explain(METADATA.hex())[0]
    assert got["api_name"] == "Metadata" and got["malformed"] is None
    assert note == f"took the TCP payload of 1 packet ({headers} left out)\n"


@pytest.mark.parametrize("tool, options", [("tshark", []), ("tcpdump", ["-x"]), ("tcpdump", ["-XX"])],
                         ids=["tshark-x", "tcpdump-x", "tcpdump-XX"])
def test_a_message_in_several_segments_is_put_together(tmp_path, tool, options):
    """tcpdump: the packets' TCP payloads, in order (the handshake and closing packets carry none);
    tshark: the data it reassembled, where it shows some."""
    request = encode_request(3, 1, 7, "client", {"Topics": [{"Name": f"orders-{i}"} for i in range(20)]})
    conversation = pcapkit.TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), mss=100)
    path = pcapkit.write_pcap(tmp_path / "segments.pcap", conversation.send(True, request).close())
    text = tool_dump(tool, path, *options)
    got, note = explain(text=text)
    assert got == explain(request.hex())[0]
    if tool == "tshark":
        assert [block.source for block in parse_hex_blocks(text)].count("Reassembled TCP") == 1
        assert note == f"took tshark's reassembled TCP data ({len(request)} bytes)\n"
    else:
        assert note.startswith("took the TCP payload of 9 packets (")


def test_packets_without_payload_are_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["explain"], input=tool_dump("tcpdump", first_packets(3, tmp_path), "-x"))
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (2, "kafkasniff: the packets in the dump carry no "
                                                                      "TCP payload")


def test_headers_are_left_out_only_where_their_lengths_agree_with_the_bytes():
    """The IP length must end the packet where the dump ends (Kafka bytes never pass for a packet): the
    Metadata packet with one byte more is explained as it is, whole."""
    frame = pcapkit.read_packets(CAPTURE)[METADATA_PACKET].frame
    got, note = explain((frame[14:] + b"\x00").hex())
    assert note == ""
    assert got["size"] == len(frame) - 14 + 1
    assert explain(METADATA.hex())[1] == ""


# ---------------------------------------------------------------- --api-key / --api-version

OFFSET_COMMIT_V0 = encode_request(8, 0, 7, "c", {"GroupId": "g", "Topics": [
    {"Name": "t", "Partitions": [{"PartitionIndex": 0, "CommittedOffset": 5}]}]})


def test_a_response_schema_asked_for_decodes_the_bytes_and_shows_where_they_break():
    """Before: the bytes were silently explained as the OffsetCommit v0 request they are."""
    got, _ = explain("--api-key", "2", "--api-version", "0", OFFSET_COMMIT_V0.hex())
    assert (got["kind"], got["api_name"], got["api_version"]) == ("response", "ListOffsets", 0)
    assert got["malformed"] == {"offset": 15, "reason": "Partitions: array count 91904 exceeds the 24 bytes left"}
    assert got["suggestion"] == (
        "a ListOffsets v0 response does not fit these bytes exactly; these do: OffsetCommit v0 request, "
        "StreamsGroupHeartbeat v0 response (pick one with --request, or --api-key/--api-version)")
    table = CliRunner().invoke(main, ["explain", "--api-key", "2", "--api-version", "0", OFFSET_COMMIT_V0.hex()])
    assert got["suggestion"] in table.stdout.splitlines()


def test_a_request_whose_header_says_the_api_asked_for_is_that_request():
    got, _ = explain("--api-key", "8", "--api-version", "0", OFFSET_COMMIT_V0.hex())
    assert (got["kind"], got["api_name"], got["malformed"], got["suggestion"]) == (
        "request", "OffsetCommit", None, None)


def test_a_malformed_item_of_records_is_explained_as_its_offset_and_reason():
    """explain --json of a Produce whose record batch holds a record cut short: the malformed item's value is
    where and why, as decode --json gives it (it was a Python object json could not write: a traceback)."""
    batch = bytearray(encode_record_batch([Record(b"key", b"value")]))
    batch[61] = 0x7E  # the record claims 63 bytes; 14 follow
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    frame = encode_request(0, 9, 6, "c", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": bytes(batch)}]}]})
    document, _ = explain(frame.hex())
    bad_record_at = frame.index(bytes(batch)) + 61

    def malformed(node: dict) -> list[dict]:
        found = [node] if node["type"] == "Malformed" else []
        return found + [m for child in node.get("children") or () for m in malformed(child)]

    [item] = [m for field in document["fields"] for m in malformed(field)]
    reason = "record length 63 does not fit the 14 bytes left"
    assert (item["offset"], item["value"]) == (bad_record_at, {"offset": bad_record_at, "reason": reason})
    assert [row["value"] for row in document["rows"] if row["type"] == "Malformed"] == \
        [f"offset {bad_record_at}: {reason}"]
