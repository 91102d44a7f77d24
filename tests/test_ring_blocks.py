"""The walker of a live capture's TPACKET_V3 ring blocks (`_headers.scan_ring_block`), on blocks built here
as the kernel lays them out (linux/if_packet.h), whole, with VLAN tags taken off, cut, and damaged.

Frames of the recorded loopback exchange go in; what comes out must be what the capture file reader's
parser makes of the same frames, and the pcap records must read back as the frames. Damaged blocks (any
length or offset in them rewritten, random bytes) must never make the walker read outside the block
(the sanitizer job runs this file) and must account for every frame the block claims.
"""

from __future__ import annotations

import io
import struct
import sys

import dpkt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkasniff.capture import _headers
from kafkasniff.capture.packets import FrameParser
from test_tcp_reassembly import exchange_frames

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TPACKET_V3 rings are Linux's")

PAGE = 4096
TP_STATUS_KERNEL, TP_STATUS_USER, TP_STATUS_VLAN_VALID, TP_STATUS_VLAN_TPID_VALID = 0, 1, 0x10, 0x40
BLOCK_HEADER = struct.Struct("=IIIIIIQIIII")  # version, offset_to_priv, block_status, num_pkts,
#                                              offset_to_first_pkt, blk_len, seq_num, ts_first_pkt, ts_last_pkt
FRAME_HEADER = struct.Struct("=IIIIIIHHIIHH8x")  # next, sec, nsec, snaplen, len, status, mac, net,
#                                                  rxhash, vlan_tci, vlan_tpid, padding
FIRST_FRAME = 48  # the kernel's offset_to_first_pkt: the block header, aligned to 8, and no private area
ETHERNET = 1
SOCKADDR_LL = 20  # the kernel puts the sender's address between a frame's header and its bytes
ETHERNET_HEADER = 14
MALFORMED = "malformed ring frame"

EXCHANGE = exchange_frames()


def align16(n: int) -> int:
    return (n + 15) & ~15


class RingFrame:
    """One frame as the kernel stores it: bytes captured, length on the wire, time, VLAN tag taken off."""

    def __init__(self, data: bytes, ts_ns: int, wire_len: int | None = None, vlan: tuple[int, int] | None = None):
        self.data = data
        self.seconds, self.nanoseconds = divmod(ts_ns, 10**9)
        self.wire_len = len(data) if wire_len is None else wire_len
        self.vlan = vlan  # (tpid, tci)


