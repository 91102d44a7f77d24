"""Inputs built to exhaust time or memory: each costs time and memory in proportion to its bytes, in every view,
and what it holds is still shown (issue 18).

Every capture is made here; each view runs as a process of its own (tests/measured.py), whose time and peak
resident memory are bounded. The captures are below the size at which decode starts worker processes, so one
process is the whole tree.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import subprocess
import sys

import cramjam
import pytest
from click.testing import CliRunner

from measured import decode_measured, run_measured
from pcapkit import TcpConversation, write_pcap
from kafkasniff.cli import main
from kafkasniff.protocol.compression import MiB
from kafkasniff.protocol.encoder import encode_request
from kafkasniff.protocol.records_encoder import Record, encode_record_batch

VIEWS = {"line": [], "json": ["--json"], "tree": ["-V"], "hex": ["--hex"], "stats": ["--stats", "--json"]}


def conversation_capture(path, *frames: tuple[bool, bytes]):
    """A captured TCP connection (handshake included) carrying the frames, (from_client, bytes) each."""
    conversation = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092))
    for from_client, frame in frames:
        conversation.send(from_client, frame)
    return write_pcap(path, conversation.close())


def produce(records: bytes) -> bytes:
    return encode_request(0, 9, 1, "hostile", {"Acks": 0, "TimeoutMs": 1000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": records}]}]})


def body_of(done) -> dict:
    return json.loads(done.head.split(b"\n", 1)[0])["body"]


# --- size fields that claim more than their bytes hold (item 4) ----------------------------------------------

CLAIMED = 64 * MiB - 1


def _lying_gzip() -> bytes:
    """A gzip stream of 100 bytes whose ISIZE trailer claims CLAIMED bytes."""
    stream = bytes(cramjam.gzip.compress(b"x" * 100))
    return stream[:-4] + struct.pack("<I", CLAIMED)


def _lying_snappy() -> bytes:
    """A raw snappy block of 100 bytes whose length varint claims CLAIMED bytes."""
    block = bytes(cramjam.snappy.compress_raw(b"y" * 100))
    assert block[0] == 100
    return bytes([0xFF, 0xFF, 0xFF, 0x1F]) + block[1:]


@pytest.fixture(scope="module")
def lying_sizes(tmp_path_factory):
    records = (encode_record_batch([], codec="gzip", compressed_payload=_lying_gzip(), record_count=1)
               + encode_record_batch([], codec="snappy", compressed_payload=_lying_snappy(), record_count=1,
                                     base_offset=1)
               + encode_record_batch([Record(value=b"after them")], base_offset=2))
    frame = produce(records)
    assert len(frame) < 450
    return conversation_capture(tmp_path_factory.mktemp("sizes") / "sizes.pcap", (True, frame))


@pytest.mark.parametrize("view", VIEWS)
def test_size_fields_do_not_size_buffers(lying_sizes, view):
    """A 430-byte frame whose gzip ISIZE and snappy length claim 64 MiB: nothing near that is allocated."""
    done = decode_measured(lying_sizes, VIEWS[view])
    assert done.returncode == 0, done.stderr
    assert done.peak_mb < 60, f"{view}: {done.peak_mb:.0f} MB"
    assert done.seconds < 10
    if view == "json":
        gzip, snappy, plain = body_of(done)["topic_data"][0]["partition_data"][0]["records"]
        assert gzip["note"] == "decompression failed: gzip: corrupt gzip stream does not have a matching checksum"
        assert snappy["note"] == ("decompression failed: snappy: a block of 12 bytes claims 67108863 bytes "
                                  "decompressed, more than it can make")
        assert [r["value"]["text"] for r in plain["records"]] == ["after them"]


# --- explain's input (item 5) ----------------------------------------------------------------------------------

XXD_LINE = "0000 0010 0003 0000 0000 0001 ffff 0000  ................"


def explain_measured(tmp_path, text: str, *options: str):
    dump = tmp_path / "dump.txt"
    dump.write_text(text)
    return run_measured([sys.executable, "-m", "kafkasniff", "explain", *options, "-f", str(dump)])


@pytest.mark.parametrize("last_offset", [
    "fffffffffffffff0",  # once an OverflowError and a traceback
    "20000000",          # once 97 s and 543 MB: 512 MiB of repeated lines
])
def test_a_repeat_line_cannot_claim_more_than_a_dump_may_hold(tmp_path, last_offset):
    text = f"00000000: {XXD_LINE}\n*\n{last_offset}: {XXD_LINE}\n"
    assert len(text) < 150
    done = explain_measured(tmp_path, text)
    assert done.returncode == 2
    assert done.stderr == (f"kafkasniff: cannot read the hex dump: line 3: offset 0x{last_offset} would repeat the "
                           f"line before '*' past the 16 MiB a dump may hold\n")
    assert done.seconds < 5 and done.peak_mb < 60


def test_an_error_quotes_only_the_start_of_a_long_line(tmp_path):
    done = explain_measured(tmp_path, "00 01 " + "not-hex" * 1_500_000 + "\n")
    assert done.returncode == 2
    assert done.stderr == ("kafkasniff: cannot read the hex dump: line 1: 'not-hexnot-hexnot-hexnot-hexnot-hexnot-h'"
                           "… (10,500,000 characters) is not hex\n")
    assert done.seconds < 5 and done.peak_mb < 100


def test_a_dump_of_more_text_than_one_message_needs_is_refused_as_it_is_read(tmp_path):
    done = explain_measured(tmp_path, "00 " * (6 * MiB))
    assert done.returncode == 2
    assert done.stderr == ("kafkasniff: cannot read the hex dump: more than 16 MiB of text; a dump holds one message: "
                           "keep its lines only\n")
    assert done.seconds < 5 and done.peak_mb < 100


def hexdump_c(data: bytes) -> str:
    """`hexdump -C` of the bytes: a line the same as the one before is a '*' line, as hexdump writes it."""
    lines, before = [], None
    for at in range(0, len(data), 16):
        row = data[at:at + 16]
        if row == before:
            if lines[-1] != "*":
                lines.append("*")
            continue
        before = row
        cells = " ".join(f"{b:02x}" for b in row[:8]) + "  " + " ".join(f"{b:02x}" for b in row[8:])
        lines.append(f"{at:08x}  {cells:<48}  |{''.join(chr(b) if 32 <= b < 127 else '.' for b in row)}|")
    return "\n".join([*lines, f"{len(data):08x}"]) + "\n"


def token_expiry(hmac: bytes) -> bytes:
    """An ExpireDelegationToken v1 request, whose body is one bytes field (and an int64)."""
    return encode_request(40, 1, 1, "c", {"Hmac": hmac, "ExpiryTimePeriodMs": 0})


DUMP_BYTES = 16 * MiB - 64  # near the most a dump may hold, most of it in '*' runs: a dump of a few KB

DUMPS = {  # the text of a hexdump -C, and the first line explain prints
    "a value of zeros": (lambda: hexdump_c(token_expiry(bytes(DUMP_BYTES - 33))),
                         "ExpireDelegationToken v1 request · header v1 · correlation id 1 · client id 'c' · 16777142 "
                         "bytes + 4-byte size prefix"),
    "arrays of arrays": (lambda: hexdump_c(metadata_v0_of_replica_arrays(DUMP_BYTES // 16_018)),
                         "Metadata v0 response · header v0 · correlation id 1 · 16770867 bytes + 4-byte size prefix"),
}


@pytest.mark.parametrize("view", [[], ["--json"], ["--full"]], ids=["table", "json", "full"])
@pytest.mark.parametrize("case", DUMPS)
def test_explain_writes_its_output_as_it_makes_it(tmp_path, case, view):
    """Once, a value of 16 MiB of zeros: 700 MB in --json (a document of 207 MB, held whole as objects and as a
    string); arrays of arrays: more than 10 minutes in the table (a rich Table of every row), and --json past 5 GB
    after 2 minutes (a Field of every item, then the document)."""
    make, headline = DUMPS[case]
    text = make()
    assert len(text) < 200_000
    done = explain_measured(tmp_path, text, *view)
    assert done.returncode == 0, done.stderr
    first = done.head.split(b"\n", 1)[0].decode()
    assert first == ("{" if view == ["--json"] else headline)
    assert done.peak_mb < 100 and done.seconds < 20, f"{case} {view}: {done.peak_mb:.0f} MB, {done.seconds:.1f} s"


LONG_TEXT = "it's \"quoted\", é and \U0001f600 too; " * 6000  # 192,000 bytes of UTF-8: several pieces
NOT_UTF8 = bytes(range(256)) * 1000
HMAC_AT = 4 + 10 + 1  # ExpireDelegationToken's Hmac, after the frame's size and the request header (client id 'c')
NAME_AT = 4 + 11 + 1  # ApiVersions v3's ClientSoftwareName, after the size and the flexible request header


def software_name(name: str) -> bytes:
    """An ApiVersions v3 request, whose first field is a compact string."""
    return encode_request(18, 3, 1, "c", {"ClientSoftwareName": name, "ClientSoftwareVersion": "1"})


LONG_VALUES = {  # (the frame, its long field: path, offset, length; what the table and the rows show, and its JSON)
    "bytes of text with both quotes": (token_expiry(LONG_TEXT.encode()), "body.Hmac", HMAC_AT, 4 + 192_000,
                                       repr(LONG_TEXT), LONG_TEXT),
    "bytes of text with single quotes": (token_expiry(LONG_TEXT.replace('"', "-").encode()), "body.Hmac", HMAC_AT,
                                         4 + 192_000, repr(LONG_TEXT.replace('"', "-")), LONG_TEXT.replace('"', "-")),
    "bytes of UTF-8, not printable": (token_expiry(bytes(100_000)), "body.Hmac", HMAC_AT, 4 + 100_000,
                                      "0x" + bytes(100_000).hex(" "), "\x00" * 100_000),
    "bytes not UTF-8": (token_expiry(NOT_UTF8), "body.Hmac", HMAC_AT, 4 + len(NOT_UTF8), "0x" + NOT_UTF8.hex(" "),
                        None),
    "a string": (software_name(LONG_TEXT), "body.ClientSoftwareName", NAME_AT, 3 + 192_000, repr(LONG_TEXT),
                 LONG_TEXT),
}


@pytest.mark.parametrize("case", LONG_VALUES)
def test_explain_makes_long_values_in_pieces_that_join_into_the_whole(case):
    """Long values are made and written in pieces (render/values.py): joined, they are what the value shown whole
    is, and the document is what json.dumps makes."""
    frame, path, at, length, shown, text = LONG_VALUES[case]
    output = CliRunner().invoke(main, ["explain", "--json", frame.hex()]).stdout
    document = json.loads(output)
    assert output == json.dumps(document, indent=1) + "\n"
    (row,) = [r for r in document["rows"] if r["field"] == path]
    assert row == {"offset": at, "length": length, "hex": frame[at:at + length].hex(), "field": path,
                   "type": "string" if case == "a string" else "bytes", "value": shown}
    (field,) = [f for f in document["fields"][1]["children"] if f["name"] == path.split(".")[1]]
    if case == "a string":
        assert field["value"] == text
    else:
        assert base64.b64decode(field["value"]["base64"]) == frame[at + 4:at + length]
        assert field["value"].get("text") == text
    table = CliRunner().invoke(main, ["explain", "--full", frame.hex()]).stdout
    (line,) = [line for line in table.splitlines() if f" {path} " in line]
    assert re.fullmatch(rf"{at}-{at + length - 1} +{frame[at:at + 8].hex(' ')} … +{re.escape(path)} +(string|bytes) +"
                        rf"{re.escape(shown)}", line)


# --- a response whose request was not captured (item 2) -------------------------------------------------------

def unmatched_response_capture(path, items: int):
    """An ApiVersions request (correlation id 8), and a response to an earlier request that was not captured
    (7): a throttle time, then an array of `items` all-zero 4-byte structs, which DeleteTopics v1 reads as
    results named '' with no error, and which leads the other schemas with arrays far into the frame."""
    payload = struct.pack(">iii", 7, 0, items) + bytes(4 * items)
    return conversation_capture(path, (True, encode_request(18, 0, 8, "c", {})),
                                (False, struct.pack(">i", len(payload)) + payload))


def test_a_small_unmatched_response_is_inferred_from_every_schema(tmp_path):
    done = decode_measured(unmatched_response_capture(tmp_path / "small.pcap", 1000), ["--json"])
    response = json.loads(done.head.split(b"\n")[1])
    assert (response["api_name"], response["api_version"], response["correlation_id"], response["size"],
            response["malformed"]) == ("DeleteTopics", 1, 7, 4012, None)
    assert len(response["body"]["responses"]) == 1000


def test_a_response_read_before_its_steps_ran_out_says_how_many_schemas_were_not_tried(tmp_path):
    """80 KB of that response: DeleteTopics v1 (and v2, v3) fit before the frame's steps are spent, 174 schemas are
    never screened. The reading is shown, and so is the doubt: the line says how many schemas were not tried, and
    --json counts them (`schemas_not_tried`) beside the readings that fit (`alternatives`)."""
    path = unmatched_response_capture(tmp_path / "middling.pcap", 20_000)
    line = CliRunner().invoke(main, ["decode", str(path)], catch_exceptions=False).stdout.splitlines()[1]
    assert line.endswith(" DeleteTopics v1 response corr=7 80012B "
                         "(request not captured: inferred; also fits DeleteTopics v2-v3; 174 schemas not tried)")
    result = CliRunner().invoke(main, ["decode", "--json", str(path)], catch_exceptions=False)
    response = json.loads(result.stdout.splitlines()[1])
    assert (response["api_name"], response["api_version"], response["inferred"], response["malformed"],
            len(response["body"]["responses"])) == ("DeleteTopics", 1, True, None, 20_000)
    assert (response["alternatives"], response["schemas_not_tried"]) == (
        [{"api_name": "DeleteTopics", "api_version": 2}, {"api_name": "DeleteTopics", "api_version": 3}], 174)


@pytest.mark.parametrize("view", VIEWS)
def test_a_large_unmatched_response_costs_work_bounded_by_its_size(tmp_path, view):
    """Once 96 s and 542 MB: a 3.1 MB response tried against every response schema in full."""
    done = decode_measured(unmatched_response_capture(tmp_path / "large.pcap", 775_000), VIEWS[view])
    assert done.returncode == 0, done.stderr
    assert done.seconds < 10 and done.peak_mb < 100, f"{view}: {done.seconds:.1f} s, {done.peak_mb:.0f} MB"
    if view == "json":
        request, response = (json.loads(line) for line in done.head.splitlines()[:2])
        assert (request["api_name"], response["correlation_id"], response["size"], response["api_key"]) == (
            "ApiVersions", 7, 3_100_012, None)
        assert response["malformed"] == {"offset": 4, "reason": (
            "request not captured, and none of the 55 response schemas tried fits these bytes (313 not tried: "
            "the work per frame is bounded by its size)")}


# --- long arrays of small items (item 1) -----------------------------------------------------------------------

ITEMS = 2_000_000
SHOWN = 10_000  # items of an array -V and --hex show unless --full


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def metadata_v9_of_unnamed_topics(count: int) -> bytes:
    """A Metadata v9 request (header v2: correlation id 1, client id 'c') naming `count` topics '' (2 bytes each:
    the name's length and no tagged fields), then the three booleans of the version and no tagged fields."""
    payload = (struct.pack(">hhih", 3, 9, 1, 1) + b"c\x00" + uvarint(count + 1) + b"\x01\x00" * count
               + b"\x00\x00\x00\x00")
    return struct.pack(">i", len(payload)) + payload


def delete_groups_v2_of_errors(count: int) -> list[tuple[bool, bytes]]:
    """A DeleteGroups v2 request, and its response of `count` results: group '', error codes 1-100 in turn, no
    tagged fields (4 bytes each)."""
    request = encode_request(42, 2, 1, "c", {"GroupsNames": ["g"]})
    results = b"".join(b"\x01" + struct.pack(">h", 1 + i % 100) + b"\x00" for i in range(count))
    payload = struct.pack(">i", 1) + b"\x00" + struct.pack(">i", 0) + uvarint(count + 1) + results + b"\x00"
    return [(True, request), (False, struct.pack(">i", len(payload)) + payload)]


def metadata_v0_of_replica_arrays(partitions: int) -> bytes:
    """A Metadata v0 response (correlation id 1, no brokers) of one topic 't' whose partitions each list 4,000
    replica ids (0) and no in-sync ones: 16,018 bytes a partition, every array under 10,000 items."""
    partition = struct.pack(">hiii", 0, 0, 0, 4000) + bytes(4 * 4000) + struct.pack(">i", 0)
    payload = struct.pack(">iiihh", 1, 0, 1, 0, 1) + b"t" + struct.pack(">i", partitions) + partition * partitions
    return struct.pack(">i", len(payload)) + payload


LONG_ARRAYS = {  # (the frames, bytes per item, the array's path in the last frame)
    "int8 items": (lambda: [(True, encode_request(78, 1, 1, "c", {
        "GroupId": "g", "MemberId": "m", "Topics": [{"TopicId": "00000000-0000-0000-0000-000000000001", "Partitions": [
            {"PartitionIndex": 0, "AcknowledgementBatches": [
                {"FirstOffset": 0, "LastOffset": 1, "AcknowledgeTypes": [1] * ITEMS}]}]}]}))], 1,
        "body.Topics[0].Partitions[0].AcknowledgementBatches[0].AcknowledgeTypes"),
    "topic structs": (lambda: [(True, metadata_v9_of_unnamed_topics(ITEMS))], 2, "body.Topics"),
    "error results": (lambda: delete_groups_v2_of_errors(ITEMS), 4, "body.Results"),
}


@pytest.fixture(scope="module")
def long_arrays(tmp_path_factory):
    folder = tmp_path_factory.mktemp("arrays")
    return {name: conversation_capture(folder / f"array{i}.pcap", *make())
            for i, (name, (make, _, _)) in enumerate(LONG_ARRAYS.items())}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("case", LONG_ARRAYS)
def test_long_arrays_cost_memory_for_what_a_view_shows(long_arrays, case, view):
    """Once about 195 bytes of memory per wire byte: -V and --hex made an object for every item, for topics and
    errors every view kept a mention or a code each, and --json held the whole body as one string. A 10 MB frame
    needed 1.95 GB in -V, 5.4 GB in --hex."""
    done = decode_measured(long_arrays[case], VIEWS[view])
    assert done.returncode == 0, done.stderr
    assert done.peak_mb < 100 and done.seconds < 20, f"{case}, {view}: {done.peak_mb:.0f} MB, {done.seconds:.1f} s"


@pytest.mark.parametrize("jobs", ["2", "3"])
@pytest.mark.parametrize("view", ["line", "json"])
@pytest.mark.parametrize("case", LONG_ARRAYS)
def test_long_arrays_cost_the_workers_memory_for_what_they_pass_on(long_arrays, case, view, jobs):
    """The whole process tree, workers and parent: once 216 MB for the error results' 10 MB frame with --json -j 2,
    its 60 MB JSON line rendered in a worker, pickled, sent and written by the parent."""
    done = decode_measured(long_arrays[case], [*VIEWS[view], "-j", jobs])
    assert done.returncode == 0, done.stderr
    assert done.tree_mb < 100 and done.seconds < 20, f"{case}, {view}, -j {jobs}: {done.tree_mb:.0f} MB"
    alone = decode_measured(long_arrays[case], [*VIEWS[view], "-j", "1"])
    assert (done.size, done.head) == (alone.size, alone.head)


@pytest.fixture(scope="module")
def tiny_requests(tmp_path_factory):
    """One connection of 700,000 ApiVersions v0 requests of 14 bytes (9.8 MB), never answered."""
    requests = b"".join(struct.pack(">ihhih", 10, 18, 0, i, -1) for i in range(700_000))
    conversation = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), mss=60_000)
    return write_pcap(tmp_path_factory.mktemp("tiny") / "tiny.pcap", conversation.send(True, requests).close())


