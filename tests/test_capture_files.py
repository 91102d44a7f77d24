"""Capture files and link layers: the recorded loopback exchange re-encapsulated and rewritten
into every supported format, and damaged or wrong files.

The reference is what the recorded Ethernet pcap yields; each variant must give the same
TCP segments (same addresses unless the variant changes them, same sequence numbers and
payload bytes), and reassemble to the exact byte streams.
"""

from __future__ import annotations

import gzip
import os
import socket
import struct
from array import array
from pathlib import Path

import dpkt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkasniff.capture import files
from kafkasniff.capture.files import CaptureError, open_capture
from kafkasniff.capture.packets import ACK, SYN, FrameParser
from test_tcp_reassembly import (
    CLIENT_BYTES,
    EXCHANGE_PCAP,
    SERVER_BYTES,
    SERVER_PORT,
    assert_whole_exchange,
    exchange_frames,
    reassemble_file,
    tcp_of,
    write_pcap,
)

ETHERTYPE_IPV4 = b"\x08\x00"


def segments_of(path):
    with open_capture(path) as reader:
        segments = [s._replace(payload=bytes(s.payload)) for s in reader.segments()]
        assert reader.warnings == []
        assert dict(reader.skipped) == {}
    return segments


REFERENCE = segments_of(EXCHANGE_PCAP)


def same_segments(segments, reference=REFERENCE) -> None:
    """Equal to the reference segments, timestamps to the microsecond."""
    assert len(segments) == len(reference)
    for got, want in zip(segments, reference):
        assert got.ts == pytest.approx(want.ts, abs=1e-6)
        assert got._replace(ts=0) == want._replace(ts=0)


def write_records(path, records, linktype=dpkt.pcap.DLT_EN10MB, big_endian=False, nano=False):
    """A pcap from (ts, frame, original length) records, in either byte order."""
    file_header = dpkt.pcap.FileHdr if big_endian else dpkt.pcap.LEFileHdr
    record_header = dpkt.pcap.PktHdr if big_endian else dpkt.pcap.LEPktHdr
    magic = dpkt.pcap.TCPDUMP_MAGIC_NANO if nano else dpkt.pcap.TCPDUMP_MAGIC
    with open(path, "wb") as out:
        out.write(bytes(file_header(magic=magic, snaplen=262144, linktype=linktype)))
        for ts, frame, wire_len in records:
            micros = round(ts * 1e6)
            fraction = micros % 10**6 * 1000 + 123 if nano else micros % 10**6
            out.write(bytes(record_header(tv_sec=micros // 10**6, tv_usec=fraction,
                                          caplen=len(frame), len=wire_len)))
            out.write(frame)
    return path


# ---------------------------------------------------------------- the real capture


def test_loopback_frames_beyond_65535_bytes_are_read_whole():
    with open_capture(EXCHANGE_PCAP) as reader:
        assert (reader.format, reader.compressed) == ("pcap", False)
        frames = list(reader.frames())
        assert reader.position == reader.total_size == os.path.getsize(EXCHANGE_PCAP)
    assert len(frames) == 20
    big = [(len(frame), wire_len) for _ts, _lt, frame, wire_len in frames if wire_len > 65535]
    assert big == [(65549, 65549)]
    assert max(len(s.payload) for s in REFERENCE) == 65483
    assert_whole_exchange(reassemble_file(EXCHANGE_PCAP))


def test_segment_fields_of_the_handshake():
    syn, syn_ack = REFERENCE[0], REFERENCE[1]
    assert (syn.src, syn.dst, syn.dport, syn.flags, syn.payload, syn.missing) == (
        "127.0.0.1", "127.0.0.1", SERVER_PORT, SYN, b"", 0)
    assert (syn_ack.sport, syn_ack.flags, syn_ack.ack) == (SERVER_PORT, SYN | ACK, (syn.seq + 1) % 2**32)
    assert not syn.truncated


# ---------------------------------------------------------------- file formats


def test_big_endian_pcap(tmp_path):
    records = [(ts, frame, len(frame)) for ts, frame in exchange_frames()]
    path = write_records(tmp_path / "big-endian.pcap", records, big_endian=True)
    assert path.read_bytes()[:4] == b"\xa1\xb2\xc3\xd4"
    same_segments(segments_of(path))


def test_nanosecond_pcap_keeps_sub_microsecond_time(tmp_path):
    records = [(ts, frame, len(frame)) for ts, frame in exchange_frames()]
    path = write_records(tmp_path / "nano.pcap", records, nano=True)
    segments = segments_of(path)
    same_segments(segments)
    micros = round(REFERENCE[0].ts * 1e6)
    assert segments[0].ts == micros // 10**6 + (micros % 10**6 * 1000 + 123) / 1e9


def test_gzip_compressed_capture_detected_by_content(tmp_path):
    path = tmp_path / "capture.bin"  # the name says nothing
    path.write_bytes(gzip.compress(EXCHANGE_PCAP.read_bytes()))
    with open_capture(path) as reader:
        assert (reader.format, reader.compressed) == ("pcap", True)
        assert reader.total_size == path.stat().st_size
        segments = [s._replace(payload=bytes(s.payload)) for s in reader.segments()]
        assert reader.position == reader.total_size
    same_segments(segments)


