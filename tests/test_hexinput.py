import shutil
import subprocess

import dpkt
import pytest

from kafkasniff.render.hexinput import parse_hex_blocks, parse_hex_dump

# ASCII columns full of hex-looking text, bar and comment characters, double spaces, a run of zeros that
# hexdump/od/xxd -a fold into '*', and a length that leaves a partial last line at every width used below.
TRICKY = (b"deadbeefcafe" * 7 + b"|dead|beef  cafe #// 0x12: 00 " + bytes(range(256))
          + bytes(64) + b"abc")

METADATA_V0_REQUEST = bytes.fromhex("00000012 0003 0000 00000001 0004") + b"test" + b"\xff" * 4


def run_tool(args, data):
    if shutil.which(args[0]) is None:
        pytest.skip(f"{args[0]} is not installed")
    return subprocess.run(args, input=data, capture_output=True, check=True).stdout.decode()


@pytest.mark.parametrize("args", [
    ["xxd"],
    ["xxd", "-g1"],
    ["xxd", "-g0"],
    ["xxd", "-u", "-c", "20"],
    ["xxd", "-a"],
    ["xxd", "-p"],
    ["hexdump", "-C"],
    ["hexdump", "-C", "-v"],
    ["od", "-An", "-tx1", "-v"],
    ["od", "-An", "-tx1", "-v", "-w20"],
])
def test_real_tool_dump_round_trips(args):
    dump = run_tool(args, TRICKY)
    assert parse_hex_dump(dump) == TRICKY


def test_hexdump_c_folds_zeros_and_we_unfold_them():
    dump = run_tool(["hexdump", "-C"], TRICKY)
    assert "\n*\n" in dump
    assert parse_hex_dump(dump) == TRICKY


def test_xxd_dump_starting_mid_file_keeps_its_offsets():
    dump = run_tool(["xxd", "-s", "5", "-l", "40"], TRICKY)
    assert dump.startswith("00000005: ")
    assert parse_hex_dump(dump) == TRICKY[5:45]


def _pcap(tmp_path, payloads):
    frames = []
    for seq, payload in enumerate(payloads):
        tcp = dpkt.tcp.TCP(sport=40000, dport=9092, seq=1000 + seq, flags=dpkt.tcp.TH_PUSH | dpkt.tcp.TH_ACK,
                           data=payload)
        ip = dpkt.ip.IP(src=bytes([127, 0, 0, 1]), dst=bytes([127, 0, 0, 1]), p=dpkt.ip.IP_PROTO_TCP, data=tcp)
        frames.append(bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, data=ip)))
    path = tmp_path / "small.pcap"
    with path.open("wb") as f:
        writer = dpkt.pcap.Writer(f)
        for number, frame in enumerate(frames):
            writer.writepkt(frame, ts=1_700_000_000 + number)
    return path, frames


@pytest.mark.parametrize("flag, link_header", [("-X", False), ("-XX", True), ("-x", False)])
def test_tcpdump_hex_output_round_trips_and_skips_summary_lines(tmp_path, flag, link_header):
    path, frames = _pcap(tmp_path, [METADATA_V0_REQUEST, TRICKY[:90], TRICKY[90:]])
    dump = run_tool(["tcpdump", "-n", "-vv", flag, "-r", str(path)], b"")
    assert dump.count("9092") >= 3
    expected = b"".join(frame if link_header else frame[14:] for frame in frames)
    assert parse_hex_dump(dump) == expected


def test_tshark_hex_output_round_trips_a_block_per_packet(tmp_path):
    path, frames = _pcap(tmp_path, [METADATA_V0_REQUEST, TRICKY[:90], TRICKY[90:]])
    dump = run_tool(["tshark", "-r", str(path), "-x"], b"")
    assert [block.data for block in parse_hex_blocks(dump)] == frames
    assert parse_hex_dump(dump) == b"".join(frames)


def test_plain_hex_with_a_double_space_is_not_taken_for_tshark_offsets():
    assert parse_hex_dump("0000  00 12\n") == bytes.fromhex("00000012")


def test_single_tcpdump_packet_gives_ip_header_then_kafka_bytes(tmp_path):
    path, frames = _pcap(tmp_path, [METADATA_V0_REQUEST])
    dump = run_tool(["tcpdump", "-n", "-X", "-r", str(path)], b"")
    data = parse_hex_dump(dump)
    assert len(data) == 20 + 20 + 22
    assert data[40:] == METADATA_V0_REQUEST


@pytest.mark.parametrize("text", [
    "00 00 00 12",
    "00000012",
    "0000 0012",
    "00\n00\r\n00\t12\n",
    "0x00 0x00 0x00 0x12",
    "0x00, 0x00, 0x00, 0x12,",
    "0X00,0x00,0x00,0x12",
    "# size\n00 00   // high half\n00 12  # low half\n",
])
def test_plain_hex_spellings(text):
    assert parse_hex_dump(text) == b"\x00\x00\x00\x12"