def ring_block(frames: list[RingFrame], status: int = TP_STATUS_USER) -> bytearray:
    """A block as the kernel hands it over: frames packed at 16-byte alignment, each at the offset where an
    Ethernet frame's IP header is aligned (tp_mac), the last one's next offset 0; whole pages, the rest unused."""
    mac = align16(FRAME_HEADER.size + SOCKADDR_LL + ETHERNET_HEADER) - ETHERNET_HEADER
    used = FIRST_FRAME + sum(align16(mac + len(frame.data)) for frame in frames)
    block = bytearray((used + PAGE) // PAGE * PAGE)
    offset = FIRST_FRAME
    for i, frame in enumerate(frames):
        span = align16(mac + len(frame.data))
        last = i == len(frames) - 1
        frame_status = TP_STATUS_USER
        tpid, tci = frame.vlan or (0, 0)
        if frame.vlan:
            frame_status |= TP_STATUS_VLAN_VALID | TP_STATUS_VLAN_TPID_VALID
        FRAME_HEADER.pack_into(block, offset, 0 if last else span, frame.seconds, frame.nanoseconds, len(frame.data),
                               frame.wire_len, frame_status, mac, mac + ETHERNET_HEADER, 0, tci, tpid, 0)
        block[offset + mac:offset + mac + len(frame.data)] = frame.data
        offset += span
    BLOCK_HEADER.pack_into(block, 0, 3, 0, status, len(frames), FIRST_FRAME, offset, 7, 0, 0, 0, 0)
    return block


def block_status(block: bytearray) -> int:
    return struct.unpack_from("=I", block, 8)[0]


def parsed_one_by_one(frames: list[tuple[bytes, float, int]]) -> tuple[list, dict]:
    """What the capture files' parser makes of (frame, ts, wire_len) each."""
    parser = FrameParser()
    segments = [parser.parse(frame, ETHERNET, ts, wire_len) for frame, ts, wire_len in frames]
    return [s for s in segments if s is not None], dict(parser.skipped)


def read_pcap_records(records: bytes, snaplen: int = 262144) -> list[tuple[int, bytes, int]]:
    """(timestamp in ns, frame, original length) of each record, read by dpkt behind a nanosecond file header."""
    header = struct.pack("=IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, snaplen, ETHERNET)
    reader = dpkt.pcap.Reader(io.BytesIO(header + records))
    found = []
    for (ts, frame), length in zip(reader, _original_lengths(records)):
        found.append((round(ts * 10**9), bytes(frame), length))
    return found


def _original_lengths(records: bytes):
    at = 0
    while at < len(records):
        _, _, caplen, wire_len = struct.unpack_from("=IIII", records, at)
        yield wire_len
        at += 16 + caplen


def test_a_block_gives_the_segments_the_file_parser_gives_and_its_frames_as_pcap_records():
    frames = [RingFrame(frame, 1_700_000_000_123_456_789 + i * 1_000) for i, (_ts, frame) in enumerate(EXCHANGE[:20])]
    block = ring_block(frames)
    skipped, records = {}, bytearray()
    segments, claimed = _headers.scan_ring_block(block, ETHERNET, skipped, records)
    expected, expected_skipped = parsed_one_by_one([(f.data, f.seconds + f.nanoseconds * 1e-9, len(f.data))
                                                    for f in frames])
    assert (claimed, segments, skipped) == (20, expected, expected_skipped)
    assert len(segments) == 20
    assert block_status(block) == TP_STATUS_KERNEL  # handed back
    assert read_pcap_records(bytes(records)) == [
        (f.seconds * 10**9 + f.nanoseconds, f.data, len(f.data)) for f in frames]


def test_a_block_the_kernel_still_owns_is_left_alone():
    block = ring_block([RingFrame(EXCHANGE[0][1], 0)], status=TP_STATUS_KERNEL)
    before = bytes(block)
    skipped, records = {}, bytearray()
    assert _headers.scan_ring_block(block, ETHERNET, skipped, records) is None
    assert (bytes(block), skipped, records) == (before, {}, bytearray())


def test_an_empty_block_handed_over_by_the_timer_gives_nothing():
    block = ring_block([])
    assert _headers.scan_ring_block(block, ETHERNET, {}, None) == ([], 0)
    assert block_status(block) == TP_STATUS_KERNEL


def test_a_vlan_tag_taken_off_by_the_nic_is_put_back():
    data = EXCHANGE[3][1]
    tagged = data[:12] + b"\x88\xa8" + (0x2064).to_bytes(2, "big") + data[12:]
    block = ring_block([RingFrame(data, 5_000_000_001, vlan=(0x88A8, 0x2064))])
    records = bytearray()
    segments, claimed = _headers.scan_ring_block(block, ETHERNET, {}, records)
    expected, _ = parsed_one_by_one([(tagged, 5.000000001, len(tagged))])
    assert (segments, claimed) == (expected, 1)
    assert read_pcap_records(bytes(records)) == [(5_000_000_001, tagged, len(tagged))]


def test_a_frame_cut_by_the_snaplen_counts_the_missing_bytes():
    data = max((frame for _ts, frame in EXCHANGE), key=len)
    cut = data[:200]
    block = ring_block([RingFrame(cut, 0, wire_len=len(data))])
    records = bytearray()
    (segment,), claimed = _headers.scan_ring_block(block, ETHERNET, {}, records)
    assert segment.missing == len(data) - 200 > 0
    assert segment == parsed_one_by_one([(cut, 0.0, len(data))])[0][0]
    assert read_pcap_records(bytes(records)) == [(0, cut, len(data))]


def test_frames_that_do_not_fit_the_block_are_counted_not_read():
    frames = [RingFrame(frame, 0) for _ts, frame in EXCHANGE[:3]]
    block = ring_block(frames)
    second = struct.unpack_from("=I", block, FIRST_FRAME)[0] + FIRST_FRAME
    struct.pack_into("=I", block, second + 12, len(block))  # the second frame's snaplen runs past the block
    skipped = {}
    segments, claimed = _headers.scan_ring_block(block, ETHERNET, skipped, None)
    assert (len(segments), claimed, skipped) == (1, 3, {MALFORMED: 2})
    assert segments == parsed_one_by_one([(frames[0].data, 0.0, len(frames[0].data))])[0]


def test_a_block_too_short_for_its_header_is_refused():
    with pytest.raises(ValueError, match="not a ring block"):
        _headers.scan_ring_block(bytearray(40), ETHERNET, {}, None)


# Where the lengths and offsets of a block of three frames are: the block's frame count, first offset and
# length; each frame's next offset, snaplen, original length, status and mac offset.
def _field_offsets(block: bytearray) -> list[int]:
    fields = [12, 16, 20]
    offset = FIRST_FRAME
    for _ in range(3):
        fields += [offset, offset + 12, offset + 16, offset + 20, offset + 24]
        offset += struct.unpack_from("=I", block, offset)[0]
    return fields


_THREE = ring_block([RingFrame(frame, 0) for _ts, frame in EXCHANGE[:3]])
_FIELDS = _field_offsets(_THREE)
_WORDS = st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 300),
                   st.sampled_from([len(_THREE) - 1, len(_THREE), 2**31, 2**32 - 1, 2**32 - 16]))


def _check_accounting(block: bytearray, linktype: int = ETHERNET) -> None:
    """Every frame the block claims is a segment, a frame without one, or counted malformed; the block is back."""
    claimed_in_header = struct.unpack_from("=I", block, 12)[0]
    skipped, records = {}, bytearray()
    segments, claimed = _headers.scan_ring_block(block, linktype, skipped, records)
    assert claimed == claimed_in_header
    assert len(segments) + sum(skipped.values()) == claimed
    assert block_status(block) == TP_STATUS_KERNEL
    assert len(read_pcap_records(bytes(records))) == claimed - skipped.get(MALFORMED, 0)


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_FIELDS), _WORDS), min_size=1, max_size=4),
       st.sampled_from([ETHERNET, 113, 101, 0]))
def test_rewritten_lengths_and_offsets_never_read_outside_the_block(rewrites, linktype):
    block = bytearray(_THREE)
    for at, value in rewrites:
        struct.pack_into("=I", block, at, value)  # tp_mac: with tp_net, in one 32-bit word
    struct.pack_into("=I", block, 8, TP_STATUS_USER)
    _check_accounting(block, linktype)


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=48, max_size=600), st.integers(0, 40))
def test_random_blocks_never_read_outside_the_block(data, claimed):
    block = bytearray(data)
    struct.pack_into("=II", block, 8, TP_STATUS_USER, claimed)
    _check_accounting(block)