def _pcapng_two_interfaces(path, compress=False):
    """Client frames on an Ethernet interface (microseconds), server frames on a Linux
    cooked v2 interface with nanosecond timestamps."""
    nanoseconds = dpkt.pcapng.PcapngOptionLE(code=dpkt.pcapng.PCAPNG_OPT_IF_TSRESOL, data=b"\x09")
    interfaces = [
        dpkt.pcapng.InterfaceDescriptionBlockLE(linktype=dpkt.pcap.DLT_EN10MB, snaplen=262144),
        dpkt.pcapng.InterfaceDescriptionBlockLE(
            linktype=276, snaplen=262144, opts=[nanoseconds, dpkt.pcapng.PcapngOptionLE()]),
    ]
    with (gzip.open if compress else open)(path, "wb") as out:
        writer = dpkt.pcapng.Writer(out, idb=interfaces)
        for ts, frame in exchange_frames():
            micros = round(ts * 1e6)
            if tcp_of(frame).dport == SERVER_PORT:
                iface, units, data = 0, micros, frame
            else:
                iface, units, data = 1, micros * 1000, sll2_header(frame[12:14]) + frame[14:]
            writer.writepkt(dpkt.pcapng.EnhancedPacketBlockLE(
                iface_id=iface, ts_high=units >> 32, ts_low=units & 0xFFFFFFFF, pkt_data=data))
    return path


def test_pcapng_with_two_interfaces_of_different_link_types(tmp_path):
    path = _pcapng_two_interfaces(tmp_path / "mixed.pcap")  # pcapng named .pcap, as seen in the wild
    with open_capture(path) as reader:
        assert reader.format == "pcapng"
        linktypes = [linktype for _ts, linktype, _frame, _wire in reader.frames()]
    assert sorted(set(linktypes)) == [1, 276]
    same_segments(segments_of(path))
    assert_whole_exchange(reassemble_file(path))


def test_packets_of_a_link_layer_not_read_are_counted_in_a_warning(tmp_path):
    """The recorded exchange with its server's frames on an 802.11 interface (link type 105): the client's
    segments are read, the server's are not, and the reader says how many packets it skipped and why; a file of
    only such frames reads no segment and says so too, where it would otherwise decode to nothing."""
    frames = exchange_frames()
    from_server = sum(tcp_of(frame).sport == SERVER_PORT for _ts, frame in frames)
    interfaces = [dpkt.pcapng.InterfaceDescriptionBlockLE(linktype=dpkt.pcap.DLT_EN10MB, snaplen=262144),
                  dpkt.pcapng.InterfaceDescriptionBlockLE(linktype=105, snaplen=262144)]
    mixed = tmp_path / "mixed.pcapng"
    with open(mixed, "wb") as out:
        writer = dpkt.pcapng.Writer(out, idb=interfaces)
        for ts, frame in frames:
            micros = round(ts * 1e6)
            writer.writepkt(dpkt.pcapng.EnhancedPacketBlockLE(
                iface_id=int(tcp_of(frame).sport == SERVER_PORT), ts_high=micros >> 32, ts_low=micros & 0xFFFFFFFF,
                pkt_data=frame))
    layers = "(Ethernet, Linux cooked v1 and v2, BSD null/loopback, raw IPv4 and IPv6)"
    with open_capture(mixed) as reader:
        segments = list(reader.segments())
        assert [s.dport for s in segments] == [SERVER_PORT] * (len(frames) - from_server)
        assert reader.warnings == [f"{mixed}: {from_server:,} packets skipped: their link type 105 is not a link "
                                   f"layer kafkasniff reads {layers}; capture on an interface of one of those"]
    only_usb = write_records(tmp_path / "usb.pcap", [(ts, frame, len(frame)) for ts, frame in frames], linktype=189)
    with open_capture(only_usb) as reader:
        assert list(reader.segments()) == []
        assert reader.warnings == [f"{only_usb}: {len(frames):,} packets skipped: their link type 189 is not a "
                                   f"link layer kafkasniff reads {layers}; capture on an interface of one of those"]
    with open_capture(EXCHANGE_PCAP) as reader:  # a capture of a layer read: no such word
        list(reader.segments())
        assert reader.warnings == []


def test_gzip_compressed_pcapng(tmp_path):
    same_segments(segments_of(_pcapng_two_interfaces(tmp_path / "mixed.pcapng.gz", compress=True)))


def test_pcapng_sections_in_both_byte_orders(tmp_path):
    """A second section written big-endian, with its own interface table."""
    frames = exchange_frames()
    half = len(frames) // 2
    path = tmp_path / "sections.pcapng"
    with open(path, "wb") as out:
        writer = dpkt.pcapng.Writer(out, linktype=dpkt.pcap.DLT_EN10MB)
        for ts, frame in frames[:half]:
            writer.writepkt(frame, ts)
        out.write(bytes(dpkt.pcapng.SectionHeaderBlock()))
        out.write(bytes(dpkt.pcapng.InterfaceDescriptionBlock(linktype=101, snaplen=262144)))
        for ts, frame in frames[half:]:
            micros = round(ts * 1e6)
            out.write(bytes(dpkt.pcapng.EnhancedPacketBlock(
                iface_id=0, ts_high=micros >> 32, ts_low=micros & 0xFFFFFFFF, pkt_data=frame[14:])))
    with open_capture(path) as reader:
        linktypes = [linktype for _ts, linktype, _frame, _wire in reader.frames()]
    assert linktypes == [1] * half + [101] * (len(frames) - half)
    same_segments(segments_of(path))