@pytest.mark.parametrize("view", ["line", "json"])
def test_many_small_messages_cost_the_workers_memory_bounded_by_their_replies(tiny_requests, view):
    """A batch of 4 MiB of stream bytes makes 300,000 lines here (90 MB of JSON): once a worker rendered all of
    them before replying, and the parent held them: 573 MB with --json -j 2, 373 MB in the one-line view."""
    done = decode_measured(tiny_requests, [*VIEWS[view], "-j", "2"])
    assert done.returncode == 0, done.stderr
    assert done.tree_mb < 100 and done.seconds < 60, f"{view}: {done.tree_mb:.0f} MB, {done.seconds:.1f} s"
    first = done.head.split(b"\n", 1)[0]
    if view == "json":
        assert {k: json.loads(first)[k] for k in ("kind", "api_name", "correlation_id")} == {
            "kind": "request", "api_name": "ApiVersions", "correlation_id": 0}
    else:
        assert first.decode().endswith("10.0.0.2:9092 ApiVersions v0 request corr=0 client=null 10B")


def decoded_text(capture, *options: str) -> str:
    return subprocess.run([sys.executable, "-m", "kafkasniff", "decode", *options, str(capture)], capture_output=True,
                          check=True, text=True, timeout=120).stdout


@pytest.mark.parametrize("case", LONG_ARRAYS)
def test_past_ten_thousand_items_a_line_counts_the_rest_and_full_shows_them(long_arrays, case):
    _, size, path = LONG_ARRAYS[case]
    more, more_bytes = ITEMS - SHOWN, size * (ITEMS - SHOWN)
    tree = decoded_text(long_arrays[case], "-V")
    assert tree.count(f"── … {more} more items in {more_bytes} bytes, past the {SHOWN} this view shows "
                      f"(--full shows them all)\n") == 1
    assert f"[{SHOWN - 1}]" in tree and f"[{SHOWN}]" not in tree
    assert f" {ITEMS} items " in tree  # the array's own line still says how many there are
    hex_rows = decoded_text(long_arrays[case], "--hex").splitlines()
    (row,) = [r for r in hex_rows if f"{path}.items_not_shown" in r]
    assert row.endswith(f"ItemsNotShown           {more} ({more} more items in {more_bytes} bytes, past the {SHOWN} "
                        f"this view makes; --json shows them all)")
    *_, message = [e for e in map(json.loads, decoded_text(long_arrays[case], "--json").splitlines())
                   if e["kind"] != "notice"]  # (a request alone on its connection is followed by an unanswered one)
    array = message["body"]
    for step in path.split(".")[1:]:
        name, _, index = step.partition("[")
        array = array["_".join(w.lower() for w in re.findall("[A-Z][a-z0-9]*", name))]
        if index:
            array = array[int(index[:-1])]
    assert len(array) == ITEMS
    if case == "error results":  # each error once, in wire order
        assert message["errors"][:3] == ["OFFSET_OUT_OF_RANGE", "CORRUPT_MESSAGE", "UNKNOWN_TOPIC_OR_PARTITION"]
        assert len(message["errors"]) == 100
    if case == "int8 items":
        assert decoded_text(long_arrays[case], "-V", "--full").count(": 1  int8\n") == ITEMS


