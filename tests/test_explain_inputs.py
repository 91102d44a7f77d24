"""`kafkasniff explain` on what users paste: tshark -x and tcpdump -x/-X/-XX dumps of whole packets (the
link, IP and TCP headers are left out), and --api-key/--api-version that do not fit the bytes."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest
from click.testing import CliRunner

import pcapkit
from capture_manifest import CAPTURES_DIR
from kafkasniff.cli import main
from kafkasniff.protocol.encoder import encode_request
from kafkasniff.protocol.identify import readings_text
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


def test_the_api_asked_for_is_given_by_name_or_key():
    assert explain("--api-key", "offsetcommit", "--api-version", "0", OFFSET_COMMIT_V0.hex()) == \
        explain("--api-key", "8", "--api-version", "0", OFFSET_COMMIT_V0.hex())


@pytest.mark.parametrize("args, message", [
    (["--api-key", "999", "--api-version", "0"],
     "--api-key: unknown API '999'; `kafkasniff apis` lists the names and keys"),
    (["--api-key", "Metadata", "--api-version", "99"],
     "--api-version 99: Kafka defines Metadata responses v0-v13; give one of those"),
    (["--request", "--api-key", "3", "--api-version", "-1"],
     "--api-version -1: Kafka defines Metadata requests v0-v13; give one of those"),
    (["--api-key", "3"], "--api-key and --api-version go together: give both, the API and version of the request "
                         "answered"),
])
def test_an_api_or_version_kafka_does_not_define_is_a_clear_error(args, message):
    """Before: API 999 was explained as UnknownApi999, and Metadata v99 as malformed where its bytes ran out."""
    result = CliRunner().invoke(main, ["explain", *args, "00 00 00 02 00 00"])
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"kafkasniff: {message}\n")


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


# ---------------------------------------------------------------- a size prefix the dump's length does not agree with

def exchange(stream: int, at: int) -> tuple[bytes, bytes]:
    """A request of consumer_group.pcap's connection `stream` (its frame `at`) and its response, size prefixes
    included."""
    steps = connection_frames("consumer_group", stream)
    return steps[at][1], steps[at + 1][1]


# (connection, frame): requests and responses of different APIs, of 26 to 1,124 bytes
EXCHANGES = {"Metadata v12": (0, 2), "InitProducerId v4": (1, 2), "Produce v9": (1, 4), "FindCoordinator v6": (3, 2),
             "ListOffsets v9": (3, 8), "Fetch v12": (3, 10), "SyncGroup v5": (4, 6)}
# The FindCoordinator v6 request a tester's dumps were made from
FIND_COORDINATOR = bytes.fromhex("00000020000a00060000000200066772702d633100000"
                                 "20c73776565702d67726f757000")


def message(stream: int, at: int, kind: str) -> tuple[bytes, list[str]]:
    """The request or the response of an exchange, and the options that name its API and version."""
    request, response = exchange(stream, at)
    key, version = struct.unpack_from(">hh", request, 4)
    return (request, []) if kind == "request" else (response, ["--api-key", str(key), "--api-version", str(version)])


def identity(document: dict) -> tuple:
    return document["kind"], document["api_name"], document["api_version"], document["correlation_id"]


# A response has only a correlation id for a header: a few bytes of one, read from their first byte (the size
# prefix taken for the correlation id), can fit its schema exactly by chance, and then that reading stays (as for a
# dump without a prefix). Sweeping every cut of every response of the captures up to 4 KB, that happened only in
# the first 22 bytes (and where a cut left exactly an older version, as ApiVersions v0 in v1).
SHORTEST_RESPONSE_CUT = 24


@pytest.mark.parametrize("kind", ["request", "response"])
@pytest.mark.parametrize("name", EXCHANGES)
def test_a_frame_cut_short_is_its_message_malformed_where_the_dump_stops(name, kind):
    """Before: the size prefix was read as the header (FindCoordinator v6 cut by a byte: 'Produce v32 request').
    Cut after its header, a frame is explained as its API and version, malformed where the same bytes under a size
    prefix that agrees with them are: the decoder stops where the bytes do."""
    frame, options = message(*EXCHANGES[name], kind)
    whole, _ = explain(*options, frame.hex())
    assert f"{whole['api_name']} v{whole['api_version']}" == name and whole["malformed"] is None
    body_at = next(row["offset"] for row in whole["rows"] if row["field"].startswith("body"))
    shortest = body_at + 1 if kind == "request" else SHORTEST_RESPONSE_CUT
    for cut in sorted({len(frame) - 1, len(frame) - 2, max(len(frame) * 3 // 4, shortest), shortest}):
        got, _ = explain(*options, frame[:cut].hex())
        agreeing, _ = explain(*(options or ["--request"]), (struct.pack(">i", cut - 4) + frame[4:cut]).hex())
        assert identity(got) == identity(whole) and got["size_prefix"] is True, cut
        assert got["malformed"] == agreeing["malformed"] and got["malformed"]["offset"] <= cut, cut
        assert (got["size"], got["trailing_bytes"], got["unexplained"]) == (cut - 4, 0, [])


def test_the_testers_cut_frame_and_frame_with_a_byte_more():
    cut, _ = explain(FIND_COORDINATOR[:-1].hex())
    assert identity(cut) == ("request", "FindCoordinator", 6, 2)
    assert cut["malformed"] == {"offset": 35, "reason": "varint runs past the end of the bytes"}
    assert cut["assumed"] == ("the dump holds 31 of the 32 bytes its size prefix declares: shown as a request "
                              "(a response cut short is not inferred: give --api-key/--api-version)")
    table = CliRunner().invoke(main, ["explain", FIND_COORDINATOR[:-1].hex()]).stdout.splitlines()
    assert table[0] == ("FindCoordinator v6 request · header v2 · correlation id 2 · client id 'grp-c1' · 31 of 32 "
                        "bytes + 4-byte size prefix")
    assert table[-1] == "MALFORMED at offset 35: varint runs past the end of the bytes"
    longer = CliRunner().invoke(main, ["explain", FIND_COORDINATOR.hex() + "ab"]).stdout.splitlines()
    assert longer[0].startswith("FindCoordinator v6 request · header v2 · correlation id 2 ·")
    assert longer[-2:] == ["36      ab                         _trailing                 bytes          0xab (1 "
                           "bytes after the end of the body)", "1 trailing byte after the body at offset 36"]


@pytest.mark.parametrize("kind", ["request", "response"])
@pytest.mark.parametrize("name", EXCHANGES)
def test_bytes_after_a_frame_are_trailing_bytes(name, kind):
    """Before: a response with 2 bytes more was read with its size prefix as its correlation id."""
    frame, options = message(*EXCHANGES[name], kind)
    whole, _ = explain(*options, frame.hex())
    for extra in (1, 2, 3, 7):
        got, _ = explain(*options, (frame + b"\xab" * extra).hex())
        assert identity(got) == identity(whole) and got["size_prefix"] is True, extra
        assert (got["malformed"], got["trailing_bytes"], got["following"]) == (None, extra, None), extra
        assert got["rows"][-1] == {"offset": len(frame), "length": extra, "hex": "ab" * extra, "field": "_trailing",
                                   "type": "bytes", "value": f"0x{' '.join(['ab'] * extra)} ({extra} bytes after "
                                                             f"the end of the body)"}


@pytest.mark.parametrize("first, second", [("FindCoordinator v6", "Metadata v12"), ("Produce v9", "Fetch v12"),
                                           ("SyncGroup v5", "SyncGroup v5")])
def test_two_requests_back_to_back_are_the_first_and_the_second_named(first, second):
    """Each is explained on its own: the first, with the second as trailing bytes said to be a frame."""
    one, two = exchange(*EXCHANGES[first])[0], exchange(*EXCHANGES[second])[0]
    got, _ = explain((one + two).hex())
    assert identity(got) == identity(explain(one.hex())[0])
    assert (got["malformed"], got["trailing_bytes"]) == (None, len(two))
    assert got["following"] == (f"the bytes after the frame begin with 1 more size-prefixed frame ({second} request);"
                                f" explain it on its own")


def test_frames_back_to_back_then_bytes_that_are_not_one():
    """Responses are named when they read as the first one does (the API and version given)."""
    response, options = message(*EXCHANGES["FindCoordinator v6"], "response")
    got, _ = explain(*options, (response * 3 + b"\x00\x00").hex())
    assert identity(got) == ("response", "FindCoordinator", 6, 2)
    assert (got["malformed"], got["trailing_bytes"]) == (None, 2 * len(response) + 2)
    assert got["following"] == ("the bytes after the frame begin with 2 more size-prefixed frames (FindCoordinator "
                                "v6 response, FindCoordinator v6 response, then 2 bytes); explain them one at a time")


def test_a_dump_of_two_packets_is_the_first_request_and_the_next_named(tmp_path):
    """tcpdump -X of a client's ApiVersions and Metadata requests, a packet each."""
    packets = pcapkit.read_packets(CAPTURE)
    path = pcapkit.write_pcap(tmp_path / "two.pcap", [packets[3], packets[METADATA_PACKET]])
    got, note = explain(text=tool_dump("tcpdump", path, "-X"))
    assert note == "took the TCP payload of 2 packets (IPv4, TCP headers, 104 bytes left out)\n"
    assert identity(got) == ("request", "ApiVersions", 4, 1)
    assert (got["malformed"], got["trailing_bytes"]) == (None, len(METADATA))
    assert got["following"] == ("the bytes after the frame begin with 1 more size-prefixed frame (Metadata v12 "
                                "request); explain it on its own")