# ---------------------------------------------------------------- link layers


def sll_header(ethertype: bytes) -> bytes:
    return struct.pack("!HHH8s", 0, 772, 6, b"\0" * 8) + ethertype  # to-us, loopback hardware


def sll2_header(ethertype: bytes) -> bytes:
    return ethertype + b"\0\0" + struct.pack("!IHBB8s", 1, 772, 0, 6, b"\0" * 8)


def ethernet_with_tags(*tag_types: int):
    def header(ethertype: bytes) -> bytes:
        tags = b"".join(struct.pack("!HH", tag_type, 100 + i) for i, tag_type in enumerate(tag_types))
        return b"\x02" * 6 + b"\x04" * 6 + tags + ethertype
    return header


LINK_LAYERS = {
    "linux cooked v1": (113, sll_header),
    "linux cooked v2": (276, sll2_header),
    "802.1Q VLAN": (1, ethernet_with_tags(0x8100)),
    "QinQ 88a8": (1, ethernet_with_tags(0x88A8, 0x8100)),
    "QinQ 9100": (1, ethernet_with_tags(0x9100, 0x8100)),
    "BSD null, little-endian host": (0, lambda _: struct.pack("<I", 2)),
    "BSD null, big-endian host": (0, lambda _: struct.pack(">I", 2)),
    "OpenBSD loop": (108, lambda _: struct.pack(">I", 2)),
    "raw IP (101)": (101, lambda _: b""),
    "raw IPv4 (228)": (228, lambda _: b""),
    "raw IP (12, BSD DLT_RAW)": (12, lambda _: b""),
    "raw IP (14, OpenBSD DLT_RAW)": (14, lambda _: b""),
}


@pytest.mark.parametrize("name", LINK_LAYERS)
def test_link_layer(tmp_path, name):
    linktype, header = LINK_LAYERS[name]
    frames = [(ts, header(frame[12:14]) + frame[14:]) for ts, frame in exchange_frames()]
    same_segments(segments_of(write_pcap(tmp_path / "link.pcap", frames, linktype=linktype)))


def ipv6_packets(frames, extension_headers: bytes, first_next_header: int, max_payload=60000):
    """The IPv4 packets of the exchange as IPv6 from fd00::1 to fd00::2 (client) and back;
    segments too large for a 16-bit payload length are split in two."""
    for ts, frame in frames:
        ip = dpkt.ethernet.Ethernet(frame).data
        tcp = ip.data
        from_client = tcp.dport == SERVER_PORT
        src, dst = (b"\xfd" + b"\0" * 14 + bytes([1 if from_client else 2]),
                    b"\xfd" + b"\0" * 14 + bytes([2 if from_client else 1]))
        pieces = [tcp.data[i : i + max_payload] for i in range(0, len(tcp.data), max_payload)] or [b""]
        seq = tcp.seq
        for piece in pieces:
            tcp_bytes = bytes(dpkt.tcp.TCP(sport=tcp.sport, dport=tcp.dport, seq=seq, ack=tcp.ack,
                                           flags=tcp.flags, win=tcp.win, sum=0xDEAD, data=piece))
            seq = (seq + len(piece)) % 2**32
            payload = extension_headers + tcp_bytes
            header = struct.pack("!IHBB16s16s", 6 << 28, len(payload), first_next_header, 64, src, dst)
            yield ts, header + payload


EXTENSION_CHAIN = (
    bytes([43, 1, 1, 12] + [0x5A] * 12)  # hop-by-hop, 16 bytes (PadN), next: routing
    + bytes([44, 0, 253, 0, 0, 0, 0, 0])  # routing (experimental type, no segments left), next: fragment
    + bytes([60, 0, 0, 0, 0, 0, 0, 7])  # atomic fragment (offset 0, no more), next: destination options
    + bytes([6, 0, 1, 4, 0, 0, 0, 0])  # destination options (PadN), next: TCP
)


def _ipv6_reference():
    """What the IPv6 variants must yield: the exchange, with the big segment split."""
    parser = FrameParser()
    segments = [parser.parse(b"\0" * 12 + b"\x86\xdd" + packet, 1, ts)
                for ts, packet in ipv6_packets(exchange_frames(), b"", 6)]
    return [segment._replace(payload=bytes(segment.payload)) for segment in segments]


def test_ipv6_with_extension_headers(tmp_path):
    frames = [(ts, b"\x02" * 12 + b"\x86\xdd" + packet)
              for ts, packet in ipv6_packets(exchange_frames(), EXTENSION_CHAIN, 0)]
    path = write_pcap(tmp_path / "ipv6.pcap", frames)
    segments = segments_of(path)
    assert (segments[0].src, segments[0].dst) == ("fd00::1", "fd00::2")
    same_segments(segments, reference=_ipv6_reference())
    streams = reassemble_file(path)
    assert streams.bytes_of(0, 0) == CLIENT_BYTES and streams.bytes_of(0, 1) == SERVER_BYTES


