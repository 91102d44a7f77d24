"""Captures that start mid-way: every capture in captures/ started at every packet in turn (every k-th for
the big one), as a capture begun at that moment would be. Whatever the start point:

- every message whose bytes all lie after the start is decoded, with the content it has in the whole
  capture (a response whose request fell before the start is marked inferred, and its bytes must fit the
  schema it really has; where several schemas fit, the one shown may differ);
- nothing else is decoded as a message (no frame found inside another);
- per connection and direction, the bytes shown as messages, tokens or notices add up to the bytes captured.

The captures hold every connection from its handshake and no retransmission (checked), so each byte of a
direction is carried by exactly one packet, and stream offsets of the whole capture are sequence numbers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from capture_manifest import capture_names, load_capture
from pcapkit import TcpConversation, write_pcap
from kafkasniff.capture.files import open_capture
from kafkasniff.capture.packets import SYN, TcpSegment
from kafkasniff.protocol.identify import response_fits
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.session import CLIENT_TO_SERVER, MessageEvent, NoticeEvent, SaslTokenEvent

# The 2 MB capture is started at every 4th packet: every packet would take most of a minute.
STEP = {"confluent_codecs": 4}
NOT_CAPTURED = "missing"  # the notice of bytes a hole left out: not part of what was captured

Direction = tuple[tuple[str, int], tuple[str, int]]  # (sender, receiver)


def segments(name: str) -> list[TcpSegment]:
    with open_capture(load_capture(name).pcap) as reader:
        return list(reader.segments())


def decode(segs: list[TcpSegment]) -> list:
    return list(Analyzer().run(segs))


def direction_of(ev) -> Direction:
    if type(ev) is MessageEvent:
        return tuple(ev.src), tuple(ev.dst)
    conn = ev.conn
    client, server = tuple(conn.client), tuple(conn.server)
    return (client, server) if ev.direction == CLIENT_TO_SERVER else (server, client)


def summary(ev: MessageEvent) -> tuple:
    m = ev.message
    return (m.kind, m.api_key, m.api_version, m.correlation_id, m.client_id, m.size, m.malformed,
            m.trailing.length if m.trailing else 0, m.errors, m.acks, m.mentions, m.batches, m.records)


@dataclass
class WholeCapture:
    segments: list[TcpSegment]
    messages: list[MessageEvent]
    first_packet: dict[int, int]  # id of a message -> index of the packet carrying its first byte


def whole(name: str) -> WholeCapture:
    segs = segments(name)
    isn = {(s.src, s.sport, s.dst, s.dport): s.seq for s in segs if s.flags & SYN}
    carried: dict[Direction, list[tuple[int, int, int]]] = {}  # (first offset, end offset, packet index)
    for i, s in enumerate(segs):
        if s.payload:
            key = ((s.src, s.sport), (s.dst, s.dport))
            offset = (s.seq - isn[s.src, s.sport, s.dst, s.dport] - 1) % 2**32
            carried.setdefault(key, []).append((offset, offset + len(s.payload), i))
    for pieces in carried.values():
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), "a retransmission or a hole"
    messages = [ev for ev in decode(segs) if type(ev) is MessageEvent]
    first_packet = {}
    for ev in messages:
        first_packet[id(ev)] = next(i for start, end, i in carried[direction_of(ev)] if end > ev.stream_offset)
    return WholeCapture(segs, messages, first_packet)


def fitting(payload: bytes) -> set[tuple[int, int]]:
    return set(response_fits(payload).fits)


def starts(name: str, count: int) -> list[int]:
    return list(range(1, count, STEP.get(name, 1)))


@pytest.mark.parametrize("name", capture_names())
def test_started_at_any_packet_nothing_wholly_captured_is_lost(name):
    capture = whole(name)
    problems = []
    for start in starts(name, len(capture.segments)):
        suffix = capture.segments[start:]
        events = decode(suffix)
        found: dict[tuple, list[MessageEvent]] = {}
        shown: Counter[Direction] = Counter()
        for ev in events:
            kind = type(ev)
            if kind is MessageEvent:
                found.setdefault((direction_of(ev), ev.payload), []).append(ev)
                shown[direction_of(ev)] += 4 + len(ev.payload)
            elif kind is SaslTokenEvent:
                shown[direction_of(ev)] += 4 + len(ev.token)
            elif kind is NoticeEvent and ev.size and ev.kind != NOT_CAPTURED:
                shown[direction_of(ev)] += ev.size
        for ev in capture.messages:
            if capture.first_packet[id(ev)] < start:
                continue
            matches = found.get((direction_of(ev), ev.payload))
            if not matches:
                problems.append(f"start {start}: lost {ev.message!r}")
                continue
            got = matches.pop(0)
            if not got.inferred:
                if summary(got) != summary(ev):
                    problems.append(f"start {start}: {ev.message!r} decoded as {got.message!r}")
            elif (ev.message.api_key, ev.message.api_version) not in fitting(got.payload):
                problems.append(f"start {start}: inferred {got.message!r} but it is {ev.message!r}")
        problems += [f"start {start}: {ev.message!r} is not a message of the whole capture"
                     for extra in found.values() for ev in extra]
        captured = Counter()
        for s in suffix:
            captured[(s.src, s.sport), (s.dst, s.dport)] += len(s.payload)
        captured = +captured
        if shown != captured:
            problems.append(f"start {start}: bytes shown {dict(shown)} != bytes captured {dict(captured)}")
        if len(problems) > 20:
            break
    assert problems == []


# Captures whose consumers fetch with versions that size a partition's records by an int32 (Fetch v4-v11)
RECORDS_BY_INT32 = ("aiokafka_codecs", "rebalance_aiokafka")
SMALL_MSS = 100  # packets this small put a start point inside every response


@pytest.mark.parametrize("name", RECORDS_BY_INT32)
def test_started_inside_a_fetch_response_its_records_are_not_read_as_a_frame(name, tmp_path):
    """The capture's conversations sent again in packets of SMALL_MSS bytes and started at every packet. A Fetch
    response's last partition ends with its records' int32 length and then the records, to the response's end: read
    as a size prefix, it claims exactly the bytes up to the next response, and a single batch at base offset 0 reads
    as correlation id 0 and a SaslAuthenticate v0 response that fits (found on a capture cut by tcpdump -C inside a
    2 MB Fetch v11 response). Whatever the start, nothing is decoded that is not a message of the whole capture,
    and every message whose first packet is at or after the start is."""
    frames = []  # (direction, payload, index of the packet carrying its first byte)
    packets = []
    by_connection: dict[int, list[MessageEvent]] = {}
    for ev in whole(name).messages:
        by_connection.setdefault(id(ev.conn), []).append(ev)
    for n, events in enumerate(by_connection.values()):
        conn = events[0].conn
        conversation = TcpConversation(tuple(conn.client), tuple(conn.server), start=1_700_000_000.0 + n,
                                       mss=SMALL_MSS)
        for ev in events:
            frames.append((direction_of(ev), ev.payload, len(packets) + len(conversation.packets)))
            conversation.send(ev.direction == CLIENT_TO_SERVER, len(ev.payload).to_bytes(4, "big") + ev.payload)
        packets += conversation.close()
    with open_capture(write_pcap(tmp_path / "small.pcap", packets)) as reader:
        segs = list(reader.segments())
    assert len(segs) == len(packets)
    known = {(direction, payload) for direction, payload, _ in frames}
    problems = []
    for start in range(1, len(segs)):
        found = Counter((direction_of(ev), ev.payload) for ev in decode(segs[start:]) if type(ev) is MessageEvent)
        problems += [f"start {start}: {size} bytes decoded as a message the capture does not have"
                     for (direction, payload) in found if (direction, payload) not in known
                     for size in [len(payload)]]
        problems += [f"start {start}: lost a message of {len(payload)} bytes" for direction, payload, first in frames
                     if first >= start and not found[direction, payload]]
        if len(problems) > 20:
            break
    assert problems == []