def test_ascii_columns_that_look_like_hex_are_ignored():
    xxd = "00000000: 6465 6164 6265 6566  deadbeef\n"
    hexdump_c = "00000000  de ad be ef ca fe  |deadbeefcafe|\n00000006\n"
    tcpdump = "12:00:00.000000 IP 1.2.3.4.1 > 5.6.7.8.9092: tcp 2\n\t0x0000:  cafe  ..cafe..\n"
    assert parse_hex_dump(xxd) == b"deadbeef"
    assert parse_hex_dump(hexdump_c) == bytes.fromhex("deadbeefcafe")
    assert parse_hex_dump(tcpdump) == b"\xca\xfe"


def test_lone_eight_digit_line_is_plain_hex_outside_hexdump_c():
    assert parse_hex_dump("00000012\n") == b"\x00\x00\x00\x12"


def test_seed_001_produce_request_hex_block():
    block = """\
0x00 0x00 0x00 0x4E 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x01
0x00 0x03 0x66 0x6F 0x6F 0x00 0x01 0x00 0x00 0x05 0xDC 0x00
0x00 0x00 0x01 0x00 0x04 0x74 0x65 0x73 0x74 0x00 0x00 0x00
0x01 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x25 0x00 0x00 0x00
0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x00 0x19 0x73 0xAC 0xF7
0x7C 0x00 0x00 0xFF 0xFF 0xFF 0xFF 0x00 0x00 0x00 0x0B 0x68
0x65 0x6C 0x6C 0x6F 0x20 0x77 0x6F 0x72 0x6C 0x64
"""
    data = parse_hex_dump(block)
    assert len(data) == 82
    assert int.from_bytes(data[:4], "big") == 0x4E == len(data) - 4
    assert data[12:17] == b"\x00\x03foo"
    assert data[-11:] == b"hello world"


def test_seed_002_annotated_metadata_blocks():
    request = """\
00 00 00 12        // Size: 18 bytes
00 03              // api_key: 3 (Metadata)
00 00              // api_version: 0
00 00 00 01        // correlation_id: 1
00 04              // client_id length: 4
74 65 73 74        // client_id: "test"
FF FF FF FF        // topics: null (all topics)
"""
    response = """\
00 00 00 0C        // Size: 12 bytes
00 00 00 01        // correlation_id: 1
00 00 00 00        // brokers: empty array
00 00 00 00        // topics: empty array
"""
    assert parse_hex_dump(request) == METADATA_V0_REQUEST
    assert parse_hex_dump(response) == bytes.fromhex("0000000c 00000001 00000000 00000000")


@pytest.mark.parametrize("text, message", [
    ("00 00 00 XX        // Size", "line 1: 'XX' is not hex"),
    ("00 01\n\n0x1 02", "line 3: '0x1' has an odd number of hex digits"),
    ("00 01\n...                // request body", "line 2: '...' is not hex"),
    ("000", "line 1: '000' has an odd number of hex digits"),
    ("00000000: 0001 02zz  ....", "line 1: '02zz' is not hex"),
    ("00 00\n*\n00 00", "line 2: '*' (repeated lines) needs offsets around it; dump with -v"),
])
def test_bad_input_names_line_and_text(text, message):
    with pytest.raises(ValueError) as error:
        parse_hex_dump(text)
    assert str(error.value) == message


def test_missing_line_in_an_offset_dump_is_reported():
    lines = run_tool(["hexdump", "-C", "-v"], TRICKY).splitlines()
    del lines[2]
    with pytest.raises(ValueError, match=r"^line 3: offset 0x30 does not follow the previous line \(expected 0x20\)$"):
        parse_hex_dump("\n".join(lines))


def test_od_without_v_cannot_unfold_repeats():
    dump = run_tool(["od", "-An", "-tx1"], TRICKY)
    with pytest.raises(ValueError, match=r"'\*' \(repeated lines\) needs offsets"):
        parse_hex_dump(dump)


def test_empty_text_is_no_bytes():
    assert parse_hex_dump("") == b""
    assert parse_hex_dump("  // nothing here\n# nor here\n") == b""


def test_a_byte_table_row_of_masked_secret_bytes_is_a_clear_error():
    table = ("offset  bytes  field  type  value\n0-1     00 03  size   int16  3\n"
             "2-4     •• •• ••  password  bytes  ***\n")
    with pytest.raises(ValueError) as error:
        parse_hex_dump(table)
    assert str(error.value) == ("line 3: the bytes of a secret are masked (••); make the table with decode --hex "
                                "--full --show-secrets")
