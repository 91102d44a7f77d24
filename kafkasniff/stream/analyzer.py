"""TCP segments in, Kafka events out: reassembly, then one Session per connection.

Used alike by `decode` (segments from a file), `sniff` (segments from an
interface) and the Spark pipeline (segments of one connection per task).
"""

from __future__ import annotations

from typing import Iterable, Iterator

from kafkasniff.capture.packets import TcpSegment
from kafkasniff.stream import tcp
from kafkasniff.stream.framing import DEFAULT_MAX_FRAME
from kafkasniff.stream.session import Session

# Ended connections whose sessions are kept, newest first, to name them when bytes of theirs come late.
ENDED_KEPT = 1024


class Analyzer:
    def __init__(self, port_hints: Iterable[int] = (), max_frame: int = DEFAULT_MAX_FRAME,
                 reassembler: tcp.TcpReassembler | None = None):
        self.port_hints = frozenset(port_hints)
        self.max_frame = max_frame
        self.tcp = reassembler or tcp.TcpReassembler()
        self.sessions: dict[int, Session] = {}
        self.ended_sessions: dict[int, Session] = {}  # the last ENDED_KEPT, oldest first
        self.gaps = 0
        self.gap_bytes = 0

    def feed(self, segment: TcpSegment) -> list:
        return self.handle(self.tcp.feed(segment))

    def tick(self, now: float) -> list:
        """Live capture: capture time passes without traffic, so long-waiting holes are given up."""
        return self.handle(self.tcp.tick(now))

    def finish(self) -> list:
        """The capture is over: flush holes and half-finished frames of every connection."""
        return self.handle(self.tcp.flush())

    def run(self, segments: Iterable[TcpSegment]) -> Iterator:
        for segment in segments:
            yield from self.handle(self.tcp.feed(segment))
        yield from self.finish()

    def handle(self, tcp_events: list) -> list:
        """Reassembled TCP events (from this analyzer's reassembler, or another's) in, Kafka events out."""
        out = []
        for ev in tcp_events:
            kind = type(ev)
            if kind is tcp.StreamData:
                out += self.stream_data(ev.conn.stream, ev.direction, ev.data, ev.ts)
            elif kind is tcp.ConnectionOpened:
                self.opened(ev.conn.stream, ev.conn.a, ev.conn.b, ev.client_guess is not None)
            elif kind is tcp.Gap:
                out += self.gap(ev.conn.stream, ev.direction, ev.size, ev.ts)
            elif kind is tcp.StreamEnd and ev.direction == tcp.BOTH:
                out += self.ended(ev.conn.stream, ev.ts)
            elif kind is tcp.LateData:
                out += self.late(ev.conn.stream, ev.direction, ev.offset, ev.size, ev.ts)
        return out

    # One method per kind of TCP event, taking its content: parallel decoding sends events as plain values.

    def opened(self, stream: int, a: tcp.Endpoint, b: tcp.Endpoint, from_start: bool) -> None:
        """A connection opened (from_start: its handshake was captured, and a sent the SYN)."""
        port_hint_client = 0 if b.port in self.port_hints else 1 if a.port in self.port_hints else None
        self.sessions[stream] = Session(stream, (a, b), handshake_client=0 if from_start else None,
                                        port_hint_client=port_hint_client, from_start=(from_start, from_start),
                                        max_frame=self.max_frame)

    def stream_data(self, stream: int, direction: int, data: bytes, ts: float) -> list:
        """Bytes of a connection, in stream order."""
        session = self.sessions.get(stream)
        return session.data(direction, data, ts) if session is not None else []

    def gap(self, stream: int, direction: int, size: int, ts: float) -> list:
        """Bytes of a connection that were never captured."""
        self.gaps += 1
        self.gap_bytes += size
        session = self.sessions.get(stream)
        return session.gap(direction, size, ts) if session is not None else []

    def ended(self, stream: int, ts: float) -> list:
        """Both directions of a connection are over."""
        session = self.sessions.pop(stream, None)
        if session is None:
            return []
        self.ended_sessions[stream] = session
        if len(self.ended_sessions) > ENDED_KEPT:
            del self.ended_sessions[next(iter(self.ended_sessions))]
        return session.end(ts)

    def late(self, stream: int, direction: int, offset: int, size: int, ts: float) -> list:
        """Bytes of an ended connection beyond its end (see tcp.LateData): said, not decoded."""
        session = self.ended_sessions.get(stream)
        return [session.late(direction, offset, size, ts)] if session is not None else []