def test_raw_ipv6_link_type(tmp_path):
    path = write_pcap(tmp_path / "raw6.pcap", ipv6_packets(exchange_frames(), b"", 6), linktype=229)
    same_segments(segments_of(path), reference=_ipv6_reference())


# ---------------------------------------------------------------- damaged and odd packets


def test_snaplen_cut_records_deliver_what_is_present_and_report_the_rest(tmp_path):
    snaplen = 200
    records = [(ts, frame[:snaplen], len(frame)) for ts, frame in exchange_frames()]
    path = write_records(tmp_path / "cut.pcap", records)
    with open_capture(path) as reader:
        segments = list(reader.segments())
    headers = 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps
    for segment, full in zip(segments, REFERENCE):
        assert bytes(segment.payload) == full.payload[: snaplen - headers]
        assert segment.missing == max(0, len(full.payload) - (snaplen - headers))
        assert segment.truncated == (len(full.payload) > snaplen - headers)
    streams = reassemble_file(path)
    client_gaps = [(offset + snaplen - headers, size - (snaplen - headers))
                   for offset, size in [(0, 300), (300, 300), (600, 1200), (1800, 300), (2100, 65483), (67583, 4517)]]
    assert streams.gaps[(0, 0)] == client_gaps
    assert streams.gaps[(0, 1)] == [(2120 - 2000 + snaplen - headers, 2000 - (snaplen - headers)),
                                    (2360 + snaplen - headers, 500 - (snaplen - headers))]
    assert streams.bytes_of(0, 0) == b"".join(
        CLIENT_BYTES[offset : offset + snaplen - headers] for offset in (0, 300, 600, 1800, 2100, 67583))
    assert streams.ends[-1] == (0, 2, "fin")


def test_original_length_smaller_than_captured_is_not_a_cut(tmp_path):
    records = [(ts, frame, min(len(frame), 60)) for ts, frame in exchange_frames()]
    same_segments(segments_of(write_records(tmp_path / "odd.pcap", records)))


def test_bad_checksums_are_ignored(tmp_path):
    frames = []
    for ts, frame in exchange_frames():
        eth = dpkt.ethernet.Ethernet(frame)
        eth.data.sum, eth.data.data.sum = 0x1234, 0x4321
        frames.append((ts, bytes(eth)))
    assert dpkt.ethernet.Ethernet(frames[0][1]).data.sum == 0x1234
    same_segments(segments_of(write_pcap(tmp_path / "checksums.pcap", frames)))


def _ipv4_frame(tcp_payload=b"data", flags_fragment=0, proto=6, options=b"", total_len=None, pad_to=0):
    tcp = struct.pack("!HHIIBBHHH", 1234, 9092, 77, 0, 5 << 4, ACK, 1000, 0, 0) + tcp_payload
    header_len = 20 + len(options)
    length = header_len + len(tcp) if total_len is None else total_len
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | header_len // 4, 0, length, 1, flags_fragment, 64, proto, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])) + options + tcp
    frame = b"\x02" * 12 + ETHERTYPE_IPV4 + ip
    return frame + b"\0" * (pad_to - len(frame))


def test_parser_skips_and_counts_what_it_cannot_use():
    parser = FrameParser()
    unusable = [
        _ipv4_frame(flags_fragment=0x2000),  # first fragment (more fragments follow)
        _ipv4_frame(flags_fragment=0x0010),  # a later fragment
        _ipv4_frame(proto=17),  # UDP
        b"\xff" * 12 + b"\x08\x06" + b"\0" * 28,  # ARP
        _ipv4_frame()[:40],  # TCP header cut short
        b"\x02" * 12 + b"\x86\xdd" + struct.pack("!IHBB16s16s", 6 << 28, 8, 44, 64, b"\0" * 16, b"\0" * 16)
        + bytes([6, 0, 0, 8, 0, 0, 0, 1]),  # IPv6 fragment at offset 8
    ]
    assert [parser.parse(frame, 1, 0.0) for frame in unusable] == [None] * 6
    assert parser.parse(_ipv4_frame(), 147, 0.0) is None
    assert dict(parser.skipped) == {"IP fragment": 3, "not TCP": 1, "not IP": 1, "malformed": 1, "link type 147": 1}


def test_parser_reads_ip_options_and_ignores_ethernet_padding():
    parser = FrameParser()
    with_options = parser.parse(_ipv4_frame(options=b"\x01\x01\x01\x00"), 1, 1.5)
    assert (with_options.src, with_options.sport, with_options.seq, bytes(with_options.payload)) == (
        "10.0.0.1", 1234, 77, b"data")
    padded = parser.parse(_ipv4_frame(tcp_payload=b"", pad_to=60), 1, 0.0)
    assert bytes(padded.payload) == b"" and padded.missing == 0


