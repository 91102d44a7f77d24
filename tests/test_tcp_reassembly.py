"""TCP reassembly: a real loopback exchange cut, reordered and rewritten, and hand-built segments.

tests/data/loopback_exchange.pcap was recorded by tests/data/record_loopback_exchange.py;
both byte streams are rebuilt here from loopback_exchange.json, so every test can demand
the exact bytes back.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import dpkt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkasniff.capture.files import open_capture
from kafkasniff.capture.packets import ACK, FIN, RST, SYN, TcpSegment
from kafkasniff.stream.tcp import (
    A_TO_B,
    B_TO_A,
    BOTH,
    END_CAPTURE,
    END_CROWDED,
    END_FIN,
    END_PORT_REUSED,
    END_RST,
    TcpConnection,
    ConnectionOpened,
    Endpoint,
    Gap,
    LateData,
    StreamData,
    StreamEnd,
    TcpReassembler,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
EXCHANGE_PCAP = DATA_DIR / "loopback_exchange.pcap"
_MANIFEST = json.loads((DATA_DIR / "loopback_exchange.json").read_text())
SERVER_PORT = _MANIFEST["server_port"]
CLIENT_BYTES = hashlib.shake_256(_MANIFEST["client_seed"].encode()).digest(sum(_MANIFEST["request_sizes"]))
SERVER_BYTES = hashlib.shake_256(_MANIFEST["server_seed"].encode()).digest(sum(_MANIFEST["response_sizes"]))


# ---------------------------------------------------------------- helpers shared with test_capture_files


def exchange_frames() -> list[tuple[float, bytes]]:
    """The recorded exchange as (timestamp, Ethernet frame) pairs."""
    with open_capture(EXCHANGE_PCAP) as reader:
        return [(ts, frame) for ts, _linktype, frame, _wire_len in reader.frames()]


def tcp_of(frame: bytes) -> dpkt.tcp.TCP:
    return dpkt.ethernet.Ethernet(frame).data.data


def frame_index(frames, from_client: bool, payload_len: int) -> int:
    """Index of the frame the client (or server) sent with this many payload bytes."""
    for i, (_ts, frame) in enumerate(frames):
        tcp = tcp_of(frame)
        if (tcp.dport == SERVER_PORT) == from_client and len(tcp.data) == payload_len:
            return i
    raise LookupError(payload_len)


def rewrite_tcp(frame: bytes, **tcp_fields) -> bytes:
    """The frame with some TCP fields replaced; lengths and checksums recomputed."""
    eth = dpkt.ethernet.Ethernet(frame)
    for name, value in tcp_fields.items():
        setattr(eth.data.data, name, value)
    eth.data.sum = 0
    eth.data.data.sum = 0
    return bytes(eth)


def write_pcap(path: Path, frames, linktype: int = dpkt.pcap.DLT_EN10MB, nano: bool = False) -> Path:
    with open(path, "wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=linktype, nano=nano)
        for ts, frame in frames:
            writer.writepkt(frame, ts)
    return path


@dataclass
class Streams:
    """Reassembler output checked for consistency and gathered per (stream, direction)."""

    events: list = field(default_factory=list)
    data: dict = field(default_factory=dict)
    gaps: dict = field(default_factory=dict)
    ends: list = field(default_factory=list)
    opened: list = field(default_factory=list)

    def add(self, event) -> None:
        self.events.append(event)
        if isinstance(event, ConnectionOpened):
            self.opened.append(event)
            return
        key = (event.conn.stream, event.direction)
        if isinstance(event, StreamEnd):
            self.ends.append((event.conn.stream, event.direction, event.reason))
            return
        delivered = self.data.setdefault(key, bytearray())
        gaps = self.gaps.setdefault(key, [])
        next_offset = len(delivered) + sum(size for _offset, size in gaps)
        assert event.offset == next_offset, f"{event} does not continue the stream at {next_offset}"
        if isinstance(event, StreamData):
            assert event.data, "empty StreamData"
            delivered += event.data
        else:
            assert event.size > 0
            gaps.append((event.offset, event.size))

    def bytes_of(self, stream: int, direction: int) -> bytes:
        return bytes(self.data.get((stream, direction), b""))


def reassemble(segments, **options) -> Streams:
    reassembler = TcpReassembler(**options)
    streams = Streams()
    for segment in segments:
        for event in reassembler.feed(segment):
            streams.add(event)
    for event in reassembler.flush():
        streams.add(event)
    assert reassembler.open_connections == 0
    return streams


def reassemble_file(path: Path, **options) -> Streams:
    with open_capture(path) as reader:
        streams = reassemble(reader.segments(), **options)
        assert reader.warnings == []
    return streams


def assert_whole_exchange(streams: Streams) -> None:
    assert streams.bytes_of(0, A_TO_B) == CLIENT_BYTES
    assert streams.bytes_of(0, B_TO_A) == SERVER_BYTES
    assert streams.gaps == {(0, A_TO_B): [], (0, B_TO_A): []}
    assert len(streams.opened) == 1
    assert streams.ends[-1] == (0, BOTH, END_FIN)


# ---------------------------------------------------------------- the recorded exchange, rewritten


def test_recorded_exchange_reassembles_exactly(tmp_path):
    streams = reassemble_file(EXCHANGE_PCAP)
    assert_whole_exchange(streams)
    (opened,) = streams.opened
    client = Endpoint("127.0.0.1", opened.conn.a.port)
    assert opened.conn == TcpConnection(0, client, Endpoint("127.0.0.1", SERVER_PORT))
    assert opened.client_guess == client
    assert streams.ends == [(0, A_TO_B, END_FIN), (0, B_TO_A, END_FIN), (0, BOTH, END_FIN)]
    client_pieces = [(e.offset, len(e.data)) for e in streams.events
                     if isinstance(e, StreamData) and e.direction == A_TO_B]
    assert client_pieces == [(0, 300), (300, 300), (600, 1200), (1800, 300), (2100, 65483), (67583, 4517)]
    assert isinstance(streams.events[-1], StreamEnd)


def test_out_of_order_segments_wait_for_the_hole(tmp_path):
    frames = exchange_frames()
    big, tail = frame_index(frames, True, 65483), frame_index(frames, True, 4517)
    first, second = frame_index(frames, True, 300), frame_index(frames, False, 2000)
    tail_ts = frames[tail][0]
    frames[big], frames[tail] = frames[tail], frames[big]
    frames.insert(second, frames.pop(first))  # the first request now comes after a reply
    streams = reassemble_file(write_pcap(tmp_path / "reordered.pcap", frames))
    assert_whole_exchange(streams)
    tail_event = next(e for e in streams.events if isinstance(e, StreamData) and e.offset == 67583)
    assert tail_event.ts == tail_ts  # released data keeps its own capture time


def test_retransmissions_are_delivered_once(tmp_path):
    frames = exchange_frames()
    data_frames = [f for f in frames if tcp_of(f[1]).data]
    doubled = [f for pair in zip(frames, frames) for f in pair] + data_frames  # each twice, data thrice
    streams = reassemble_file(write_pcap(tmp_path / "retransmitted.pcap", doubled))
    assert_whole_exchange(streams)
    assert sum(isinstance(e, StreamData) for e in streams.events) == len(data_frames)


def test_partial_overlaps_are_trimmed(tmp_path):
    frames = exchange_frames()
    i = frame_index(frames, True, 1200)
    ts, frame = frames[i]
    tcp = tcp_of(frame)
    pieces = [(0, 500), (300, 900), (800, 1200), (100, 200)]  # overlapping copies of the same bytes
    frames[i : i + 1] = [
        (ts, rewrite_tcp(frame, seq=(tcp.seq + start) % 2**32, data=tcp.data[start:end]))
        for start, end in pieces
    ]
    streams = reassemble_file(write_pcap(tmp_path / "overlapping.pcap", frames))
    assert_whole_exchange(streams)
    client_pieces = [(e.offset, len(e.data)) for e in streams.events
                     if isinstance(e, StreamData) and e.direction == A_TO_B]
    assert client_pieces[2:5] == [(600, 500), (1100, 400), (1500, 300)]


@pytest.mark.parametrize("client_isn", [2**32 - 1, 2**32 - 3000, 2**32 - 2200])
def test_sequence_numbers_wrap_around(tmp_path, client_isn):
    frames = exchange_frames()
    shift = (client_isn - tcp_of(frames[0][1]).seq) % 2**32
    rewritten = []
    for ts, frame in frames:
        tcp = tcp_of(frame)
        if tcp.dport == SERVER_PORT:
            frame = rewrite_tcp(frame, seq=(tcp.seq + shift) % 2**32)
        elif tcp.flags & ACK:
            frame = rewrite_tcp(frame, ack=(tcp.ack + shift) % 2**32)
        rewritten.append((ts, frame))
    streams = reassemble_file(write_pcap(tmp_path / "wrapped.pcap", rewritten))
    assert_whole_exchange(streams)


def test_capture_starting_mid_stream(tmp_path):
    frames = exchange_frames()
    start = frame_index(frames, True, 1200)  # no handshake, first two requests and replies missing
    streams = reassemble_file(write_pcap(tmp_path / "midstream.pcap", frames[start:]))
    (opened,) = streams.opened
    assert opened.client_guess is None
    assert opened.conn.a.port != SERVER_PORT  # the first segment seen was the client's
    assert streams.bytes_of(0, A_TO_B) == CLIENT_BYTES[600:]
    assert streams.bytes_of(0, B_TO_A) == SERVER_BYTES[2120:]
    assert streams.ends == [(0, A_TO_B, END_FIN), (0, B_TO_A, END_FIN), (0, BOTH, END_FIN)]


def test_mid_stream_segment_older_than_the_first_seen_is_ignored(tmp_path):
    frames = exchange_frames()
    start = frame_index(frames, True, 1200)
    frames = frames[start:]
    later = frame_index(frames, True, 300)
    frames.insert(0, frames.pop(later))  # the capture now begins with the request after it
    streams = reassemble_file(write_pcap(tmp_path / "midstream.pcap", frames))
    assert streams.bytes_of(0, A_TO_B) == CLIENT_BYTES[1800:]
    assert streams.gaps[(0, A_TO_B)] == []


def test_lost_segment_becomes_a_gap_at_the_end(tmp_path):
    frames = exchange_frames()
    del frames[frame_index(frames, True, 1200)]
    streams = reassemble_file(write_pcap(tmp_path / "lost.pcap", frames))
    assert streams.gaps[(0, A_TO_B)] == [(600, 1200)]
    assert streams.bytes_of(0, A_TO_B) == CLIENT_BYTES[:600] + CLIENT_BYTES[1800:]
    assert streams.bytes_of(0, B_TO_A) == SERVER_BYTES
    # Both FINs were seen: the connection ended by FIN although the hole held it to the end.
    assert streams.ends == [(0, B_TO_A, END_FIN), (0, A_TO_B, END_FIN), (0, BOTH, END_FIN)]


def test_lost_segment_given_up_after_max_wait(tmp_path):
    frames = exchange_frames()
    lost = frame_index(frames, True, 1200)
    del frames[lost]
    waiting = next(i for i in range(lost, len(frames))
                   if tcp_of(frames[i][1]).dport == SERVER_PORT and tcp_of(frames[i][1]).data)
    # the capture goes quiet for 5 s after the first segment that waits behind the hole
    frames = [(ts + (5.0 if i > waiting else 0), frame) for i, (ts, frame) in enumerate(frames)]
    streams = reassemble_file(write_pcap(tmp_path / "lost.pcap", frames), max_wait=2.0)
    gap = next(e for e in streams.events if isinstance(e, Gap))
    assert (gap.offset, gap.size) == (600, 1200)
    # declared while the exchange went on, before the big request arrived
    big_data = next(e for e in streams.events if isinstance(e, StreamData) and len(e.data) == 65483)
    assert streams.events.index(gap) < streams.events.index(big_data)
    assert streams.bytes_of(0, A_TO_B) == CLIENT_BYTES[:600] + CLIENT_BYTES[1800:]


# ---------------------------------------------------------------- hand-built segments

CLIENT, SERVER = ("10.0.0.1", 40000), ("10.0.0.2", 9092)


def seg(sender, seq, data=b"", flags=ACK, ts=0.0, missing=0, ack=0) -> TcpSegment:
    receiver = SERVER if sender == CLIENT else CLIENT
    return TcpSegment(ts, sender[0], sender[1], receiver[0], receiver[1], seq, ack, flags, data, missing)


def events_of(segments, **options) -> list:
    reassembler = TcpReassembler(**options)
    return [e for s in segments for e in reassembler.feed(s)] + reassembler.flush()


def summary(events) -> list[tuple]:
    """Events without the connection, for compact exact expectations."""
    out = []
    for e in events:
        if isinstance(e, StreamData):
            out.append(("data", e.direction, e.offset, e.data))
        elif isinstance(e, Gap):
            out.append(("gap", e.direction, e.offset, e.size))
        elif isinstance(e, StreamEnd):
            out.append(("end", e.direction, e.reason))
        elif isinstance(e, LateData):
            out.append(("late", e.direction, e.offset, e.size))
        else:
            out.append(("open", e.conn.stream, e.client_guess))
    return out


CONN = TcpConnection(0, Endpoint(*CLIENT), Endpoint(*SERVER))


def test_handshake_names_the_client_and_offsets_start_after_syn():
    events = events_of([
        seg(CLIENT, 1000, flags=SYN),
        seg(SERVER, 5000, flags=SYN | ACK),
        seg(CLIENT, 1001, b"hello"),
        seg(SERVER, 5001, b"hi"),
        seg(CLIENT, 1006, b"!", flags=ACK | FIN),
        seg(SERVER, 5003, flags=ACK | FIN),
    ])
    assert events[0] == ConnectionOpened(CONN, Endpoint(*CLIENT), 0.0)
    assert summary(events) == [
        ("open", 0, Endpoint(*CLIENT)),
        ("data", A_TO_B, 0, b"hello"),
        ("data", B_TO_A, 0, b"hi"),
        ("data", A_TO_B, 5, b"!"),
        ("end", A_TO_B, END_FIN),
        ("end", B_TO_A, END_FIN),
        ("end", BOTH, END_FIN),
    ]


def test_syn_ack_seen_first_still_names_the_client():
    events = events_of([seg(SERVER, 5000, flags=SYN | ACK), seg(SERVER, 5001, b"x")])
    assert events[0].conn == CONN  # a is the client, the receiver of the SYN-ACK
    assert events[0].client_guess == Endpoint(*CLIENT)
    assert summary(events)[1] == ("data", B_TO_A, 0, b"x")


def test_offsets_continue_across_sequence_wraparound():
    isn = 2**32 - 4
    events = events_of([
        seg(CLIENT, isn, flags=SYN),
        seg(CLIENT, isn + 1, b"0123456789"),  # bytes 3.. have sequence numbers 0..
        seg(CLIENT, (isn + 11) % 2**32, b"abc"),
        seg(CLIENT, (isn + 8) % 2**32, b"789abc"),  # retransmission straddling both
    ])
    assert summary(events)[1:3] == [("data", A_TO_B, 0, b"0123456789"), ("data", A_TO_B, 10, b"abc")]


def test_first_copy_wins_over_later_overlaps():
    events = events_of([
        seg(CLIENT, 100, b"a" * 10),
        seg(CLIENT, 120, b"XXXX"),  # out of order: offsets 20..24
        seg(CLIENT, 110, b"Y" * 20),  # fills the hole and overlaps 20..24 with other bytes
        seg(CLIENT, 125, b"ZZZZZZ"),  # overlaps delivered 25..30, adds 30..31
    ])
    assert summary(events)[1:] == [
        ("data", A_TO_B, 0, b"a" * 10),
        ("data", A_TO_B, 10, b"Y" * 10),
        ("data", A_TO_B, 20, b"XXXX"),
        ("data", A_TO_B, 24, b"Y" * 6),
        ("data", A_TO_B, 30, b"Z"),
        ("end", BOTH, END_CAPTURE),
    ]


def test_buffer_bound_gives_up_the_hole():
    reassembler = TcpReassembler(max_buffered_bytes=100)
    per_segment = [
        summary(reassembler.feed(segment))
        for segment in [seg(CLIENT, 0, b"s"), seg(CLIENT, 11, b"b" * 60), seg(CLIENT, 71, b"c" * 60),
                        seg(CLIENT, 131, b"d")]
    ]
    assert per_segment == [
        [("open", 0, None), ("data", A_TO_B, 0, b"s")],
        [],  # 60 bytes wait behind the hole
        [  # 120 bytes would wait: more than the bound of 100
            ("gap", A_TO_B, 1, 10),
            ("data", A_TO_B, 11, b"b" * 60),
            ("data", A_TO_B, 71, b"c" * 60),
        ],
        [("data", A_TO_B, 131, b"d")],
    ]


def test_wait_bound_gives_up_the_hole_on_any_later_traffic():
    """A hole that showed at 1.5 s is given up once capture time reaches the first whole second after its 2 s
    wait (4.0), before the packet of another connection that brought it there."""
    other = ("10.0.0.3", 40001)
    reassembler = TcpReassembler(max_wait=2.0)
    for segment in [seg(CLIENT, 0, b"s", ts=1.0), seg(CLIENT, 5, b"late", ts=1.5)]:
        reassembler.feed(segment)
    quiet = reassembler.feed(TcpSegment(3.9, *other, *SERVER, 1, 0, ACK, b"x"))
    assert summary(quiet) == [("open", 1, None), ("data", A_TO_B, 0, b"x")]
    given_up = reassembler.feed(TcpSegment(4.2, *other, *SERVER, 2, 0, ACK, b"y"))
    assert summary(given_up) == [("gap", A_TO_B, 1, 4), ("data", A_TO_B, 5, b"late"), ("data", A_TO_B, 1, b"y")]
    assert [e.conn.stream for e in given_up] == [0, 0, 1]
    # the hole showed at 1.5 with the bytes after it: the gap bears that time, as they do
    assert [e.ts for e in given_up] == [1.5, 1.5, 4.2]


def test_tick_gives_up_holes_without_traffic():
    reassembler = TcpReassembler(max_wait=2.0)
    reassembler.feed(seg(CLIENT, 0, b"s", ts=1.0))
    reassembler.feed(seg(CLIENT, 5, b"late", ts=1.0))
    assert reassembler.tick(3.5) == []  # (2 s after the hole, the wait ends at the next whole second)
    given_up = reassembler.tick(4.0)
    assert summary(given_up) == [("gap", A_TO_B, 1, 4), ("data", A_TO_B, 5, b"late")]
    assert [e.ts for e in given_up] == [1.0, 1.0]


def test_reset_waits_for_the_bytes_that_fill_a_hole_before_it():
    # Packets reordered in the capture: the bytes filling the client's hole come after the server's reset.
    events = events_of([
        seg(CLIENT, 0, b"ab"),
        seg(CLIENT, 4, b"ef"),
        seg(SERVER, 0, b"r"),
        seg(SERVER, 1, b"ignored", flags=RST | ACK, ack=6),
        seg(CLIENT, 2, b"cd"),
        seg(CLIENT, 2, b"cdef"),  # a retransmission after the end: delivered bytes, nothing late
        seg(CLIENT, 6, b"gh"),  # beyond the end the reset acknowledged: late
    ])
    assert summary(events) == [
        ("open", 0, None),
        ("data", A_TO_B, 0, b"ab"),
        ("data", B_TO_A, 0, b"r"),
        ("end", B_TO_A, END_RST),
        ("data", A_TO_B, 2, b"cd"),
        ("data", A_TO_B, 4, b"ef"),
        ("end", A_TO_B, END_RST),
        ("end", BOTH, END_RST),
        ("late", A_TO_B, 6, 2),
    ]


def test_reset_waits_for_the_tail_its_sequence_and_acknowledgement_numbers_show():
    # The reset's sequence number says the server sent 5 bytes, its acknowledgement that the client sent 3:
    # the tails of both, captured after the reset, are delivered.
    events = events_of([
        seg(CLIENT, 0, b"a"),
        seg(SERVER, 0, b"xy"),
        seg(SERVER, 5, flags=RST | ACK, ack=3),
        seg(SERVER, 2, b"zzz"),
        seg(CLIENT, 1, b"bc"),
    ])
    assert summary(events) == [
        ("open", 0, None),
        ("data", A_TO_B, 0, b"a"),
        ("data", B_TO_A, 0, b"xy"),
        ("data", B_TO_A, 2, b"zzz"),
        ("end", B_TO_A, END_RST),
        ("data", A_TO_B, 1, b"bc"),
        ("end", A_TO_B, END_RST),
        ("end", BOTH, END_RST),
    ]


def test_reset_gives_up_on_missing_bytes_after_the_wait():
    reassembler = TcpReassembler(max_wait=2.0)
    for segment in [seg(CLIENT, 0, b"ab", ts=1.0), seg(CLIENT, 4, b"ef", ts=1.0),
                    seg(SERVER, 0, flags=RST | ACK, ack=6, ts=1.5)]:
        assert ("end", BOTH, END_RST) not in summary(reassembler.feed(segment))
    assert reassembler.open_connections == 1
    assert summary(reassembler.tick(3.9)) == []
    assert summary(reassembler.tick(4.0)) == [("gap", A_TO_B, 2, 2), ("data", A_TO_B, 4, b"ef"),
                                              ("end", A_TO_B, END_RST), ("end", BOTH, END_RST)]
    assert reassembler.open_connections == 0


def test_reset_with_nothing_missing_ends_the_connection_at_once():
    events = events_of([seg(CLIENT, 0, b"ab"), seg(SERVER, 0, b"r"), seg(SERVER, 1, b"why", flags=RST | ACK, ack=2),
                        seg(CLIENT, 2, b"cd")])
    assert summary(events) == [("open", 0, None), ("data", A_TO_B, 0, b"ab"), ("data", B_TO_A, 0, b"r"),
                               ("end", BOTH, END_RST), ("late", A_TO_B, 2, 2)]


def test_an_endpoint_connected_to_itself_is_one_stream_that_ends_and_can_open_again():
    """TCP lets a socket connect to its own address and port (found by the fuzz campaign: a reset of such a
    connection ended in a KeyError and a traceback). Both ways are one key: its bytes make one stream."""
    itself = ("127.0.0.1", 5000)

    def self_seg(seq, data=b"", flags=ACK, ts=0.0):
        return TcpSegment(ts, *itself, *itself, seq, 0, flags, data, 0)

    reassembler = TcpReassembler()
    segments = [self_seg(0, b"ab"), self_seg(2, b"cd"), self_seg(4, flags=RST, ts=1.0), self_seg(6, b"xy", ts=2.0),
                self_seg(1000, flags=SYN, ts=3.0), self_seg(1001, b"new", ts=3.0)]
    events = [e for s in segments for e in reassembler.feed(s)] + reassembler.flush()
    assert summary(events) == [("open", 0, None), ("data", A_TO_B, 0, b"ab"), ("data", A_TO_B, 2, b"cd"),
                               ("end", BOTH, END_RST), ("late", A_TO_B, 6, 2),
                               ("open", 1, itself), ("data", A_TO_B, 0, b"new"),
                               ("end", BOTH, END_CAPTURE)]
    assert reassembler.open_connections == 0


def test_closed_connections_leave_the_table_and_late_segments_open_nothing():
    reassembler = TcpReassembler(closed_linger=30.0)
    handshake = [
        seg(CLIENT, 10, flags=SYN, ts=1.0), seg(SERVER, 20, flags=SYN | ACK, ts=1.0),
        seg(CLIENT, 11, b"q", flags=ACK | FIN, ts=1.0), seg(SERVER, 21, flags=ACK | FIN, ts=1.0),
    ]
    for segment in handshake:
        reassembler.feed(segment)
    assert reassembler.open_connections == 0
    assert reassembler.feed(seg(CLIENT, 13, ts=2.0)) == []  # the last ACK
    assert reassembler.late_segments == 1
    reopened = reassembler.feed(seg(CLIENT, 500, flags=SYN, ts=3.0))  # a new connection, same ports
    assert summary(reopened) == [("open", 1, Endpoint(*CLIENT))]
    assert reassembler.open_connections == 1


def test_closed_tuple_is_forgotten_after_the_linger_time():
    reassembler = TcpReassembler(closed_linger=30.0)
    for segment in [seg(CLIENT, 1, b"x", flags=ACK | RST, ts=1.0), seg(("10.9.9.9", 1), 1, flags=RST, ts=40.0)]:
        reassembler.feed(segment)
    late = reassembler.feed(seg(CLIENT, 5, b"new", ts=41.0))
    assert summary(late) == [("open", 2, None), ("data", A_TO_B, 0, b"new")]


def test_new_syn_on_an_open_connection_starts_a_new_stream():
    events = events_of([
        seg(CLIENT, 100, flags=SYN),
        seg(CLIENT, 101, b"old"),
        seg(CLIENT, 9000, flags=SYN),
        seg(CLIENT, 9001, b"new"),
    ])
    assert summary(events) == [
        ("open", 0, Endpoint(*CLIENT)),
        ("data", A_TO_B, 0, b"old"),
        ("end", BOTH, END_PORT_REUSED),
        ("open", 1, Endpoint(*CLIENT)),
        ("data", A_TO_B, 0, b"new"),
        ("end", BOTH, END_CAPTURE),
    ]
    assert [e.conn.stream for e in events] == [0, 0, 0, 1, 1, 1]


def test_a_four_tuple_open_again_when_its_close_is_forgotten():
    """A connection reset, its 4-tuple opened again long after (more than closed_linger) while no other connection
    ended in between, then another connection ends: forgetting the first close finds the 4-tuple open again, not
    remembered as closed (a capture merged with itself an hour later ended in a KeyError there)."""
    other = ("10.0.0.3", 40001)
    events = events_of([
        seg(CLIENT, 100, flags=SYN, ts=0.0),
        seg(CLIENT, 101, b"first", ts=0.1),
        seg(CLIENT, 106, flags=RST, ts=0.2),
        TcpSegment(100.0, *other, *SERVER, 1, 0, ACK, b"x"),
        seg(CLIENT, 5000, flags=SYN, ts=100.1),
        seg(CLIENT, 5001, b"again", ts=100.2),
        TcpSegment(100.3, *other, *SERVER, 2, 0, RST, b""),
        seg(CLIENT, 5006, b"!", ts=100.4),
    ])
    assert summary(events) == [
        ("open", 0, Endpoint(*CLIENT)),
        ("data", A_TO_B, 0, b"first"),
        ("end", BOTH, END_RST),
        ("open", 1, None),
        ("data", A_TO_B, 0, b"x"),
        ("open", 2, Endpoint(*CLIENT)),
        ("data", A_TO_B, 0, b"again"),
        ("end", BOTH, END_RST),
        ("data", A_TO_B, 5, b"!"),
        ("end", BOTH, END_CAPTURE),
    ]
    assert [e.conn.stream for e in events] == [0, 0, 0, 1, 1, 2, 2, 1, 2, 2]


def test_snaplen_cut_bytes_become_a_gap_at_once():
    events = events_of([
        seg(CLIENT, 0, b"abc", missing=7),
        seg(CLIENT, 10, b"next"),
        seg(CLIENT, 30, b"far", missing=2),  # out of order: its missing tail waits in line
        seg(CLIENT, 14, b"x" * 16),
    ])
    assert summary(events)[1:] == [
        ("data", A_TO_B, 0, b"abc"),
        ("gap", A_TO_B, 3, 7),
        ("data", A_TO_B, 10, b"next"),
        ("data", A_TO_B, 14, b"x" * 16),
        ("data", A_TO_B, 30, b"far"),
        ("gap", A_TO_B, 33, 2),
        ("end", BOTH, END_CAPTURE),
    ]


def test_flush_gives_up_holes_and_the_data_before_a_fin():
    events = events_of([
        seg(CLIENT, 0, b"ab"),
        seg(CLIENT, 5, b"f", flags=ACK | FIN),  # FIN after a 3-byte hole
        seg(SERVER, 0, b"open"),
    ])
    assert summary(events)[1:] == [
        ("data", A_TO_B, 0, b"ab"),
        ("data", B_TO_A, 0, b"open"),
        ("gap", A_TO_B, 2, 3),
        ("data", A_TO_B, 5, b"f"),
        ("end", A_TO_B, END_FIN),
        ("end", BOTH, END_CAPTURE),
    ]


def test_stream_numbers_follow_first_appearance():
    peers = [("10.0.0.%d" % i, 50000 + i) for i in range(1, 4)]
    segments = [
        TcpSegment(0.0, *peers[1], *SERVER, 0, 0, ACK, b"b"),
        TcpSegment(0.0, *SERVER, *peers[0], 0, 0, ACK, b"a"),
        TcpSegment(0.0, *peers[1], *SERVER, 1, 0, ACK, b"b"),
        TcpSegment(0.0, *peers[2], *SERVER, 0, 0, ACK, b"c"),
    ]
    opened = [e.conn for e in events_of(segments) if isinstance(e, ConnectionOpened)]
    assert opened == [
        TcpConnection(0, Endpoint(*peers[1]), Endpoint(*SERVER)),
        TcpConnection(1, Endpoint(*SERVER), Endpoint(*peers[0])),
        TcpConnection(2, Endpoint(*peers[2]), Endpoint(*SERVER)),
    ]


def test_bare_acks_do_not_fix_the_start_of_a_mid_stream_direction():
    events = events_of([
        seg(CLIENT, 99, ts=1.0),  # keep-alive probe one byte before the next data
        seg(CLIENT, 100, b"data"),
    ])
    assert summary(events)[1] == ("data", A_TO_B, 0, b"data")


def test_idle_connections_are_ended_so_the_table_stays_bounded():
    reassembler = TcpReassembler(idle_timeout=900.0)
    other = ("10.0.0.9", 40001)
    events = reassembler.feed(seg(CLIENT, 1000, b"old", ts=0.0))
    events += reassembler.feed(TcpSegment(0.5, *other, *SERVER, 1, 0, ACK, b"a"))
    # The second connection keeps talking; the first says nothing for more than 15 minutes: it is ended as of the
    # first multiple of 90 s (the idle sweeps' interval) after that, when capture time gets there.
    for t in range(60, 1000, 60):
        events += reassembler.feed(TcpSegment(float(t), *other, *SERVER, 1 + t // 60, 0, ACK, b"b"))
    assert not [e for e in events if isinstance(e, StreamEnd)]
    events += reassembler.feed(TcpSegment(1020.0, *other, *SERVER, 20, 0, ACK, b"b"))
    ends = [e for e in events if isinstance(e, StreamEnd)]
    assert [(e.conn.stream, e.direction, e.reason, e.ts) for e in ends] == [(0, BOTH, "idle", 990.0)]
    assert reassembler.open_connections == 1


@pytest.mark.parametrize("talking", [False, True])
def test_a_connection_silent_past_the_idle_timeout_ends_idle_at_its_next_packet_or_at_the_capture_s_end(talking):
    """Whether a connection ends idle depends on it and on where the capture ends, not on when other connections'
    packets swept the table (every 90 s of capture time): silent for more than idle_timeout, it ends at its own next
    packet if no sweep ended it first, and that packet opens a connection captured from its middle, its bytes
    decoded (an idle connection is not remembered as closed: its packets are not late retransmissions); one silent
    that long when the capture ends ends idle. Before, a packet 901 s after the last went on the same connection
    unless a sweep had come between (with another connection talking: at 990 s), and one after a sweep was late."""
    quiet = ("10.0.0.8", 40002)
    other = ("10.0.0.9", 40001)
    segments = [seg(CLIENT, 1000, b"old", ts=0.0), TcpSegment(0.2, *quiet, *SERVER, 1, 0, ACK, b"q")]
    if talking:  # swept at 0.5, 90.5, ... 900.5
        segments += [TcpSegment(t + 0.5, *other, *SERVER, 1 + t, 0, ACK, b"b") for t in range(0, 901, 90)]
    segments += [seg(CLIENT, 1003, b"new", ts=901.0), seg(CLIENT, 1006, b"end", ts=1000.0)]
    events = events_of(segments, idle_timeout=900.0)
    ends = [(e.conn.stream, e.reason) for e in events if isinstance(e, StreamEnd) and e.direction == BOTH]
    streams = {"client": [0, 3 if talking else 2], "quiet": 1, "other": 2}
    assert ends == [(0, "idle"), (streams["quiet"], "idle")] + [(streams["other"], "capture end")] * talking + [
        (streams["client"][1], "capture end")]
    delivered = [(e.conn.stream, e.data) for e in events if isinstance(e, StreamData)]
    assert (streams["client"][1], b"new") in delivered and (streams["client"][1], b"end") in delivered
    assert not [e for e in events if isinstance(e, LateData)]


def test_connections_that_carry_no_byte_are_crowded_out_the_oldest_first():
    """A SYN flood (or a port scan) opens a connection a packet, each held until the idle timeout: beyond
    max_empty_connections of them open, the oldest are ended (END_CROWDED), not remembered as closed. A connection
    that carried a byte is never crowded out: its response, after the flood, comes on the same connection."""
    reassembler = TcpReassembler(max_empty_connections=100)
    events = reassembler.feed(seg(CLIENT, 1000, b"request", ts=0.0))
    flood = [TcpSegment(0.001 * n, "10.0.1.1", 1024 + n, *SERVER, n, 0, SYN, b"", 0) for n in range(1, 1001)]
    for syn in flood:
        events += reassembler.feed(syn)
        assert reassembler.open_connections <= 101
    events += reassembler.feed(seg(SERVER, 5000, b"response", ts=2.0))
    ended = [e for e in events if type(e) is StreamEnd]
    assert [(e.conn.stream, e.reason) for e in ended] == [(n, END_CROWDED) for n in range(1, 901)]
    assert [(e.conn.stream, e.direction, e.data) for e in events if type(e) is StreamData] == [
        (0, A_TO_B, b"request"), (0, B_TO_A, b"response")]
    # a crowded-out connection that sends bytes later is a connection captured from its middle, not late bytes
    late = reassembler.feed(TcpSegment(3.0, "10.0.1.1", 1025, *SERVER, 2, 0, ACK, b"late", 0))
    assert [type(e) for e in late] == [ConnectionOpened, StreamData] and late[1].data == b"late"
    assert reassembler.open_connections == 102


def test_beyond_the_open_connections_allowed_those_with_fewest_bytes_are_crowded_out():
    """Connections that carried bytes too are kept open up to max_open_connections: beyond, a sixteenth of the limit
    (at least one) are crowded out, those that carried the fewest bytes, then those seen least recently (a flood of
    connections that each send a few bytes does not push out the established ones); bytes one sends later open a
    connection."""
    reassembler = TcpReassembler(max_open_connections=4)
    clients = [("10.0.2.1", 2000 + n) for n in range(6)]
    events = reassembler.feed(TcpSegment(0.0, *clients[0], *SERVER, 1, 0, ACK, b"established", 0))
    for n, client in enumerate(clients[1:4], 1):
        events += reassembler.feed(TcpSegment(float(n), *client, *SERVER, 1, 0, ACK, b"hi", 0))
    events += reassembler.feed(TcpSegment(4.0, *clients[1], *SERVER, 3, 0, ACK, b"!", 0))  # 1 seen lately
    for n, client in enumerate(clients[4:], 5):
        events += reassembler.feed(TcpSegment(float(n), *client, *SERVER, 1, 0, ACK, b"hi", 0))
    assert [(e.conn.a.port, e.reason) for e in events if type(e) is StreamEnd and e.direction == BOTH] == [
        (2002, END_CROWDED), (2003, END_CROWDED)]
    assert reassembler.open_connections == 4
    later = reassembler.feed(TcpSegment(7.0, *clients[2], *SERVER, 3, 0, ACK, b"later", 0))
    assert [type(e) for e in later] == [StreamEnd, ConnectionOpened, StreamData] and later[-1].data == b"later"
    assert later[0].conn.a.port == 2004


def _event_text(event) -> tuple:
    """An event without its connection's stream number (a reassembler numbers only what it sees)."""
    return (type(event).__name__, *(value for name, value in zip(event._fields, event) if name != "conn"),
            event.conn.a, event.conn.b)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(1, 30), st.sampled_from(["data", "rst", "fin"]),
                          st.floats(0, 40), st.booleans()), min_size=1, max_size=40))
