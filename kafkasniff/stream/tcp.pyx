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
ends earlier with a FIN gets its own StreamEnd first. Packets can be reordered in a capture, so
a RST ends its connection at once only when nothing before it can still come: while its sequence
number or acknowledgement shows bytes not seen yet, or holes are open, or (without an
acknowledgement) the other direction's end is unknown, those bytes are still taken, for up to
`max_wait` capture seconds. A FIN ends its direction once the bytes before it came. Ended connections
leave the table; their 4-tuple is remembered for `closed_linger` seconds so late ACKs and
retransmissions do not open a phantom connection, and bytes beyond a direction's end that
come after it ended are reported as LateData, never delivered.

A connection silent for more than `idle_timeout` capture seconds is ended (idle): by a sweep while
the capture goes on, at its own next packet, or at the capture's end, whichever comes first, so that
whether it ended idle depends on it alone and the capture's end. It is not remembered as closed:
what it sends later is traffic, taken as a connection captured from its middle.

Capture time is the latest time of the packets fed so far (a packet's own time may go back). The
waits end at a connection's own packets, or at sweeps: whenever capture time reaches a multiple of
the sweep interval (a second; the idle sweep interval, a tenth of idle_timeout, for idle ones), before
the packet that brought it there, each wait that ended by then is ended as of the first multiple after
its end (a hole's wait, a reset's, a silence's). So when a connection's waits end, and the events that
brings, follow from its own packets and capture time alone: a reassembler fed one connection's packets
(a Spark task's) gives the same with `fire_next`, told the capture time at each packet.
"""

import heapq
from bisect import bisect_right
from collections import deque
from libc.math cimport INFINITY, floor
from operator import itemgetter
from typing import NamedTuple

from kafkasniff.capture.packets import ACK, FIN, RST, SYN, TcpSegment

from kafkasniff.stream.namedtuples cimport named_tuple

A_TO_B, B_TO_A, BOTH = 0, 1, 2

END_FIN = "fin"
END_RST = "rst"
END_CAPTURE = "capture end"
END_PORT_REUSED = "port reused"
END_IDLE = "idle"
END_CROWDED = "crowded out"
# Connections that have not carried a byte (a SYN, a handshake) kept open at most: beyond, the oldest are ended
# (END_CROWDED). A SYN flood or a port scan opens one a packet, each ~1.2 KB held until the idle timeout: 300,000
# SYNs held 360 MB. A connection crowded out is not remembered as closed: bytes it sends later open a connection
# captured from its middle (decoded from there), rather than being late (said, not decoded).
MAX_EMPTY_CONNECTIONS = 16_384
# Connections kept open at most, bytes or not: beyond, a sixteenth of them are crowded out, those that carried the
# fewest bytes, then those seen least recently. Each holds its session (~3.3 KB for one that sent a few bytes:
# 100,000 held 386 MB until they idled out). A capture of more at once is hostile (a flood of connections that each
# send a few bytes, among which the established ones are kept), or a busy hub's.
MAX_OPEN_CONNECTIONS = 65_536
# Ended connections' 4-tuples remembered for closed_linger, at most (two a connection): a port scan answered by
# RSTs ends a connection a packet, and 300,000 remembered for the minute took 347 MB. Beyond, the oldest are
# forgotten (the last 32,768 connections ended are remembered, while they linger: a late ACK comes within
# milliseconds of its connection's end): a late segment of one opens a connection.
MAX_CLOSED_REMEMBERED = 65_536
# Capture seconds of silence after which a connection is ended (END_IDLE): brokers close idle connections after 10
# minutes (connections.max.idle.ms), so a long capture's table holds only live ones.
IDLE_TIMEOUT = 900.0

# Capture times are taken into [-_FAR, _FAR] for the sweeps' arithmetic (a hostile pcapng's time may be 1e19 s)
cdef double _FAR = 1e15
cdef long long SEQ_MOD = 1LL << 32
cdef long long SEQ_HALF = 1LL << 31
cdef long long NO_SEQ = -1  # sequence numbers are 0 ... 2**32 - 1
cdef int F_FIN = FIN, F_SYN = SYN, F_RST = RST, F_ACK = ACK
cdef enum:  # the waits that end at sweeps besides the holes (which are told by their direction, 0 or 1)
    _RESET = 2
    _SILENCE = 3


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
    ts: float  # capture time of the first bytes captured after the hole (of the end, for bytes missing at the end)


class StreamEnd(NamedTuple):
    conn: TcpConnection
    direction: int  # A_TO_B, B_TO_A or BOTH
    reason: str  # END_FIN, END_RST, END_CAPTURE, END_PORT_REUSED, END_IDLE or END_CROWDED
    ts: float


class LateData(NamedTuple):
    """Bytes beyond the end of a direction that had already ended: not delivered."""
    conn: TcpConnection
    direction: int
    offset: int  # stream offset of the first byte beyond the end
    size: int
    ts: float


Event = ConnectionOpened | StreamData | Gap | StreamEnd | LateData
# Here they are made with named_tuple(Kind, values) (namedtuples.pxd): a named tuple's own constructor is a
# Python function, a call of which costs more than the rest of an in-order segment's handling.

_piece_start = itemgetter(0)


cdef class _HalfStream:
    """One direction. `pending` holds non-overlapping (start, end, data, ts) pieces sorted
    by start, all beyond `next`; data None stands for bytes known to be missing."""

    cdef long long base  # sequence number of stream offset 0, NO_SEQ until known
    cdef long long syn_seq  # sequence number of the SYN, NO_SEQ when none was seen
    cdef long long next  # offset of the next byte to deliver
    cdef list pending
    cdef long long pending_bytes
    cdef double hole_since
    cdef bint has_fin
    cdef long long fin  # offset the FIN occupies, when has_fin
    cdef bint ended

    def __cinit__(self):
        self.base = self.syn_seq = NO_SEQ
        self.pending = []


cdef class _ConnectionState:
    cdef object conn
    cdef _HalfStream a_to_b, b_to_a
    cdef tuple keys  # table keys of A_TO_B and B_TO_A segments
    cdef double last_seen
    cdef bint reset  # a RST came while bytes before it were still missing: ends once they came
    cdef double reset_at
    cdef bint carried  # a byte (or a known missing one) came in either direction
    cdef bint finished

    def __cinit__(self, conn, tuple keys):
        self.conn = conn
        self.a_to_b = _HalfStream()
        self.b_to_a = _HalfStream()
        self.keys = keys

    cdef inline _HalfStream half(self, int direction):
        return self.a_to_b if direction == 0 else self.b_to_a

    cdef inline bint waits(self):
        """Holds out-of-order bytes, or waits for the bytes a reset showed missing."""
        return self.reset or bool(self.a_to_b.pending) or bool(self.b_to_a.pending)


cdef class TcpReassembler:
    """Feed segments in capture order with `feed`; call `flush` when the capture ends."""

    cdef readonly long long max_buffered_bytes  # per direction, out-of-order bytes held
    cdef readonly double max_wait  # capture seconds a hole may block delivery
    cdef readonly double closed_linger
    cdef readonly double idle_timeout
    cdef public long long late_segments  # segments of already-ended connections, ignored
    cdef dict _table  # 4-tuple -> (_ConnectionState, direction)
    cdef dict _closed  # 4-tuple -> (capture time it ended, connection, direction, base, end offset)
    cdef object _closed_order  # deque of (capture time, 4-tuple)
    cdef long long _next_stream
    cdef double _now
    cdef dict _waiting  # connections holding out-of-order bytes
    cdef object _empty  # deque of the connections opened, the oldest first, while they may not have carried a byte
    cdef long long _empty_open  # how many of them are open and have not
    cdef readonly long long max_empty_connections, max_open_connections
    cdef double _sweep_every, _idle_every  # the sweeps' intervals
    cdef double _clock  # capture time: the latest time fed
    cdef long long _idle_swept  # the last multiple of the idle sweep interval swept at
    cdef double _next_sweep  # the capture time of the next sweep

    def __init__(
        self,
        long long max_buffered_bytes=8 << 20,
        double max_wait=10.0,
        double closed_linger=60.0,
        double idle_timeout=IDLE_TIMEOUT,
        long long max_empty_connections=MAX_EMPTY_CONNECTIONS,
        long long max_open_connections=MAX_OPEN_CONNECTIONS,
    ):
        self.max_buffered_bytes = max_buffered_bytes
        self.max_wait = max_wait
        self.closed_linger = closed_linger
        self.late_segments = 0
        self._table = {}
        self._closed = {}
        self._closed_order = deque()
        self._next_stream = 0
        self._now = 0.0
        self._waiting = {}
        self._empty = deque()
        self._empty_open = 0
        self.max_empty_connections = max(1, max_empty_connections)
        self.max_open_connections = max(1, max_open_connections)
        self.idle_timeout = idle_timeout
        self._sweep_every = max(min(1.0, max_wait), 1e-3)
        self._idle_every = max(idle_timeout / 10, 1e-3)
        self._clock = -INFINITY
        self._idle_swept = -(1LL << 62)
        self._next_sweep = -INFINITY

    @property
    def open_connections(self) -> int:
        return len(self._table) // 2

    def feed_all(self, list segments) -> list:
        """`feed` each segment of a list (a block of a live capture's ring); the events of all, in order."""
        cdef list events = []
        for seg in segments:
            events += self.feed(seg)
        return events

    def feed(self, seg) -> list:
        cdef list events = []
        cdef double ts
        cdef long long seq, offset, rel, size, missing
        cdef int flags, direction
        cdef bint opening
        cdef _ConnectionState state
        cdef _HalfStream half
        cdef bytes payload
        ts, src, sport, dst, dport, py_seq, _, py_flags, payload, py_missing = seg
        seq, flags, missing = py_seq, py_flags, py_missing
        if ts > self._clock:
            self._clock = ts
            if ts >= self._next_sweep:
                self._sweep(events)
        self._now = ts
        key = (src, sport, dst, dport)
        opening = flags & F_SYN and not flags & F_ACK
        entry = self._table.get(key)
        if entry is not None and (<_ConnectionState>entry[0]).reset and \
                ts - (<_ConnectionState>entry[0]).reset_at > self.max_wait:
            self._finish(entry[0], END_RST, events)  # waited long enough for what the reset showed missing
            entry = None
        elif entry is not None and ts - (<_ConnectionState>entry[0]).last_seen > self.idle_timeout:
            self._finish(entry[0], END_IDLE, events)  # (whether a sweep came in the silence or not)
            entry = None
        if entry is None:
            if not opening:
                closed = self._closed.get(key)
                if closed is not None and ts - closed[0] > self.closed_linger:
                    closed = None  # (lingered its time: forgotten here, whether another's end forgot it yet or not)
                if closed is not None:
                    self.late_segments += 1
                    _, conn, direction, base, end = closed
                    if not flags & F_RST:
                        _report_late(conn, direction, base, end, seq, len(payload) + missing, ts, events)
                    return events
            entry = self._open(key, seg, events)
        state, direction = entry
        state.last_seen = ts
        half = state.half(direction)

        if flags & F_SYN:
            seq = (seq + 1) % SEQ_MOD
            if half.base == NO_SEQ:
                half.base, half.syn_seq = seq, py_seq
            elif opening and half.syn_seq != py_seq:
                self._finish(state, END_PORT_REUSED, events)
                state, direction = self._open(key, seg, events)
                half = state.half(direction)
                half.base, half.syn_seq = seq, py_seq

        if flags & F_RST:  # any payload of a reset is a diagnostic, not stream data
            if not state.reset:
                self._reset(state, direction, seq, seg.ack if flags & F_ACK else None, events)
            return events
        size = len(payload)
        if (size or missing) and not state.carried:
            state.carried = True
            self._empty_open -= 1
        if size or missing or flags & F_FIN:
            if half.base == NO_SEQ:  # a bare ACK would not tell where the stream starts
                half.base = seq
            rel = (seq - half.base - half.next) % SEQ_MOD  # Python's modulo: never negative
            offset = half.next + (rel - SEQ_MOD if rel >= SEQ_HALF else rel)
            if flags & F_FIN and not half.has_fin:
                half.has_fin = True
                half.fin = offset + size + missing
            if not half.ended:
                self._accept(state.conn, direction, half, offset, payload, missing, ts, events)
                if half.has_fin:
                    self._end_direction_at_fin(state, direction, half, events)
            elif size + missing:
                _report_late(state.conn, direction, half.base, half.next, seq, size + missing, ts, events)
        if state.waits():
            self._enforce_bounds(state, events)
            if state.waits():
                self._waiting[state] = None
        return events

    cdef void _reset(self, _ConnectionState state, int direction, long long seq, ack, list events):
        """A RST from `direction`: its sequence number is where that direction ends; its acknowledgement, when
        set, how far the other had come, and without one the other's end is unknown. Bytes before an end that
        were not seen yet may still come later in the capture (packets reordered): wait for them, up to
        max_wait capture seconds; with nothing missing, end now."""
        cdef _HalfStream half = state.half(direction), other = state.half(1 - direction)
        cdef long long sender_end = _offset_of(half, seq)
        cdef bint other_known = ack is not None or other.ended or other.base == NO_SEQ
        cdef long long other_end = _offset_of(other, ack) if ack is not None else other.next
        if sender_end <= half.next and other_known and other_end <= other.next and not state.waits():
            self._finish(state, END_RST, events)
            return
        state.reset = True
        state.reset_at = self._now
        if not half.has_fin:
            half.has_fin = True
            half.fin = max(sender_end, half.next)
        if other_known and not other.has_fin:
            other.has_fin = True
            other.fin = max(other_end, other.next)
        self._waiting[state] = None
        for d in range(2):
            self._end_direction_at_fin(state, d, state.half(d), events)

    def tick(self, double now) -> list:
        """Let capture time pass without traffic (live capture): waits that ended by then are ended (holes given
        up after `max_wait`, at the sweep after)."""
        cdef list events = []
        if now > self._clock:
            self._clock = now
            if now >= self._next_sweep:
                self._sweep(events)
        return events

    cpdef tuple fire_next(self, double clock):
        """For a reassembler fed the packets of some connections only (a Spark task's, of one 4-tuple): the waits of
        its connections that ended by capture time `clock` (that of the next packet it will be fed, which it does
        not see), the earliest first: (the capture time they ended at, their events) for those that ended first,
        or None. Called until None before each packet, and given the capture's time at each, it ends them as a
        reassembler fed every packet of the capture does at its sweeps."""
        cdef _ConnectionState state
        cdef long long until = _index_at(clock, self._sweep_every)
        cdef long long idle_until = _index_at(clock, self._idle_every)
        cdef double first = INFINITY, due
        cdef list states = [entry[0] for entry in self._table.values() if entry[1] == A_TO_B]
        cdef int wait
        for state in states:
            due = self._first_due(state, until, idle_until, &wait)
            if due < first:
                first = due
        if first == INFINITY:
            return None
        cdef list events = []
        until, idle_until = _index_at(first, self._sweep_every), _index_at(first, self._idle_every)
        for state in states:
            self._end_waits(state, until, idle_until, events)
        return first, events

    cpdef double next_sweep_after(self, double clock):
        """The capture time of the first sweep after `clock`: no wait that had not ended by `clock` ends before."""
        return min((_index_at(clock, self._sweep_every) + 1) * self._sweep_every,
                   (_index_at(clock, self._idle_every) + 1) * self._idle_every)

    def flush(self, double end=-INFINITY) -> list:
        """End of capture, at capture time `end` (at the latest fed, when later: a reassembler fed some connections
        only is told where the capture ends): give up on every hole and end every open connection (those silent
        for more than idle_timeout as idle)."""
        cdef list events = []
        cdef _ConnectionState state
        self._now = max(self._clock, end)
        for entry in list(self._table.values()):
            state = entry[0]
            if entry[1] == A_TO_B:
                self._finish(state, END_IDLE if self._now - state.last_seen > self.idle_timeout else END_CAPTURE,
                             events)
        self._closed.clear()
        self._closed_order.clear()
        return events

    cdef tuple _open(self, tuple key, seg, list events):
        cdef _ConnectionState oldest
        while self._empty_open >= self.max_empty_connections and not (seg.payload or seg.missing):  # (else not empty)
            oldest = self._empty.popleft()
            if not oldest.carried and not oldest.finished:
                self._finish(oldest, END_CROWDED, events)
        if self.open_connections >= self.max_open_connections:
            self._crowd_out(events)
        sender, receiver = named_tuple(Endpoint, (seg.src, seg.sport)), named_tuple(Endpoint, (seg.dst, seg.dport))
        cdef int flags = seg.flags
        client = None
        if flags & F_SYN:
            client = receiver if flags & F_ACK else sender
        a, b = (receiver, sender) if client == receiver else (sender, receiver)
        conn = named_tuple(TcpConnection, (self._next_stream, a, b))
        self._next_stream += 1
        reverse = (key[2], key[3], key[0], key[1])
        keys = (key, reverse) if a == sender else (reverse, key)
        state = _ConnectionState(conn, keys)
        # An endpoint connected to itself (TCP allows it) has one key for both ways: its packets are all A_TO_B.
        self._table[keys[1]] = (state, B_TO_A)
        self._table[keys[0]] = (state, A_TO_B)
        self._closed.pop(key, None)
        self._closed.pop(reverse, None)
        self._empty.append(state)
        self._empty_open += 1
        if len(self._empty) > 2 * self._empty_open + 1024:  # (most opened since carried bytes, or ended)
            self._empty = deque(one for one in self._empty if not (<_ConnectionState>one).carried
                                and not (<_ConnectionState>one).finished)
        events.append(named_tuple(ConnectionOpened, (conn, client, seg.ts)))
        return state, (A_TO_B if a == sender else B_TO_A)

    cdef void _accept(self, conn, int direction, _HalfStream half, long long offset, bytes payload,
                      long long missing, double ts, list events):
        cdef long long nxt = half.next
        cdef long long data_end = offset + len(payload)
        cdef long long end = data_end + missing
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
            data = payload[nxt - offset:] if offset < nxt else payload
            events.append(named_tuple(StreamData, (conn, direction, nxt, data, ts)))
            nxt = data_end
        if end > nxt:
            events.append(named_tuple(Gap, (conn, direction, nxt, end - nxt, ts)))
        half.next = end

    cdef void _insert(self, _HalfStream half, long long start, long long end, data, double ts):
        """Add [start, end) to the pending pieces, keeping only bytes no piece holds yet."""
        cdef list pending = half.pending
        cdef long long piece_start, piece_end, covered_to
        cdef Py_ssize_t i
        if start < half.next:
            data = data[half.next - start:] if data is not None else None
            start = half.next
        i = bisect_right(pending, start, key=_piece_start)
        if i and pending[i - 1][1] > start:
            covered_to = pending[i - 1][1]
            if covered_to >= end:
                return
            data = data[covered_to - start:] if data is not None else None
            start = covered_to
        while start < end:
            if i < len(pending) and pending[i][0] < end:
                piece_start, piece_end = pending[i][0], pending[i][1]
                if piece_start > start:
                    head = data[:piece_start - start] if data is not None else None
                    pending.insert(i, (start, piece_start, head, ts))
                    if data is not None:
                        half.pending_bytes += piece_start - start
                    i += 1
                if piece_end >= end:
                    return
                data = data[piece_end - start:] if data is not None else None
                start = piece_end
                i += 1
            else:
                pending.insert(i, (start, end, data, ts))
                if data is not None:
                    half.pending_bytes += end - start
                return

    cdef void _release(self, conn, int direction, _HalfStream half, double ts, list events):
        """Deliver the pending pieces that now continue the stream."""
        cdef list pending = half.pending
        cdef long long nxt = half.next, start, end
        cdef Py_ssize_t released = 0
        for piece in pending:
            start, end = piece[0], piece[1]
            if start > nxt:
                break
            released += 1
            data = piece[2]
            if data is None:  # bytes the capture cut: missing as of their segment's time
                events.append(named_tuple(Gap, (conn, direction, nxt, end - nxt, piece[3])))
            else:
                half.pending_bytes -= end - start
                events.append(named_tuple(StreamData, (conn, direction, nxt, data[nxt - start:], piece[3])))
            nxt = end
        if released:
            del pending[:released]
            half.next = nxt
            half.hole_since = ts

    cdef void _skip_hole(self, conn, int direction, _HalfStream half, double ts, list events):
        """Declare the hole before the first pending piece lost and deliver what follows. The Gap bears the time
        of that piece, when the hole showed, not `ts`, when it was given up on (up to max_wait later): what comes
        after it in the stream is no older than the Gap."""
        first = half.pending[0]
        cdef long long hole_end = first[0]
        events.append(named_tuple(Gap, (conn, direction, half.next, hole_end - half.next, first[3])))
        half.next = hole_end
        self._release(conn, direction, half, ts, events)

    cdef void _sweep(self, list events):
        """Capture time reached the next sweep: end the waits that ended by then (every connection's silence at a
        multiple of the idle sweep interval, those of the connections that wait at every sweep), in the order they
        ended, those that ended at one time in the order the connections were opened (as a reassembler fed one
        connection's packets, told the capture's time, finds them: fire_next)."""
        cdef _ConnectionState state
        cdef long long until = _index_at(self._clock, self._sweep_every)
        cdef long long idle_until = _index_at(self._clock, self._idle_every)
        cdef double at
        cdef int wait = 0
        cdef dict candidates = dict.fromkeys(self._waiting)
        if idle_until > self._idle_swept:
            self._idle_swept = idle_until
            for entry in self._table.values():
                if entry[1] == A_TO_B and _index_after((<_ConnectionState>entry[0]).last_seen + self.idle_timeout,
                                                       self._idle_every) <= idle_until:
                    candidates[entry[0]] = None
        self._next_sweep = min((until + 1) * self._sweep_every, (idle_until + 1) * self._idle_every)
        cdef list due = []  # (the time a wait ended, stream, which wait, connection)
        for state in candidates:
            at = self._first_due(state, until, idle_until, &wait)
            if at < INFINITY:
                due.append((at, state.conn.stream, wait, state))
            elif state.finished or not state.waits():
                self._waiting.pop(state, None)
        heapq.heapify(due)
        while due:
            at, stream, wait, state = heapq.heappop(due)
            self._end_wait(state, at, wait, events)
            at = self._first_due(state, until, idle_until, &wait)
            if at < INFINITY:
                heapq.heappush(due, (at, stream, wait, state))
            elif state.finished or not state.waits():
                self._waiting.pop(state, None)

    cdef double _first_due(self, _ConnectionState state, long long until, long long idle_until, int *wait):
        """The capture time the connection's first wait to end by the sweep intervals' multiples `until` and
        `idle_until` ends at (the first multiple after its end), and which wait (`wait`: _RESET, _SILENCE, or the
        direction of a hole); INFINITY when none does. Of waits ending at one time, a reset's goes first, then the
        silence, then a hole, A_TO_B's first."""
        cdef double first = INFINITY
        cdef long long due
        cdef int direction
        cdef _HalfStream half
        if state.finished:
            return first
        if state.reset:
            due = _index_after(state.reset_at + self.max_wait, self._sweep_every)
            if due <= until:
                first, wait[0] = due * self._sweep_every, _RESET
        due = _index_after(state.last_seen + self.idle_timeout, self._idle_every)
        if due <= idle_until and due * self._idle_every < first:
            first, wait[0] = due * self._idle_every, _SILENCE
        for direction in range(2):
            half = state.half(direction)
            if half.pending:
                due = _index_after(half.hole_since + self.max_wait, self._sweep_every)
                if due <= until and due * self._sweep_every < first:
                    first, wait[0] = due * self._sweep_every, direction
        return first

    cdef void _end_wait(self, _ConnectionState state, double at, int wait, list events):
        """End a wait of the connection as of when it ended (`at`): its hole given up (and the direction ended, if
        its FIN waited for the hole), the end its reset showed missing, its silence."""
        cdef _HalfStream half
        self._now = at
        if wait == _RESET:
            self._finish(state, END_RST, events)
        elif wait == _SILENCE:
            self._finish(state, END_IDLE, events)
        else:
            half = state.half(wait)
            self._skip_hole(state.conn, wait, half, at, events)
            self._end_direction_at_fin(state, wait, half, events)

    cdef void _end_waits(self, _ConnectionState state, long long until, long long idle_until, list events):
        """End the connection's waits that ended by the multiples `until` and `idle_until`, the first first."""
        cdef double at
        cdef int wait = 0
        while not state.finished:
            at = self._first_due(state, until, idle_until, &wait)
            if at == INFINITY:
                break
            self._end_wait(state, at, wait, events)
        if state.finished or not state.waits():
            self._waiting.pop(state, None)

    cdef void _enforce_bounds(self, _ConnectionState state, list events):
        cdef double now = self._now
        cdef _HalfStream half
        cdef int direction
        if state.reset and now - state.reset_at > self.max_wait:
            self._finish(state, END_RST, events)
            return
        for direction in range(2):
            half = state.half(direction)
            while half.pending and (
                half.pending_bytes > self.max_buffered_bytes or now - half.hole_since > self.max_wait
            ):
                self._skip_hole(state.conn, direction, half, now, events)
            self._end_direction_at_fin(state, direction, half, events)

    cdef void _end_direction_at_fin(self, _ConnectionState state, int direction, _HalfStream half, list events):
        if half.has_fin and not half.ended and half.next >= half.fin and not half.pending:
            half.ended = True
            events.append(named_tuple(StreamEnd, (state.conn, direction, END_RST if state.reset else END_FIN,
                                                    self._now)))
            if state.half(1 - direction).ended:
                self._finish(state, END_RST if state.reset else END_FIN, events)

    cdef void _finish(self, _ConnectionState state, str reason, list events):
        """End the connection: give up on its holes, report it ended, drop it from the table."""
        if state.finished:
            return
        state.finished = True
        if not state.carried:
            self._empty_open -= 1
        conn, now = state.conn, self._now
        cdef _HalfStream half
        cdef int direction
        if reason == END_CAPTURE and state.reset:
            reason = END_RST  # only bytes the reset showed missing kept it waiting
        elif reason == END_CAPTURE and state.a_to_b.has_fin and state.b_to_a.has_fin:
            reason = END_FIN  # both sides closed; only holes kept it waiting
        for direction in range(2):
            half = state.half(direction)
            if half.ended:
                continue
            while half.pending:
                self._skip_hole(conn, direction, half, now, events)
            if half.has_fin:
                if half.fin > half.next:
                    events.append(named_tuple(Gap, (conn, direction, half.next, half.fin - half.next, now)))
                    half.next = half.fin
                half.ended = True
                events.append(named_tuple(StreamEnd, (conn, direction, END_RST if state.reset else END_FIN, now)))
        events.append(named_tuple(StreamEnd, (conn, BOTH, reason, now)))
        self._waiting.pop(state, None)
        for direction in range(2):
            key, half = state.keys[direction], state.half(direction)
            if direction == B_TO_A and key == state.keys[A_TO_B]:
                break  # an endpoint connected to itself: its one key is gone already
            del self._table[key]
            if reason != END_CROWDED and reason != END_IDLE:  # (what those send later is not late: see above)
                self._closed[key] = (now, conn, direction, half.base, half.next)
                self._closed_order.append((now, key))
        self._forget_old_closed(now)

    cdef void _crowd_out(self, list events):
        """End a sixteenth of the limit of open connections (at least one), those that carried the fewest bytes, then
        those seen least recently: a sort of them all for each sixteenth of the limit opened, not a structure kept
        in order at every packet."""
        cdef _ConnectionState state
        crowded = sorted((state for state, direction in self._table.values() if direction == A_TO_B),
                         key=_bytes_then_last_seen)[:max(1, self.max_open_connections // 16)]
        for state in crowded:
            self._finish(state, END_CROWDED, events)

    cdef void _forget_old_closed(self, double now):
        order, closed = self._closed_order, self._closed
        while order and (now - order[0][0] > self.closed_linger or len(order) > MAX_CLOSED_REMEMBERED):
            ended_at, key = order.popleft()
            remembered = closed.get(key)  # (gone when the 4-tuple opened again since)
            if remembered is not None and remembered[0] == ended_at:  # not closed again since
                del closed[key]


cdef long long _offset_of(_HalfStream half, long long seq):
    """Stream offset of a sequence number near the direction's next byte (its next byte while the
    direction's start is unknown)."""
    if half.base == NO_SEQ:
        return half.next
    cdef long long rel = (seq - half.base - half.next) % SEQ_MOD
    return half.next + (rel - SEQ_MOD if rel >= SEQ_HALF else rel)


cdef void _report_late(conn, int direction, long long base, long long end, long long seq, long long size,
                       double ts, list events):
    """A segment of a direction that ended at `end`: its bytes beyond the end are LateData (bytes before it
    are retransmissions of delivered ones)."""
    if base == NO_SEQ or size <= 0:
        return
    cdef long long rel = (seq - base - end) % SEQ_MOD
    cdef long long offset = end + (rel - SEQ_MOD if rel >= SEQ_HALF else rel)
    cdef long long start = max(offset, end)
    if offset + size > start:
        events.append(named_tuple(LateData, (conn, direction, start, offset + size - start, ts)))


cdef inline long long _index_at(double t, double every):
    """The multiple of `every` at or before capture time t, as its index (the quotient's rounding put right: a step
    at most, as at 1e15 s a step of 1e-3 s does not move the product)."""
    t = min(max(t, -_FAR), _FAR)
    cdef long long k = <long long>floor(t / every)
    if k * every > t:
        k -= 1
    elif (k + 1) * every <= t:
        k += 1
    return k


cdef inline long long _index_after(double t, double every):
    """The first multiple of `every` after capture time t, as its index."""
    return _index_at(t, every) + 1


def _bytes_then_last_seen(_ConnectionState state):
    return state.a_to_b.next + state.b_to_a.next, state.last_seen, state.conn.stream