@pytest.fixture(scope="module")
def replica_arrays(tmp_path_factory):
    """A Metadata v0 request, and a 6.9 MB response of 430 partitions of 4,000 replica ids each."""
    return conversation_capture(tmp_path_factory.mktemp("nested") / "nested.pcap",
                                (True, encode_request(3, 0, 1, "c", {"Topics": []})),
                                (False, metadata_v0_of_replica_arrays(430)))


@pytest.mark.parametrize("view", VIEWS)
def test_arrays_of_arrays_cost_memory_for_what_a_view_shows(replica_arrays, view):
    """Every array under the 10,000 items a view makes of each, 1.7 million items in all: once (8 MB of them)
    200 MB in -V, 1.1 GB and 48 s in --hex."""
    done = decode_measured(replica_arrays, VIEWS[view])
    assert done.returncode == 0, done.stderr
    assert done.peak_mb < 100 and done.seconds < 20, f"{view}: {done.peak_mb:.0f} MB, {done.seconds:.1f} s"


def test_past_a_hundred_thousand_fields_a_line_counts_the_rest_of_every_array(replica_arrays):
    tree = decoded_text(replica_arrays, "-V")
    assert re.findall(r"── (… .*)\n", tree) == [
        "… 156 more items in 624 bytes, past the 100000 fields this view shows of a message (--full shows them all)",
        "… 405 more items in 6487290 bytes, past the 100000 fields this view shows of a message (--full shows them "
        "all)"]
    assert re.findall(r"\n {16}[├└]── (\[\d+\])\n", tree) == [f"[{i}]" for i in range(25)]  # partitions made
    hex_rows = [row for row in decoded_text(replica_arrays, "--hex").splitlines() if "items_not_shown" in row]
    assert [re.split(" {2,}", row)[2:] for row in hex_rows] == [
        ["body.Topics[0].Partitions[24].ReplicaNodes.items_not_shown", "ItemsNotShown",
         "156 (156 more items in 624 bytes, past the 100000 fields this view makes of a message; --json shows them "
         "all)"],
        ["body.Topics[0].Partitions.items_not_shown", "ItemsNotShown",
         "405 (405 more items in 6487290 bytes, past the 100000 fields this view makes of a message; --json shows "
         "them all)"]]