def test_a_dump_without_a_size_prefix_is_read_as_before():
    """Its first 4 bytes (API key and version) name a size past the dump's end: the request read whole wins."""
    got, _ = explain(METADATA[4:].hex())
    assert (identity(got), got["size_prefix"], got["malformed"]) == (("request", "Metadata", 12, 2), False, None)


def test_an_inferred_response_is_named_with_its_article():
    response = exchange(0, 0)[1]
    got, _ = explain(response.hex())
    assert got["assumed"] == ("assumed an ApiVersions v3 response: it is the most plausible of 3 response schemas "
                              "that consume the bytes exactly")


def test_readings_that_fit_are_named_by_api_with_their_versions_joined():
    """How a line names the other readings of some bytes (an inferred response in `decode`, `explain`): each API
    once, in the order of its first reading, its versions ascending with runs joined; past three APIs, a count."""
    assert readings_text([("Fetch", 17), ("Fetch", 13), ("Fetch", 14), ("Fetch", 15), ("Fetch", 18)]) == \
        "Fetch v13-v15 v17-v18"
    assert readings_text([("Metadata", 6)]) == "Metadata v6"
    assert readings_text([("OffsetCommit", 8), ("TxnOffsetCommit", 3), ("OffsetCommit", 9), ("AlterReplicaLogDirs", 2),
                          ("Produce", 1), ("Produce", 3), ("Fetch", 0)]) == \
        "OffsetCommit v8-v9, TxnOffsetCommit v3, AlterReplicaLogDirs v2 and 2 more APIs"


