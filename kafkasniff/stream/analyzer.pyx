# cython: language_level=3
"""TCP segments in, Kafka events out: reassembly, then one Session per connection.

Used alike by `decode` (segments from a file), `sniff` (segments from an
interface) and the Spark pipeline (segments of one connection per task).

A connection's first bytes tell TLS from plaintext: a TLS connection's records are
decrypted with the key log's secrets (stream/tls.py) and their plaintext goes to a
Session as any connection's bytes do. The analyzer then calls the connection's
handler directly, so that plaintext pays nothing for TLS.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from kafkasniff.capture.packets import TcpSegment
from kafkasniff.stream import tcp
from kafkasniff.stream.framing import DEFAULT_MAX_FRAME
from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.session import NOT_DECODED, KafkaConnection, NoticeEvent
from kafkasniff.stream.tlsrecord import record_boundary, starts_tls

from kafkasniff.stream.session cimport Session

StreamData = tcp.StreamData

# Ended connections whose sessions are kept, newest first, to name them when bytes of theirs come late.
ENDED_KEPT = 1024


cdef class Analyzer:
    """(Attributes in analyzer.pxd.)"""

    def __init__(self, port_hints: Iterable[int] = (), max_frame: int = DEFAULT_MAX_FRAME,
                 reassembler: tcp.TcpReassembler | None = None, keylog: KeyLog | None = None):
        self.port_hints = frozenset(port_hints)
        self.max_frame = max_frame
        self.tcp = reassembler or tcp.TcpReassembler()
        self.keylog = keylog if keylog is not None else KeyLog()
        self.sessions = {}
        self.tls_sessions = {}
        self.ended_sessions = {}
        self.gaps = 0
        self.gap_bytes = 0

    def feed(self, segment: TcpSegment) -> list:
        return self.handle(self.tcp.feed(segment))

    def feed_all(self, segments: list[TcpSegment]) -> list:
        return self.handle(self.tcp.feed_all(segments))

    def tick(self, now: float) -> list:
        """Live capture: capture time passes without traffic, so long-waiting holes are given up, and TLS
        records waiting for their keys are decrypted once the key log has them."""
        return self.handle(self.tcp.tick(now)) + self.poll_tls(now)

    def poll_tls(self, now: float) -> list:
        """TLS records waiting for their keys, decrypted if a followed key log has them now."""
        out = []
        if self.keylog.follow and self.tls_sessions:
            self.keylog.refresh()
            for session in list(self.tls_sessions.values()):
                if session.tls.waiting:
                    out += session.poll(now)
        return out

    def finish(self) -> list:
        """The capture is over: flush holes and half-finished frames of every connection."""
        return self.handle(self.tcp.flush())

    def run(self, segments: Iterable[TcpSegment]) -> Iterator:
        for segment in segments:
            yield from self.handle(self.tcp.feed(segment))
        yield from self.finish()

    def handle(self, list tcp_events) -> list:
        """Reassembled TCP events (from this analyzer's reassembler, or another's) in, Kafka events out."""
        cdef list out = []
        cdef tuple data
        stream_data = StreamData
        for ev in tcp_events:
            kind = type(ev)
            if kind is stream_data:  # (conn, direction, offset, data, ts): most events, read by index
                data = <tuple>ev
                out += self.stream_data((<tuple>data[0])[0], data[1], data[3], data[4])
            elif kind is tcp.ConnectionOpened:
                self.opened(ev.conn.stream, ev.conn.a, ev.conn.b, ev.client_guess is not None)
            elif kind is tcp.Gap:
                out += self.gap(ev.conn.stream, ev.direction, ev.size, ev.ts)
            elif kind is tcp.StreamEnd and ev.direction == tcp.BOTH:
                out += self.ended(ev.conn.stream, ev.ts, ev.reason)
            elif kind is tcp.LateData:
                out += self.late(ev.conn.stream, ev.direction, ev.offset, ev.size, ev.ts)
        return out

    # One method per kind of TCP event, taking its content: parallel decoding sends events as plain values.

    def opened(self, stream: int, a: tcp.Endpoint, b: tcp.Endpoint, from_start: bool) -> None:
        """A connection opened (from_start: its handshake was captured, and a sent the SYN)."""
        self.sessions[stream] = _FirstBytes(self, stream, (a, b), from_start)

    def _port_hint_client(self, endpoints: tuple) -> int | None:
        """The side a broker port hint makes the client, if any."""
        a, b = endpoints
        return 0 if b.port in self.port_hints else 1 if a.port in self.port_hints else None

    def plaintext_session(self, stream: int, endpoints: tuple, from_start: bool) -> Session:
        session = self.sessions[stream] = Session(
            stream, endpoints, handshake_client=0 if from_start else None,
            port_hint_client=self._port_hint_client(endpoints), from_start=(from_start, from_start),
            max_frame=self.max_frame)
        return session

    def tls_session(self, stream: int, endpoints: tuple, from_start: bool) -> TlsSession:
        likely_client = 0 if from_start else self._port_hint_client(endpoints) or 0
        session = self.sessions[stream] = self.tls_sessions[stream] = TlsSession(
            stream, endpoints, (from_start, from_start), self.keylog, self.max_frame, likely_client)
        return session

    cpdef list stream_data(self, stream, int direction, bytes data, double ts):
        """Bytes of a connection, in stream order."""
        session = self.sessions.get(stream)
        if session is None:
            return []
        if type(session) is Session:  # most connections' bytes, once their first are in: a C call
            return (<Session>session).data(direction, data, ts)
        return session.data(direction, data, ts)

    def gap(self, stream: int, direction: int, size: int, ts: float) -> list:
        """Bytes of a connection that were never captured."""
        self.gaps += 1
        self.gap_bytes += size
        session = self.sessions.get(stream)
        return session.gap(direction, size, ts) if session is not None else []

    def ended(self, stream: int, ts: float, reason: str) -> list:
        """Both directions of a connection are over (reason: why, tcp.END_*)."""
        session = self.sessions.pop(stream, None)
        if session is None:
            return []
        self.tls_sessions.pop(stream, None)
        self.ended_sessions[stream] = session
        if len(self.ended_sessions) > ENDED_KEPT:
            del self.ended_sessions[next(iter(self.ended_sessions))]
        return session.end(ts, reason)

    def late(self, stream: int, direction: int, offset: int, size: int, ts: float) -> list:
        """Bytes of an ended connection beyond its end (see tcp.LateData): said, not decoded."""
        session = self.ended_sessions.get(stream)
        return [session.late(direction, offset, size, ts)] if session is not None else []


class _FirstBytes:
    """A connection before its first bytes: they say whether it is TLS. Holes before them wait for the choice."""

    __slots__ = ("analyzer", "stream", "endpoints", "from_start", "gaps")

    def __init__(self, analyzer: Analyzer, stream: int, endpoints: tuple, from_start: bool):
        self.analyzer = analyzer
        self.stream = stream
        self.endpoints = endpoints
        self.from_start = from_start
        self.gaps: list[tuple[int, int, float]] = []

    def data(self, side: int, data: bytes, ts: float) -> list:
        analyzer = self.analyzer
        tls = starts_tls(data, self.from_start) or not self.from_start and record_boundary(data) is not None
        make = analyzer.tls_session if tls else analyzer.plaintext_session
        session = make(self.stream, self.endpoints, self.from_start)
        out = []
        for gap in self.gaps:
            out += session.gap(*gap)
        return out + session.data(side, data, ts)

    def gap(self, side: int, size: int, ts: float) -> list:
        self.gaps.append((side, size, ts))
        return []

    def end(self, ts: float, reason: str) -> list:
        # Ended, it takes no more bytes (late ones are only said), and it stays among its analyzer's ended sessions:
        # its reference to the analyzer would make a cycle that only the collector frees (a Spark decode task makes
        # an analyzer per connection: of 150,000 connections that sent no byte, 43 % of its time went to collecting).
        self.analyzer = None
        return []

    def late(self, side: int, offset: int, size: int, ts: float) -> NoticeEvent:
        return _without_bytes(self.stream, self.endpoints).late(side, offset, size, ts)


def _without_bytes(stream: int, endpoints: tuple) -> Session:
    """An ended session that was given no bytes: it reports what comes after a connection's end."""
    session = Session(stream, endpoints)
    session.end(0.0, tcp.END_FIN)  # the reason tells only of requests waiting: it has none
    return session


