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