def test_parser_names_every_address_right_among_many():
    """Address texts are remembered in a fixed-size table: thousands of hosts, v4 and v6, still come out right."""
    import ipaddress

    parser = FrameParser()
    base = _ipv4_frame()
    for n in range(3000):
        src, dst = n.to_bytes(4, "big"), (n * 7919 % 2**32).to_bytes(4, "big")
        frame = base[:26] + src + dst + base[34:]
        segment = parser.parse(frame, 1, 0.0)
        assert (segment.src, segment.dst) == (str(ipaddress.IPv4Address(src)), str(ipaddress.IPv4Address(dst)))
        v6 = ipaddress.IPv6Address(b"\xfd" + bytes(11) + src)
        frame6 = b"\x60" + bytes(3) + struct.pack("!HBB", 24, 6, 64) + v6.packed + v6.packed + base[34:]
        assert parser.parse(frame6, 229, 0.0).src == str(v6)


def test_parser_takes_the_frame_length_when_the_ip_length_is_zero():
    """Segmentation offload: captured before the NIC splits it, with IP total length 0."""
    segment = FrameParser().parse(_ipv4_frame(tcp_payload=b"x" * 3000, total_len=0), 1, 0.0)
    assert bytes(segment.payload) == b"x" * 3000


def test_lying_ip_length_in_an_uncut_frame_invents_no_gap():
    frame = _ipv4_frame(tcp_payload=b"abc", total_len=20 + 20 + 500)
    segment = FrameParser().parse(frame, 1, 0.0, wire_len=len(frame))
    assert (bytes(segment.payload), segment.missing) == (b"abc", 0)


LINK_TYPES = (0, 1, 12, 101, 108, 113, 228, 229, 276, 147)
SKIP_REASONS = {"malformed", "not IP", "not TCP", "IP fragment", "link type 147"}


def _check_parse(frame: bytes, linktype: int, wire_len: int | None) -> None:
    """Whatever the bytes, the C parser answers a segment whose payload lies in the frame, or a reason."""
    parser = FrameParser()
    segment = parser.parse(frame, linktype, 1.25, wire_len)
    if segment is None:
        assert set(parser.skipped) <= SKIP_REASONS and sum(parser.skipped.values()) == 1
        return
    assert type(segment.payload) is bytes and segment.payload in frame
    assert 0 <= segment.missing <= max(0, (wire_len or 0) - len(frame))
    assert 0 <= segment.sport < 65536 and 0 <= segment.dport < 65536 and 0 <= segment.seq < 2**32
    assert segment.ts == 1.25


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=120), st.sampled_from(LINK_TYPES), st.one_of(st.none(), st.integers(0, 200)))
def test_parser_never_fails_on_random_bytes(frame, linktype, wire_len):
    _check_parse(frame, linktype, wire_len)


_REAL_FRAMES = [frame for _ts, frame in exchange_frames()][:6]


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(_REAL_FRAMES), st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), max_size=4),
       st.integers(0, 90), st.sampled_from(LINK_TYPES[:9]))
def test_parser_never_fails_on_mutated_or_cut_real_frames(frame, changes, cut, linktype):
    mutated = bytearray(frame)
    for at, value in changes:
        if at < len(mutated):
            mutated[at] = value
    _check_parse(bytes(mutated[: len(mutated) - cut]), linktype, len(frame))


@pytest.mark.parametrize("chunk", [1, 7, 66, 4096])
def test_records_are_the_same_whatever_the_read_size(monkeypatch, tmp_path, chunk):
    """The record loop scans what each read brings: records cut across reads come out whole."""
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(EXCHANGE_PCAP.read_bytes()[:-30])
    with open_capture(cut) as reader:
        whole_frames, whole_warnings = list(reader.frames()), reader.warnings
    monkeypatch.setattr(files, "_SCAN_CHUNK", chunk)
    assert segments_of(EXCHANGE_PCAP) == REFERENCE
    with open_capture(cut) as reader:
        assert list(reader.frames()) == whole_frames and len(whole_frames) == 19
        assert reader.warnings == whole_warnings and len(whole_warnings) == 1
        assert reader.frames_read == 19


# ---------------------------------------------------------------- files that cannot be read (fully)


def test_missing_file():
    with pytest.raises(CaptureError, match=r"^/no/such/capture\.pcap: no such file; check the path$"):
        open_capture("/no/such/capture.pcap")


def test_directory(tmp_path):
    with pytest.raises(CaptureError, match="is a directory"):
        open_capture(tmp_path)


def test_permission_denied(tmp_path):
    path = tmp_path / "secret.pcap"
    path.write_bytes(EXCHANGE_PCAP.read_bytes())
    path.chmod(0)
    if os.geteuid() == 0:  # root reads anything: drop the effective uid for the attempt
        os.seteuid(65534)
    try:
        with pytest.raises(CaptureError, match="permission denied; make the file readable"):
            open_capture(path)
    finally:
        if os.getuid() == 0:
            os.seteuid(0)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"GET / HTTP/1.1\r\n", "file is not a pcap or pcapng capture (starts with 47455420)"),
        (gzip.compress(b"just some text"), "gzip-compressed data is not a pcap or pcapng capture"),
        (b"", "file too short to be a capture (0 bytes); give a file written by tcpdump, tshark, dumpcap or "
              "Wireshark"),
        (b"\xd4\xc3\xb2\xa1\x02\x00", "pcap file header cut short (6 of 24 bytes); the file is truncated: copy or "
                                     "write it again whole"),
        (b"\x1f\x8b\x08\x00garbage", "damaged gzip data"),
    ],
)
def test_not_a_capture(tmp_path, content, message):
    path = tmp_path / "x.pcap"
    path.write_bytes(content)
    with pytest.raises(CaptureError, match=message.replace("(", r"\(").replace(")", r"\)")):
        open_capture(path)


