"""`kafkasniff explain` on the worked examples of ../shared/seeds, byte for byte."""

import json

from click.testing import CliRunner

from kafkasniff.cli import main

# The seed examples, as they appear in the seed documents.
SEED_001_PRODUCE_V0 = """
0x00 0x00 0x00 0x4E 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x01
0x00 0x03 0x66 0x6F 0x6F 0x00 0x01 0x00 0x00 0x05 0xDC 0x00
0x00 0x00 0x01 0x00 0x04 0x74 0x65 0x73 0x74 0x00 0x00 0x00
0x01 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x25 0x00 0x00 0x00
0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x19 0x73 0xAC 0xF7
0x7C 0x00 0x00 0xFF 0xFF 0xFF 0xFF 0x00 0x00 0x00 0x0B 0x68
0x65 0x6C 0x6C 0x6F 0x20 0x77 0x6F 0x72 0x6C 0x64
"""
SEED_002_METADATA_V0_REQUEST = """
00 00 00 12        // Size: 18 bytes
00 03              // api_key: 3 (Metadata)
00 00              // api_version: 0
00 00 00 01        // correlation_id: 1
00 04              // client_id length: 4
74 65 73 74        // client_id: "test"
FF FF FF FF        // topics: null (all topics)
"""
SEED_002_METADATA_V0_RESPONSE = """
00 00 00 0C        // Size: 12 bytes
00 00 00 01        // correlation_id: 1
00 00 00 00        // brokers: empty array
00 00 00 00        // topics: empty array
"""
# Seed 004 gives the ApiVersions v3 request layout by offsets: size @0, key 18 @4, version 3 @6,
# correlation id 7 @8, client id "c1" (int16 length) @12, header tags @16, software name @17..34,
# software version (compact string) @35, body tags last. The version string is "some version";
# we use "3.9.0".
SEED_004_APIVERSIONS_V3 = (
    "00000026" "0012" "0003" "00000007" "0002" "6331" "00"
    "12" + "apache-kafka-java".encode().hex() + "06" + "3.9.0".encode().hex() + "00")


def explain(*args: str) -> dict:
    result = CliRunner().invoke(main, ["explain", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def field_rows(out: dict) -> dict:
    return {r["field"]: r for r in out["rows"]}


def assert_every_byte_once(out: dict, total: int):
    assert out["unexplained"] == []
    covered = sorted((r["offset"], r["offset"] + r["length"]) for r in out["rows"])
    assert covered[0][0] == 0 and covered[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:])), "rows overlap or leave holes"


def test_seed_001_produce_v0_request():
    out = explain(SEED_001_PRODUCE_V0)
    assert (out["kind"], out["api_name"], out["api_version"], out["header_version"]) == ("request", "Produce", 0, 1)
    assert out["size_prefix"] and out["size"] == 78
    assert out["client_id"] == "foo" and out["correlation_id"] == 1
    assert out["malformed"] is None and out["trailing_bytes"] == 0
    assert_every_byte_once(out, 82)
    rows = field_rows(out)
    assert rows["body.Acks"]["value"] == "1" and rows["body.Acks"]["offset"] == 17
    assert rows["body.TimeoutMs"]["value"] == "1500"
    assert rows["body.TopicData[0].Name"]["value"] == "'test'"
    assert rows["body.TopicData[0].PartitionData[0].Index"]["value"] == "0"
    records = [r for r in out["rows"] if r["field"].startswith("body.TopicData[0].PartitionData[0].Records")]
    # Message set size 37 at offset 41, then one magic-0 message.
    assert records[0]["offset"] == 41 and records[0]["hex"] == "00000025"
    by_name = {r["field"].rsplit(".", 1)[-1]: r for r in records}
    assert by_name["crc"]["hex"] == "73acf77c" and "valid" in by_name["crc"]["value"]
    assert "INVALID" not in by_name["crc"]["value"]
    assert by_name["key"]["value"] == "null"
    assert by_name["value"]["value"] == "'hello world'"
    assert by_name["magic"]["value"] == "0"


def test_seed_002_metadata_v0_request():
    out = explain(SEED_002_METADATA_V0_REQUEST)
    assert (out["api_name"], out["api_version"], out["client_id"], out["size"]) == ("Metadata", 0, "test", 18)
    assert_every_byte_once(out, 22)
    topics = field_rows(out)["body.Topics"]
    assert (topics["offset"], topics["length"], topics["hex"]) == (18, 4, "ffffffff")
    # v0 has no nullable topics in Kafka's schema; the wire says null, so we show null and flag it.
    assert topics["value"].startswith("null")
    assert out["malformed"] is None


def test_seed_002_metadata_v0_response_with_api_given():
    out = explain("--api-key", "3", "--api-version", "0", SEED_002_METADATA_V0_RESPONSE)
    assert (out["kind"], out["api_name"], out["api_version"], out["correlation_id"]) == ("response", "Metadata", 0, 1)
    assert out["assumed"] is None
    assert_every_byte_once(out, 16)
    rows = field_rows(out)
    assert rows["body.Brokers"]["offset"] == 8 and rows["body.Brokers"]["value"] == "length: 0 items"
    assert rows["body.Topics"]["offset"] == 12 and rows["body.Topics"]["value"] == "length: 0 items"


def test_seed_002_metadata_v0_response_inferred():
    out = explain(SEED_002_METADATA_V0_RESPONSE)
    assert out["kind"] == "response" and out["assumed"]
    names = {(out["api_name"], out["api_version"])} | {(a["api_name"], a["api_version"]) for a in out["alternatives"]}
    assert ("Metadata", 0) in names
    assert_every_byte_once(out, 16)


def test_seed_004_apiversions_v3_request():
    out = explain(SEED_004_APIVERSIONS_V3)
    assert (out["api_name"], out["api_version"], out["header_version"]) == ("ApiVersions", 3, 2)
    assert (out["correlation_id"], out["client_id"]) == (7, "c1")
    assert_every_byte_once(out, 4 + 0x26)
    rows = field_rows(out)
    # ClientId keeps its int16 length even in the flexible header v2.
    assert (rows["header.ClientId"]["offset"], rows["header.ClientId"]["hex"]) == (12, "00026331")
    assert rows["header._tagged_fields"]["offset"] == 16
    name = rows["body.ClientSoftwareName"]
    assert (name["offset"], name["length"], name["value"]) == (17, 18, "'apache-kafka-java'")
    assert rows["body.ClientSoftwareVersion"]["offset"] == 35


def test_explain_reads_stdin_and_reports_bad_hex():
    runner = CliRunner()
    ok = runner.invoke(main, ["explain"], input=SEED_002_METADATA_V0_REQUEST)
    assert ok.exit_code == 0 and "Metadata v0 request" in ok.output
    bad = runner.invoke(main, ["explain", "00 0g"])
    assert bad.exit_code == 2 and "cannot read the hex dump" in bad.output


def test_truncated_frame_is_malformed_with_offset():
    # Drop the last 4 bytes and fix the size prefix: the message set (37 bytes at 41) now runs short.
    cut = SEED_001_PRODUCE_V0.replace("0x6F 0x72 0x6C 0x64", "").replace("0x00 0x00 0x00 0x4E", "0x00 0x00 0x00 0x4A", 1)
    out = explain(cut)
    assert (out["api_name"], out["size"]) == ("Produce", 74)
    assert out["malformed"] == {"offset": 41, "reason": "bytes length 37 exceeds the 33 bytes left"}
    assert field_rows(out)["body.Acks"]["value"] == "1"  # fields before the problem are kept
    assert_every_byte_once(out, 78)