def test_a_reassembler_fed_one_connection_ends_its_waits_as_one_fed_the_whole_capture(packets):
    """What a Spark task does (a reassembler per 4-tuple, told the capture's time at each of its packets and at the
    end: fire_next) gives each connection the events a reassembler fed every packet gives it, in the same order
    among all connections' events: holes given up, resets' waits and silences ended as of the same times, before
    the packets of those times (at one time, in the order the connections were opened), and the rest at their
    packets. Three connections send data (lost at random, leaving holes), resets and FINs, capture time stepping
    0-40 s (so that silences pass the idle timeout, here 60 s)."""
    clients = [("10.0.0.1", 40000 + n) for n in range(3)]
    sent = {}  # (client, from the client) -> the bytes sent so far
    segments = []
    ts = 1000.0
    for client, from_client, size, kind, step, lost in packets:
        ts += step
        sender, receiver = (clients[client], SERVER) if from_client else (SERVER, clients[client])
        seq = sent.get((client, from_client), 0) + (0 if from_client else 5000)
        flags = {"data": ACK, "rst": RST | ACK, "fin": FIN | ACK}[kind]
        data = bytes(size) if kind == "data" else b""
        sent[client, from_client] = sent.get((client, from_client), 0) + len(data)
        if not lost:
            segments.append(TcpSegment(ts, *sender, *receiver, seq, 0, flags, data, 0))
    options = dict(idle_timeout=60.0)
    whole = TcpReassembler(**options)
    in_whole = [_event_text(e) for s in segments for e in whole.feed(s)] + [_event_text(e) for e in whole.flush()]
    alone, keyed, opened = {}, [], {}  # per 4-tuple: its reassembler; (key, event); where each connection opened
    clock = -math.inf
    for index, s in enumerate(segments):
        clock = max(clock, s.ts)
        key = frozenset({(s.src, s.sport), (s.dst, s.dport)})
        reassembler = alone.setdefault(key, TcpReassembler(**options))
        while (fired := reassembler.fire_next(clock)) is not None:
            keyed += [((fired[0], -1, opened[e.conn.a, e.conn.b, e.conn.stream]), _event_text(e)) for e in fired[1]]
        for e in reassembler.feed(s):
            opened.setdefault((e.conn.a, e.conn.b, e.conn.stream), index)
            keyed.append(((clock, 0, index), _event_text(e)))
    for key, reassembler in alone.items():
        while (fired := reassembler.fire_next(clock)) is not None:
            keyed += [((fired[0], -1, opened[e.conn.a, e.conn.b, e.conn.stream]), _event_text(e)) for e in fired[1]]
        keyed += [((math.inf, -1, opened[e.conn.a, e.conn.b, e.conn.stream]), _event_text(e))
                  for e in reassembler.flush(clock)]
    assert [text for _, text in sorted(keyed, key=lambda pair: pair[0])] == in_whole


@pytest.mark.parametrize("ts", [1.8e19, 1e15, -1e19])
def test_times_far_out_of_range_neither_hang_nor_overflow_the_sweeps(ts):
    """Hostile capture times (a pcapng's 64-bit stamp counted in seconds reaches 1.8e19 s) with the shortest sweep
    interval: the sweeps' arithmetic stays in range (times are taken within 1e15 s, where a step of the interval
    does not move the product: a quotient is put right by a step at most), and the hole is given up by the end."""
    reassembler = TcpReassembler(max_wait=1e-4)
    events = reassembler.feed(seg(CLIENT, 0, b"a", ts=ts)) + reassembler.feed(seg(CLIENT, 5, b"b", ts=ts))
    events += reassembler.tick(abs(ts) * 2) + reassembler.flush()
    assert ("gap", A_TO_B, 1, 4) in summary(events) and ("data", A_TO_B, 5, b"b") in summary(events)