def _read_all(path):
    with open_capture(path) as reader:
        frames = list(reader.frames())
        return frames, reader.warnings


def test_truncated_pcap_delivers_complete_records_then_warns(tmp_path):
    data = EXCHANGE_PCAP.read_bytes()
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:-30])
    frames, warnings = _read_all(path)
    last_record = len(data) - 16 - 66  # the final ACK: 66-byte frame
    assert len(frames) == 19
    assert warnings == [f"{path}: capture ends inside the record at byte {last_record} (36 of 66 bytes; file truncated?)"]
    path.write_bytes(data[: last_record + 10])
    frames, warnings = _read_all(path)
    assert len(frames) == 19
    assert warnings == [f"{path}: capture ends inside a record header at byte {last_record} (file truncated?)"]


def test_corrupt_record_length_stops_with_a_warning(tmp_path):
    data = bytearray(EXCHANGE_PCAP.read_bytes())
    first_record = 24
    second_record = first_record + 16 + struct.unpack_from("<I", data, first_record + 8)[0]
    struct.pack_into("<I", data, second_record + 8, 0x7FFFFFFF)
    path = tmp_path / "corrupt.pcap"
    path.write_bytes(bytes(data))
    frames, warnings = _read_all(path)
    assert len(frames) == 1
    assert warnings == [f"{path}: record at byte {second_record} claims 2147483647 bytes: file corrupt from here"]


def test_truncated_gzip_stream(tmp_path):
    packed = gzip.compress(EXCHANGE_PCAP.read_bytes())
    path = tmp_path / "cut.pcap.gz"
    path.write_bytes(packed[: len(packed) // 2])
    frames, warnings = _read_all(path)
    assert 0 < len(frames) < 20
    assert warnings == [f"{path}: compressed data ends early after {len(frames)} records (file truncated?)"]


def test_truncated_pcapng_and_undescribed_interface(tmp_path):
    path = _pcapng_two_interfaces(tmp_path / "mixed.pcapng")
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    frames, warnings = _read_all(path)
    assert len(frames) == 19
    assert len(warnings) == 1 and "capture ends inside the block at byte" in warnings[0]

    # an EPB naming interface 7, which no IDB described
    stray = dpkt.pcapng.EnhancedPacketBlockLE(iface_id=7, pkt_data=exchange_frames()[0][1])
    path.write_bytes(data + bytes(stray))
    with open_capture(path) as reader:
        assert len(list(reader.segments())) == 20
        assert dict(reader.skipped) == {"packet of an undescribed interface": 1}
        assert reader.warnings == []


# ---------------------------------------------------------------- pcapng's block loop (C) and its rare blocks


def _block(block_type: int, body: bytes, order: str = "<") -> bytes:
    body += b"\0" * (-len(body) % 4)
    size = 12 + len(body)
    return struct.pack(order + "II", block_type, size) + body + struct.pack(order + "I", size)


def test_simple_and_obsolete_packet_blocks_and_unknown_blocks(tmp_path):
    """Every packet block kind, an interface whose timestamps have an offset and a binary resolution,
    and a block of a kind we do not know (skipped); frames are the same as in the pcap."""
    frames = exchange_frames()
    tsresol_2_20, tsoffset_100 = struct.pack("<HHB3x", 9, 1, 0x80 | 20), struct.pack("<HHq", 14, 8, 100)
    section = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    interfaces = (_block(1, struct.pack("<HHI", 1, 0, 262144))
                  + _block(1, struct.pack("<HHI", 1, 0, 262144) + tsresol_2_20 + tsoffset_100 + b"\0" * 4))
    blocks = []
    for i, (ts, frame) in enumerate(frames):
        if i % 3 == 0:  # simple packet block: the first interface, no timestamp
            blocks.append(_block(3, struct.pack("<I", len(frame)) + frame))
        elif i % 3 == 1:  # obsolete packet block, second interface
            ticks = round((ts - 100) * 2**20)
            blocks.append(_block(2, struct.pack("<HHIIII", 1, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(frame),
                                                len(frame)) + frame))
        else:
            blocks.append(_block(0x0BADCAFE, b"custom"))
            micros = round(ts * 1e6)
            blocks.append(_block(6, struct.pack("<IIIII", 0, micros >> 32, micros & 0xFFFFFFFF, len(frame),
                                                len(frame)) + frame))
    path = tmp_path / "kinds.pcapng"
    path.write_bytes(section + interfaces + b"".join(blocks))
    with open_capture(path) as reader:
        got = list(reader.frames())
        assert reader.warnings == [] and reader.frames_read == len(frames)
    assert [frame for _ts, _linktype, frame, _wire in got] == [frame for _ts, frame in frames]
    for i, ((ts, _), (got_ts, linktype, _, wire_len)) in enumerate(zip(frames, got)):
        assert linktype == 1 and wire_len == len(frames[i][1])
        if i % 3 == 0:
            assert got_ts == 0.0
        else:
            assert got_ts == pytest.approx(ts, abs=1e-6)


def _frames_and_notes(path, chunk: int) -> tuple:
    saved = files._SCAN_CHUNK
    files._SCAN_CHUNK = chunk
    try:
        with open_capture(path) as reader:
            frames = list(reader.frames())
        with open_capture(path) as counting:  # (the connections' bytes, read as damaged)
            counts = counting.bucket_bytes()
            assert counting.warnings == reader.warnings and counting.frames_read == reader.frames_read
        return frames, reader.warnings, dict(reader.skipped), reader.frames_read, counts
    finally:
        files._SCAN_CHUNK = saved


@settings(max_examples=150, deadline=None)
@given(changes=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=6),
       cut=st.integers(0, 3000), chunk=st.sampled_from([1, 9, 100, 4096]))
def test_damaged_pcapng_never_fails_and_reads_the_same_whatever_the_read_size(tmp_path_factory, changes, cut,
                                                                              chunk):
    path = tmp_path_factory.mktemp("damaged") / "damaged.pcapng"
    data = bytearray(_pcapng_two_interfaces(path).read_bytes())
    for at, value in changes:  # the magic stays: without it the file is refused, as it should be
        data[4 + at % (len(data) - 4)] = value
    path.write_bytes(bytes(data[:max(len(data) - cut, 4)]))
    whole = _frames_and_notes(path, 1 << 20)
    assert _frames_and_notes(path, chunk) == whole
    frames, warnings, _skipped, frames_read, _counts = whole
    assert len(frames) <= frames_read
    if not changes and cut == 0:
        assert warnings == [] and len(frames) == len(exchange_frames())


@pytest.mark.parametrize("chunk", [1, 7, 66, 4096])
def test_pcapng_records_are_the_same_whatever_the_read_size(tmp_path, chunk):
    path = _pcapng_two_interfaces(tmp_path / "mixed.pcapng")
    assert _frames_and_notes(path, chunk) == _frames_and_notes(path, 1 << 20)


@pytest.mark.parametrize("compressed", [False, True])
def test_packets_are_estimated_from_the_start_of_the_file(tmp_path, compressed):
    """12,000 packets of 1,000 bytes: 4 MiB of the file are counted, the rest extrapolated (within 2%); a file
    smaller than the sample is counted whole."""
    path = tmp_path / ("big.pcap.gz" if compressed else "big.pcap")
    frame = bytes(1000)
    body = b"".join(struct.pack("<IIII", 1_700_000_000 + i, 0, len(frame), len(frame)) + frame for i in range(12_000))
    data = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1) + body
    path.write_bytes(gzip.compress(data, 1) if compressed else data)
    with open_capture(path) as reader:
        assert abs(reader.estimated_packets(4 << 20) - 12_000) <= 240
        assert reader.estimated_packets(64 << 20) == 12_000
        assert reader.estimated_packets(1 << 20) > 0
        assert sum(1 for _ in reader.frames()) == 12_000  # the estimate read a copy: the reader starts at the start