class TlsSession:
    """A TLS connection: its records decrypted (stream/tls.py), their plaintext decoded by a Session. Says once
    why it is not decrypted, if it is not, and at its end how many bytes TLS took (handshake, record headers
    and tags; all of them when nothing was decrypted), so that every byte captured is accounted for."""

    def __init__(self, stream: int, endpoints: tuple, from_start: tuple[bool, bool], keylog: KeyLog,
                 max_frame: int, likely_client: int = 0):
        """likely_client: the side taken for the client until the handshake (or decrypted records) tell."""
        self.stream = stream
        self.likely_client = likely_client
        self.endpoints = endpoints
        self.from_start = from_start
        self.max_frame = max_frame
        from kafkasniff.stream.tls import TlsConnection  # with cryptography: imported by the first TLS connection

        self.tls = TlsConnection(keylog, from_start)
        self.session: Session | None = None
        self.reported = False

    def data(self, side: int, data: bytes, ts: float) -> list:
        return self._decoded(self.tls.data(side, data), ts)

    def gap(self, side: int, size: int, ts: float) -> list:
        self.tls.gap(side, size)
        out = self._decoded([], ts)
        if self.session is not None and self.tls.failure is None:
            out += self._marked(self.session.gap(side, size, ts))
        return out

    def poll(self, ts: float) -> list:
        return self._decoded(self.tls.poll(), ts)

    def end(self, ts: float, reason: str) -> list:
        out = self._decoded(self.tls.end(), ts)
        if self.session is not None:
            out += self._marked(self.session.end(ts, reason))
        conn = self._connection()
        client = self._client_side()
        for side in (client, 1 - client):
            direction = self.tls.sides[side]
            taken = direction.captured - direction.delivered
            if taken:
                text = ("TLS: handshake, record headers and authentication tags" if direction.delivered else
                        f"TLS: encrypted bytes, {NOT_DECODED}")
                out.append(NoticeEvent(conn, "c2s" if side == client else "s2c", ts, "tls", text, 0, taken))
        return out

    def late(self, side: int, offset: int, size: int, ts: float) -> NoticeEvent:
        return (self.session or _without_bytes(self.stream, self.endpoints)).late(side, offset, size, ts)

    def _decoded(self, pieces: list, ts: float) -> list:
        out = []
        for side, plaintext in pieces:
            if self.session is None:
                self.session = Session(self.stream, self.endpoints, client_side=self._client_side(),
                                       from_start=self.from_start, max_frame=self.max_frame)
            out += self.session.data(side, plaintext, ts)
        if self.tls.failure is not None and not self.reported:
            self.reported = True
            out.append(NoticeEvent(self._connection(), None, ts, "tls",
                                   f"{self.tls.description()}: {NOT_DECODED}: {self.tls.failure}"))
        return self._marked(out) if out else out

    def _marked(self, events: list) -> list:
        info = self.tls.info
        for ev in events:
            if ev.conn is not None:
                ev.conn.tls = info
        return events

    def _client_side(self) -> int:
        side = self.tls.client_side
        return side if side is not None else self.likely_client

    def _connection(self) -> KafkaConnection:
        client = self._client_side()
        conn = KafkaConnection(self.stream, self.endpoints[client], self.endpoints[1 - client])
        conn.tls = self.tls.info
        return conn