def test_bytes_too_few_for_a_header_are_headed_as_of_unknown_api_and_version():
    """Before: `? vNone request`."""
    result = CliRunner().invoke(main, ["explain", "00 01"])
    assert result.stdout.splitlines()[0] == "request of unknown API and version · 2 bytes"


# ---------------------------------------------------------------- raw bytes, unreadable input, a reader going away

EXAMPLE_FRAME = Path(__file__).resolve().parents[1] / "examples" / "produce-request.bin"


def test_a_file_or_standard_input_that_is_not_text_is_the_frames_bytes():
    """Before: `line 1: '\\x00\\x00\\x05s\\x00\\x00\\x00' is not hex`."""
    frame = EXAMPLE_FRAME.read_bytes()
    note = f"took the input's {len(frame)} bytes as they are (it is not text)\n"
    assert explain("-f", str(EXAMPLE_FRAME)) == (explain(frame.hex())[0], note)
    assert explain(text=frame) == (explain(frame.hex())[0], note)


@pytest.mark.parametrize("args, message", [
    (["-f", "nope.hex"], "cannot read nope.hex: no such file; check the path"),
    (["-f", str(CAPTURES_DIR)], f"cannot read {CAPTURES_DIR}: it is a directory; give --file a file"),
    (["# only a comment"], "no hex bytes found in the input; give the message as hex (00 01 ...), a hex dump or its "
                           "raw bytes (see kafkasniff explain --help)"),
])
def test_input_that_cannot_be_read_is_a_one_line_error_saying_what_to_do(args, message):
    result = CliRunner().invoke(main, ["explain", *args])
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"kafkasniff: {message}\n")


@pytest.mark.parametrize("view", [[], ["--json"]])
def test_reader_going_away_ends_explain_quietly(view):
    """`explain ... | head -1` exited with status 1, as decode no longer does."""
    request = encode_request(3, 1, 7, "client", {"Topics": [{"Name": f"orders-{i}"} for i in range(3000)]})
    proc = subprocess.Popen([sys.executable, "-m", "kafkasniff", "explain", *view, request.hex()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    assert first.startswith(b"{" if view else b"Metadata v1 request")
    assert proc.stderr.read() == b""


def test_help_names_every_dump_format_the_readme_does():
    help_text = " ".join(CliRunner().invoke(main, ["explain", "--help"]).stdout.split())
    for dump_format in ("xxd", "hexdump -C", "od -An -tx1", "tcpdump -x/-X/-XX", "tshark -x"):
        assert dump_format in help_text


def decode_hex(*args: str) -> str:
    return CliRunner().invoke(main, ["decode", "--hex", "--stream", "0", *args, str(CAPTURE)]).stdout


def test_the_byte_table_of_decode_hex_full_is_read_as_the_frames_it_shows():
    """Before: `line 1: 'offset' is not hex` (or the message's heading line)."""
    table = decode_hex("--full")
    frames = [frame for _, frame in connection_frames("consumer_group", 0)]
    assert [block.data for block in parse_hex_blocks(table)] == frames
    lines = table.splitlines()
    headings = [i for i, line in enumerate(lines) if " #0 " in line]
    assert explain(text="\n".join(lines[:headings[1]]))[0] == explain(frames[0].hex())[0]


def test_a_byte_table_without_every_byte_is_a_clear_error():
    result = CliRunner().invoke(main, ["explain"], input=decode_hex())
    assert (result.exit_code, result.stderr) == (2, "kafkasniff: cannot read the hex dump: line 7: the row shows only "
                                                    "the first bytes of its range; make the table with decode --hex "
                                                    "--full\n")