def _capture_in_form(tmp_path, form: str) -> tuple[Path, list]:
    """consumer_group.pcap as pcap, as pcapng (frames from the lower port on a second interface, as Linux cooked
    v2) or with IPv6 addresses."""
    from pcapkit import as_ipv6, read_packets, write_pcap, write_pcapng

    packets = read_packets(Path(__file__).parents[1] / "captures" / "consumer_group.pcap")
    if form == "pcapng":
        path = write_pcapng(tmp_path / "c.pcapng", packets,
                            lambda p: int(tcp_of(p.frame).sport < tcp_of(p.frame).dport),
                            [(dpkt.pcap.DLT_EN10MB, bytes), (276, lambda f: sll2_header(f[12:14]) + f[14:])])
    else:
        path = write_pcap(tmp_path / "c.pcap", [(ts, as_ipv6(f) if form == "ipv6" else f) for ts, f in packets])
    return path, packets


def _bucket(seg) -> int:
    """A connection's bucket as the reader has it: FNV-1a over its endpoints (raw address, then the port's two
    bytes), the lower endpoint first, so that both directions agree and every process."""
    ends = sorted([(socket.inet_pton(socket.AF_INET6 if ":" in seg.src else socket.AF_INET, seg.src), seg.sport),
                   (socket.inet_pton(socket.AF_INET6 if ":" in seg.dst else socket.AF_INET, seg.dst), seg.dport)])
    hashed = 14695981039346656037
    for byte in b"".join(address + port.to_bytes(2, "big") for address, port in ends):
        hashed = (hashed ^ byte) * 1099511628211 % 2**64
    return hashed % files.CONNECTION_BUCKETS


