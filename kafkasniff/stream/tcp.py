"""Sans-I/O TCP reassembly: feed TcpSegments, get ordered stream events back.

Each connection gets a small stable id (`TcpConnection.stream`, counted from 0 in order of
first appearance, like tshark's tcp.stream) and two directions: A_TO_B from `TcpConnection.a`
to `TcpConnection.b`, and B_TO_A. `a` is the client when the handshake shows it (the sender
of a SYN without ACK), else the sender of the first segment seen.

Per direction, payload comes out in order as StreamData with its absolute stream offset
(0 = first byte after the SYN, or the first byte seen when the capture starts mid-stream).
Out-of-order segments wait for the hole before them; retransmitted and overlapping bytes
are dropped (the first copy wins). A hole that will not fill (too many bytes waiting, or
waiting too long in capture time, or the connection or capture ends) becomes a Gap event
and delivery goes on after it. Bytes a snaplen cut left out become a Gap right away.

Every connection ends with exactly one StreamEnd whose direction is BOTH; a direction that
ends earlier with a FIN gets its own StreamEnd first. Ended connections leave the table;
their 4-tuple is remembered for `closed_linger` seconds so late ACKs and retransmissions
do not open a phantom connection.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from operator import itemgetter
from typing import NamedTuple

from kafkasniff.capture.packets import ACK, FIN, RST, SYN, TcpSegment

A_TO_B, B_TO_A, BOTH = 0, 1, 2

END_FIN = "fin"
END_RST = "rst"
END_CAPTURE = "capture end"
END_PORT_REUSED = "port reused"
END_IDLE = "idle"

_SEQ_MOD = 1 << 32
_SEQ_HALF = 1 << 31


class Endpoint(NamedTuple):
    ip: str
    port: int


class TcpConnection(NamedTuple):
    stream: int
    a: Endpoint
    b: Endpoint


class ConnectionOpened(NamedTuple):
    conn: TcpConnection
    client_guess: Endpoint | None  # None when no SYN was seen
    ts: float


class StreamData(NamedTuple):
    conn: TcpConnection
    direction: int
    offset: int
    data: bytes
    ts: float  # capture time of the segment that carried these bytes


class Gap(NamedTuple):
    conn: TcpConnection
    direction: int
    offset: int
    size: int
    ts: float  # capture time at which the hole was given up on


class StreamEnd(NamedTuple):
    conn: TcpConnection
    direction: int  # A_TO_B, B_TO_A or BOTH
    reason: str  # END_FIN, END_RST, END_CAPTURE, END_PORT_REUSED or END_IDLE
    ts: float


Event = ConnectionOpened | StreamData | Gap | StreamEnd

_piece_start = itemgetter(0)
# StreamData of in-order segments is built by tuple.__new__ (C): a named tuple's own __new__ is a Python call.
_new_tuple = tuple.__new__


class _HalfStream:
    """One direction. `pending` holds non-overlapping (start, end, data, ts) pieces sorted
    by start, all beyond `next`; data None stands for bytes known to be missing."""

    __slots__ = ("base", "syn_seq", "next", "pending", "pending_bytes", "hole_since", "fin", "ended")

    def __init__(self) -> None:
        self.base: int | None = None  # sequence number of stream offset 0
        self.syn_seq: int | None = None
        self.next = 0  # offset of the next byte to deliver
        self.pending: list[tuple[int, int, bytes | None, float]] = []
        self.pending_bytes = 0
        self.hole_since = 0.0
        self.fin: int | None = None  # offset the FIN occupies
        self.ended = False


class _ConnectionState:
    __slots__ = ("conn", "halves", "keys", "last_seen")

    def __init__(self, conn: TcpConnection, keys: tuple[tuple, tuple]) -> None:
        self.conn = conn
        self.halves = (_HalfStream(), _HalfStream())
        self.keys = keys  # table keys of A_TO_B and B_TO_A segments
        self.last_seen = 0.0


class TcpReassembler:
    """Feed segments in capture order with `feed`; call `flush` when the capture ends."""

    def __init__(
        self,
        max_buffered_bytes: int = 8 << 20,
        max_wait: float = 10.0,
        closed_linger: float = 60.0,
        idle_timeout: float = 900.0,
    ) -> None:
        self.max_buffered_bytes = max_buffered_bytes  # per direction, out-of-order bytes held
        self.max_wait = max_wait  # capture seconds a hole may block delivery
        self.closed_linger = closed_linger
        self.late_segments = 0  # segments of already-ended connections, ignored
        self._table: dict[tuple, tuple[_ConnectionState, int]] = {}
        self._closed: dict[tuple, float] = {}  # 4-tuple -> capture time it ended
        self._closed_order: deque[tuple[float, tuple]] = deque()
        self._next_stream = 0
        self._now = 0.0
        self._waiting: dict[_ConnectionState, None] = {}  # connections holding out-of-order bytes
        self._sweep_every = min(1.0, max_wait)
        self._next_sweep = 0.0
        # Connections silent this long (capture time) are ended, so a long capture's table holds only
        # live ones; brokers close idle connections after 10 minutes (connections.max.idle.ms).
        self.idle_timeout = idle_timeout
        self._next_idle_sweep = 0.0

    @property
    def open_connections(self) -> int:
        return len(self._table) // 2

    def feed(self, seg: TcpSegment) -> list[Event]:
        events: list[Event] = []
        ts, src, sport, dst, dport, seq, _, flags, payload, missing = seg
        self._now = ts
        key = (src, sport, dst, dport)
        opening = flags & SYN and not flags & ACK
        entry = self._table.get(key)
        if entry is None:
            if key in self._closed and not opening:
                self.late_segments += 1
                return events
            entry = self._open(key, seg, events)
        state, direction = entry
        state.last_seen = ts
        halves = state.halves
        half = halves[direction]

        if flags & SYN:
            seq = (seq + 1) % _SEQ_MOD
            if half.base is None:
                half.base, half.syn_seq = seq, seg.seq
            elif opening and half.syn_seq != seg.seq:
                self._finish(state, END_PORT_REUSED, events)
                state, direction = self._open(key, seg, events)
                halves = state.halves
                half = halves[direction]
                half.base, half.syn_seq = seq, seg.seq

        if flags & RST:  # any payload of a reset is a diagnostic, not stream data
            self._finish(state, END_RST, events)
            return events
        size = len(payload)
        if size or missing or flags & FIN:
            if half.base is None:  # a bare ACK would not tell where the stream starts
                half.base = seq
            rel = (seq - half.base - half.next) % _SEQ_MOD
            offset = half.next + (rel - _SEQ_MOD if rel >= _SEQ_HALF else rel)
            if flags & FIN and half.fin is None:
                half.fin = offset + size + missing
            if not half.ended:
                self._accept(state.conn, direction, half, offset, payload, missing, ts, events)
                if half.fin is not None:
                    self._end_direction_at_fin(state, direction, half, events)
        if halves[0].pending or halves[1].pending:
            self._enforce_bounds(state, events)
            if halves[0].pending or halves[1].pending:
                self._waiting[state] = None
        if ts >= self._next_sweep:
            self._sweep(events)
        return events

    def tick(self, now: float) -> list[Event]:
        """Let capture time pass without traffic (live capture): holes waiting longer than
        `max_wait` are given up."""
        events: list[Event] = []
        self._now = max(self._now, now)
        self._sweep(events)
        return events

    def flush(self) -> list[Event]:
        """End of capture: give up on every hole and end every open connection."""
        events: list[Event] = []
        for state, direction in list(self._table.values()):
            if direction == A_TO_B:
                self._finish(state, END_CAPTURE, events)
        self._closed.clear()
        self._closed_order.clear()
        return events

    def _open(self, key, seg: TcpSegment, events: list[Event]) -> tuple[_ConnectionState, int]:
        sender, receiver = Endpoint(seg.src, seg.sport), Endpoint(seg.dst, seg.dport)
        flags = seg.flags
        client = None
        if flags & SYN:
            client = receiver if flags & ACK else sender
        a, b = (receiver, sender) if client == receiver else (sender, receiver)
        conn = TcpConnection(self._next_stream, a, b)
        self._next_stream += 1
        reverse = (key[2], key[3], key[0], key[1])
        keys = (key, reverse) if a == sender else (reverse, key)
        state = _ConnectionState(conn, keys)
        self._table[keys[0]] = (state, A_TO_B)
        self._table[keys[1]] = (state, B_TO_A)
        self._closed.pop(key, None)
        self._closed.pop(reverse, None)
        events.append(ConnectionOpened(conn, client, seg.ts))
        return state, (A_TO_B if a == sender else B_TO_A)

    def _accept(self, conn, direction, half, offset, payload, missing, ts, events) -> None:
        nxt = half.next
        data_end = offset + len(payload)
        end = data_end + missing
        if end <= nxt:
            return  # a retransmission of delivered bytes
        if half.pending or offset > nxt:
            if not half.pending:
                half.hole_since = ts
            if data_end > offset:
                self._insert(half, offset, data_end, payload, ts)
            if missing:
                self._insert(half, data_end, end, None, ts)
            self._release(conn, direction, half, ts, events)
            return
        if data_end > nxt:
            data = payload[nxt - offset :] if offset < nxt else payload
            events.append(_new_tuple(StreamData, (conn, direction, nxt, data, ts)))
            nxt = data_end
        if end > nxt:
            events.append(Gap(conn, direction, nxt, end - nxt, ts))
        half.next = end

    def _insert(self, half, start, end, data, ts) -> None:
        """Add [start, end) to the pending pieces, keeping only bytes no piece holds yet."""
        pending = half.pending
        if start < half.next:
            data = data[half.next - start :] if data is not None else None
            start = half.next
        i = bisect_right(pending, start, key=_piece_start)
        if i and pending[i - 1][1] > start:
            covered_to = pending[i - 1][1]
            if covered_to >= end:
                return
            data = data[covered_to - start :] if data is not None else None
            start = covered_to
        while start < end:
            if i < len(pending) and pending[i][0] < end:
                piece_start, piece_end = pending[i][0], pending[i][1]
                if piece_start > start:
                    head = data[: piece_start - start] if data is not None else None
                    pending.insert(i, (start, piece_start, head, ts))
                    if data is not None:
                        half.pending_bytes += piece_start - start
                    i += 1
                if piece_end >= end:
                    return
                data = data[piece_end - start :] if data is not None else None
                start = piece_end
                i += 1
            else:
                pending.insert(i, (start, end, data, ts))
                if data is not None:
                    half.pending_bytes += end - start
                return

    def _release(self, conn, direction, half, ts, events) -> None:
        """Deliver the pending pieces that now continue the stream."""
        pending = half.pending
        nxt = half.next
        released = 0
        for start, end, data, piece_ts in pending:
            if start > nxt:
                break
            released += 1
            if data is None:
                events.append(Gap(conn, direction, nxt, end - nxt, ts))
            else:
                half.pending_bytes -= end - start
                events.append(StreamData(conn, direction, nxt, data[nxt - start :], piece_ts))
            nxt = end
        if released:
            del pending[:released]
            half.next = nxt
            half.hole_since = ts

    def _skip_hole(self, conn, direction, half, ts, events) -> None:
        """Declare the hole before the first pending piece lost and deliver what follows."""
        hole_end = half.pending[0][0]
        events.append(Gap(conn, direction, half.next, hole_end - half.next, ts))
        half.next = hole_end
        self._release(conn, direction, half, ts, events)

    def _sweep(self, events) -> None:
        if self._now >= self._next_idle_sweep:
            self._end_idle(events)
        self._next_sweep = self._now + self._sweep_every
        for state in list(self._waiting):
            self._enforce_bounds(state, events)
            if not (state.halves[0].pending or state.halves[1].pending):
                self._waiting.pop(state, None)

    def _end_idle(self, events) -> None:
        now = self._now
        self._next_idle_sweep = now + self.idle_timeout / 10
        idle = {state for state, _ in self._table.values() if now - state.last_seen > self.idle_timeout}
        for state in sorted(idle, key=lambda st: st.conn.stream):
            self._finish(state, END_IDLE, events)

    def _enforce_bounds(self, state, events) -> None:
        now = self._now
        for direction, half in enumerate(state.halves):
            while half.pending and (
                half.pending_bytes > self.max_buffered_bytes or now - half.hole_since > self.max_wait
            ):
                self._skip_hole(state.conn, direction, half, now, events)
            self._end_direction_at_fin(state, direction, half, events)

    def _end_direction_at_fin(self, state, direction, half, events) -> None:
        if half.fin is not None and not half.ended and half.next >= half.fin and not half.pending:
            half.ended = True
            events.append(StreamEnd(state.conn, direction, END_FIN, self._now))
            if state.halves[1 - direction].ended:
                self._finish(state, END_FIN, events)

    def _finish(self, state, reason, events) -> None:
        """End the connection: give up on its holes, report it ended, drop it from the table."""
        if state.keys[0] not in self._table:
            return
        conn, now = state.conn, self._now
        if reason == END_CAPTURE and state.halves[0].fin is not None and state.halves[1].fin is not None:
            reason = END_FIN  # both sides closed; only holes kept it waiting
        for direction, half in enumerate(state.halves):
            if half.ended:
                continue
            while half.pending:
                self._skip_hole(conn, direction, half, now, events)
            if half.fin is not None:
                if half.fin > half.next:
                    events.append(Gap(conn, direction, half.next, half.fin - half.next, now))
                    half.next = half.fin
                half.ended = True
                events.append(StreamEnd(conn, direction, END_FIN, now))
        events.append(StreamEnd(conn, BOTH, reason, now))
        self._waiting.pop(state, None)
        for key in state.keys:
            del self._table[key]
            self._closed[key] = now
            self._closed_order.append((now, key))
        self._forget_old_closed(now)

    def _forget_old_closed(self, now: float) -> None:
        order, closed = self._closed_order, self._closed
        while order and now - order[0][0] > self.closed_linger:
            ended_at, key = order.popleft()
            if closed.get(key) == ended_at:  # not closed again since
                del closed[key]