@pytest.fixture(scope="module")
def many_tags(tmp_path_factory):
    """An UpdateMetadata v8 request whose body's tagged section holds 200,000 unknown tags (99, empty), each
    followed by tag 0 (Type, an int8) again: 1 MB of 400,000 tagged fields."""
    base = encode_request(6, 8, 1, "c", {})
    assert base[-1] == 0  # the body's empty tagged section, replaced
    pairs = 200_000
    frame = base[4:-1] + uvarint(2 * pairs) + (b"\x63\x00" + b"\x00\x01\x01") * pairs
    return conversation_capture(tmp_path_factory.mktemp("tags") / "tags.pcap",
                                (True, struct.pack(">i", len(frame)) + frame))


@pytest.mark.parametrize("view", VIEWS)
def test_a_tagged_section_of_many_tags_costs_memory_for_what_a_view_shows(many_tags, view):
    """Once 1.3 GB and 30 s in --hex: a Field (and rows) for each of 400,000 tags."""
    done = decode_measured(many_tags, VIEWS[view])
    assert done.returncode == 0, done.stderr
    assert done.peak_mb < 100 and done.seconds < 20, f"{view}: {done.peak_mb:.0f} MB, {done.seconds:.1f} s"
    if view == "hex":
        rows = decoded_text(many_tags, "--hex").splitlines()
        assert sum(" body._tagged_fields.Type " in row for row in rows) == 5000  # in the first 10,000 tags
        assert rows[-2].endswith("body._tagged_fields.items_not_shown  ItemsNotShown               390000 (390000 "
                                 "more items in 974998 bytes, past the 10000 this view makes; --json shows them all)")
        assert rows[-1].endswith(" ! 1 request without a response when the connection ended: UpdateMetadata v8 corr=1")