@pytest.mark.parametrize("form", ["pcap", "pcapng", "ipv6"])
def test_a_share_of_the_connections_keeps_every_segments_index(tmp_path, form):
    """A Spark task's share of a file (segment_batches(shard, owners)): the segments of the connections whose
    bucket the owners table gives it, both directions together, and None for every other segment, so that each
    keeps its index."""
    path, packets = _capture_in_form(tmp_path, form)
    with open_capture(path) as reader:
        every = [seg for batch in reader.segment_batches() for seg in batch]
    assert len(every) == len(packets) and None not in every
    buckets = sorted({_bucket(seg) for seg in every})  # the capture's connections' buckets, dealt to three shares
    assert len(buckets) > 3
    owners = array("H", [0] * files.CONNECTION_BUCKETS)
    for number, bucket in enumerate(buckets):
        owners[bucket] = number % 3
    owners = owners.tobytes()
    for shard in range(3):
        with open_capture(path) as reader:
            share = [seg for batch in reader.segment_batches(shard, owners) for seg in batch]
        assert share == [seg if buckets.index(_bucket(seg)) % 3 == shard else None for seg in every]
    with open_capture(path) as reader:  # a table that gives every bucket to share 1: nothing for share 0
        nobody = array("H", [1] * files.CONNECTION_BUCKETS).tobytes()
        assert {seg for batch in reader.segment_batches(0, nobody) for seg in batch} == {None}
    for shard, table, why in [(0, owners[:-2], "owners must hold"), (0, owners + b"\0\0", "owners must hold"),
                              (-1, owners, "shard must be in"), (65536, owners, "shard must be in")]:
        with open_capture(path) as reader, pytest.raises(ValueError, match=why):
            next(reader.segment_batches(shard, table))


@pytest.mark.parametrize("form", ["pcap", "pcapng", "ipv6"])
def test_bucket_bytes_add_up_each_connections_captured_bytes_in_its_bucket(tmp_path, form):
    """bucket_bytes: every TCP frame's captured length added to its connection's bucket (both directions in one),
    the frames read up to a cut record at the end; nothing else is made of the file, nor counted as skipped."""
    path, packets = _capture_in_form(tmp_path, form)
    path.write_bytes(path.read_bytes() + bytes(7))
    expected = array("Q", bytes(8 * files.CONNECTION_BUCKETS))
    with open_capture(path) as reader:
        for ts, linktype, frame, wire_len in reader.frames():
            expected[_bucket(FrameParser().parse(frame, linktype, ts))] += len(frame)
    with open_capture(path) as reader:
        assert reader.bucket_bytes() == expected
        assert len(reader.warnings) == 1 and reader.frames_read == len(packets) and not reader.skipped
    assert sum(1 for count in expected if count) > 3
    with open_capture(path) as reader, pytest.raises(ValueError, match="counts must hold"):
        next(reader._records(True, counts=array("Q", [0])))


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(st.integers(-3, 3), min_size=1, max_size=60), udp=st.sets(st.integers(0, 59)),
       form=st.sampled_from(["pcap", "pcapng"]), chunk=st.sampled_from([1, 100, 1 << 20]), shared=st.booleans())
def test_each_segment_comes_with_the_latest_time_of_any_tcp_packet_up_to_it(tmp_path_factory, steps, udp, form, chunk,
                                                                        shared):
    """segment_batches_reached (the pipeline's order of a file's packets among other files', and its capture time):
    with each item, the latest time of any TCP packet of the file up to it, whatever the read size; other shares'
    segments move it too, frames that hold no segment (UDP here) do not, as TCP reassembly does not see them. A
    chunk whose items are each at their own time has None instead; `time_reached` is the file's latest. Record times
    step back and forth by whole seconds."""
    from pcapkit import Packet, read_packets, write_pcap, write_pcapng

    group = read_packets(Path(__file__).parents[1] / "captures" / "consumer_group.pcap")
    ts, packets = 1_700_000_000.0, []
    for n, step in enumerate(steps):
        ts += step
        packets.append(Packet(ts, _ipv4_frame(proto=17) if n in udp else group[n].frame))
    directory = tmp_path_factory.mktemp("reached")
    path = (write_pcapng(directory / "c.pcapng", packets, lambda p: len(p.frame) % 2,
                         [(dpkt.pcap.DLT_EN10MB, bytes), (dpkt.pcap.DLT_EN10MB, bytes)]) if form == "pcapng"
            else write_pcap(directory / "c.pcap", packets))
    expected, latest = [], -float("inf")  # (segment, time reached) of each TCP record
    with open_capture(path) as reader:
        for ts, linktype, frame, _ in reader.frames():
            seg = FrameParser().parse(frame, linktype, ts)
            if seg is not None and not isinstance(seg, str):
                latest = max(latest, ts)
                expected.append((seg, latest))
    owners = array("H", [n % 2 for n in range(files.CONNECTION_BUCKETS)]).tobytes() if shared else None
    saved, files._SCAN_CHUNK = files._SCAN_CHUNK, chunk
    try:
        with open_capture(path) as reader:
            got = [(item, None if reached is None else reached[n])
                   for items, reached in reader.segment_batches_reached(0, owners) for n, item in enumerate(items)]
            assert reader.time_reached == latest
    finally:
        files._SCAN_CHUNK = saved
    assert len(got) == len(expected) == len(steps) - len(udp & set(range(len(steps))))
    for (item, reached), (seg, latest) in zip(got, expected):
        assert item == (seg if not shared or _bucket(seg) % 2 == 0 else None)
        assert reached == latest if reached is not None else seg.ts == latest
