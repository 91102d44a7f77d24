# cython: language_level=3
"""Decode a Spark partition of TCP segments into table rows (runs on Spark workers).

The partition's segments come sorted by (connection key, time reached, file, index in the file),
as Arrow batches (see `reading`); every run of one key (one TCP 4-tuple, both directions) goes
through its own TcpReassembler and Analyzer, the code behind `decode`, which sees the
packets as it would in one capture merged from all the inputs. One 4-tuple can hold several
connections one after another (a port reused with a new SYN, or reused after a close); each
gets its own row. A packet found, identical and at the same time, in several inputs (inputs
that overlap) is fed once, in the place each file holding it gives it (_tie_order).

The reassembler sees only this 4-tuple's packets, while `decode`'s sees every packet of the
capture and ends waits (a hole given up, a reset's wait, a silence) at its sweeps, whenever
capture time passes a whole second: each row carries the time the capture had reached, and
before each packet (and at the capture's end, which the reads tell) the waits that ended by
then are ended as of the same times (TcpReassembler.fire_next), what they release keyed before
the packets of that time, in the order the connections were opened. What differs: the limits on
connections kept open (a flood of them) are the whole capture's in `decode`, not a 4-tuple's.

Compiled: every segment of the run and every message passes through these loops, and in Python
they (a TcpSegment made per row, per-segment counts, a row per message) cost three times what
decoding the bytes did.
"""

import hashlib
import heapq

from libc.math cimport INFINITY

import pyarrow as pa

from kafkasniff.analyses.wire import plain_seen
from kafkasniff.capture.packets import TcpSegment
from kafkasniff.engine.heap import collecting_rarely
from kafkasniff.pipeline.analysis import (AT_THE_END, BEFORE_THE_PACKETS, IN_A_PACKET, STAGED_NAME, StagedSeen,
                                          files_left)
from kafkasniff.pipeline.reading import key_endpoints
from kafkasniff.pipeline.tables import CONNECTIONS, MESSAGES, RECORDS
from kafkasniff.pipeline.writing import StagedTables
from kafkasniff.render.output import Output, OutputOptions
from kafkasniff.stream import tcp
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.session import endpoint_text

from kafkasniff.pipeline.rows cimport MessageColumns, RecordColumns, micros
from kafkasniff.protocol.messages cimport Message
from kafkasniff.stream.namedtuples cimport named_tuple
from kafkasniff.stream.session cimport KafkaConnection, MessageEvent

_CONNECTION_NAMES = CONNECTIONS.raw_names
# What a decode task tells the job, one row per connection, topic id learned and staged file: the rest of
# what it decoded is in the staged files.
# `first_reached`: the time its file had reached at the connection's first packet (reading.SEGMENT_SCHEMA), in
# microseconds; `first_copies`: where each file holding that packet holds it, when several do ([file, index, ...]),
# to number connections opened at one time as those files order them (build.connection_order).
RUN_FACTS_DDL = ("connection_id string, first_reached bigint, first_file int, first_index bigint, "
                 "first_copies array<bigint>, topic_id string, topic_name string, table_name string, staged string, "
                 "rows bigint")
RUN_FACTS_SCHEMA = pa.schema([("connection_id", pa.string()), ("first_reached", pa.int64()),
                              ("first_file", pa.int32()), ("first_index", pa.int64()),
                              ("first_copies", pa.list_(pa.int64())),
                              ("topic_id", pa.string()), ("topic_name", pa.string()), ("table_name", pa.string()),
                              ("staged", pa.string()), ("rows", pa.int64())])

# Segments and TCP events are named tuples, made (named_tuple) and read here as tuples: a named tuple's constructor
# and its attributes are Python calls.
cdef object _StreamData = tcp.StreamData, _ConnectionOpened = tcp.ConnectionOpened, _Gap = tcp.Gap
cdef object _StreamEnd = tcp.StreamEnd
cdef int _BOTH = tcp.BOTH


def connection_id(a: tcp.Endpoint, b: tcp.Endpoint, first_seen: float) -> str:
    low, high = sorted((endpoint_text(a), endpoint_text(b)))
    return hashlib.blake2b(f"{low} {high} {micros(first_seen)}".encode(), digest_size=8).hexdigest()


cdef class _Tally:
    """What the connections table says about one TCP connection."""

    cdef readonly str id
    cdef object conn
    cdef double first_seen, last_seen
    cdef bint handshake
    cdef long long packets, gaps, gap_bytes, requests, responses
    cdef long long bytes[2]  # by TCP direction: A_TO_B, B_TO_A
    cdef object end_reason
    cdef list file_spans  # [file number, first ts, last ts] in feed order
    cdef object client
    cdef dict client_ids
    cdef object tls  # {"version", "cipher"} of a TLS connection, once its handshake is seen
    cdef tuple first_packet  # (time reached, file number, index in the file)
    cdef object first_copies  # [file, index, ...] of every file holding the first packet, when several do; else None
    # The texts of a Kafka connection's client and server (endpoint_text), made once for its messages' rows
    cdef KafkaConnection named
    cdef str client_text, server_text

    def __init__(self, opened, tuple first_packet, first_copies):
        conn, client_guess, ts = <tuple>opened  # a ConnectionOpened
        self.conn = conn
        self.id = connection_id(conn[1], conn[2], ts)
        self.first_seen = self.last_seen = ts
        self.handshake = client_guess is not None
        self.bytes[0] = self.bytes[1] = 0
        self.end_reason = tcp.END_CAPTURE
        self.file_spans = []
        self.client_ids = {}
        self.first_packet = first_packet
        self.first_copies = first_copies

    cdef void count_packet(self, double ts, int file):
        self.packets += 1
        if ts > self.last_seen:
            self.last_seen = ts
        cdef list spans = self.file_spans
        cdef list last
        if spans:
            last = spans[len(spans) - 1]
            if last[0] == file:
                if ts > last[2]:
                    last[2] = ts
                return
        spans.append([file, ts, ts])

    cdef list files_between(self, double first_ts, double last_ts):
        cdef list spans = self.file_spans
        if len(spans) == 1:
            return [spans[0][0]]
        files = [file for file, lo, hi in spans if lo <= last_ts and hi >= first_ts]
        return list(dict.fromkeys(files)) if files else [spans[len(spans) - 1][0]]

    cdef tuple sender_and_receiver(self, MessageEvent ev):
        """The message's src and dst as endpoint_text gives them."""
        cdef KafkaConnection conn = ev.conn
        if conn is not self.named:
            self.named = conn
            self.client_text, self.server_text = endpoint_text(conn.client), endpoint_text(conn.server)
        if ev.direction == "c2s":
            return self.client_text, self.server_text
        return self.server_text, self.client_text

    def row(self, file_names: list) -> dict:
        a, b = self.conn[1], self.conn[2]
        client_is_a = self.client is None or self.client == a
        client, server = (a, b) if client_is_a else (b, a)
        to_server, to_client = (self.bytes[0], self.bytes[1]) if client_is_a else (self.bytes[1], self.bytes[0])
        protocol = "kafka" if self.requests else "tls" if self.tls is not None else "unknown"
        return {"connection_id": self.id, "client": endpoint_text(client), "server": endpoint_text(server),
                "first_seen": micros(self.first_seen), "last_seen": micros(self.last_seen),
                "protocol": protocol, "tls_version": self.tls and self.tls["version"],
                "tls_cipher": self.tls and self.tls["cipher"], "handshake": self.handshake,
                "client_ids": list(self.client_ids), "requests": self.requests, "responses": self.responses,
                "packets": self.packets, "bytes_to_server": to_server, "bytes_to_client": to_client,
                "gaps": self.gaps, "gap_bytes": self.gap_bytes, "end_reason": self.end_reason,
                "capture_files": [file_names[f] for f in dict.fromkeys(f for f, _, _ in self.file_spans)],
                "first_file": self.first_packet[1], "first_index": self.first_packet[2]}


cdef class ConnectionDecoder:
    """The packets of one 4-tuple, in capture order, to rows: TCP reassembly and Kafka decoding as in
    `decode`, with a _Tally per connection for the connections table, and what the analyses read of each
    message (`seen`) keyed by where in the capture it ended (see pipeline.analysis)."""

    cdef object reassembler, analyzer
    cdef dict tallies
    cdef _Tally current  # the 4-tuple's latest connection
    cdef object topic_resolver
    cdef list file_names, facts
    cdef MessageColumns messages
    cdef RecordColumns records
    cdef object out, staged_seen
    cdef double next_sweep  # no wait ends before this capture time (asking the reassembler a packet cost 2 %)

    def __init__(self, port_hints: frozenset, topic_resolver: Output, file_names: list, out: StagedTables,
                 facts: list, staged_seen: StagedSeen, keylog: KeyLog = None):
        self.reassembler = tcp.TcpReassembler()
        self.analyzer = Analyzer(port_hints, reassembler=self.reassembler, keylog=keylog)
        self.tallies = {}
        self.topic_resolver = topic_resolver
        self.file_names = file_names
        self.out = out
        self.messages, self.records = out.rows[MESSAGES.name], out.rows[RECORDS.name]
        self.facts = facts
        self.staged_seen = staged_seen
        self.next_sweep = -INFINITY

    cdef void feed(self, seg, double reached, int file, long long index, copies) except *:
        """The segment at (reached, file, index): the time its file had reached, and where it is in the run;
        `copies`: [file, index, ...] of every file holding it, when several do (else None)."""
        reassembler = self.reassembler
        late = reassembler.late_segments
        cdef list events = reassembler.feed(seg)
        cdef tuple position = (reached, file, index)
        if events:
            self._observe(events, position, copies)
        if self.current is not None and reassembler.late_segments == late:
            self.current.count_packet((<tuple>seg)[0], file)
        if events:
            self._rows(self.analyzer.handle(events), position)

    cdef void advance(self, double clock) except *:
        """End the waits of the 4-tuple's connections that ended by capture time `clock` (the capture's at its next
        packet, or at its end) as `decode`'s sweeps end them (TcpReassembler.fire_next): holes given up, resets'
        waits and silences ended, each as of the time it ended; what they release is keyed there, before any
        packet of that time."""
        if clock < self.next_sweep:
            return
        self.next_sweep = self.reassembler.next_sweep_after(clock)
        while True:
            fired = self.reassembler.fire_next(clock)
            if fired is None:
                return
            at, events = fired
            self._observe(events, None, None)
            self._rows(self.analyzer.handle(events), (at, BEFORE_THE_PACKETS, BEFORE_THE_PACKETS))

    cdef void finish(self, double end) except *:
        """End the 4-tuple's connections where the capture ends (`end`: its time; -INFINITY: at its last packet)."""
        cdef list events = self.reassembler.flush(end)
        cdef _Tally tally
        self._observe(events, None, None)
        self._rows(self.analyzer.handle(events), None)
        rows = self.out.rows[CONNECTIONS.name]
        for tally in self.tallies.values():
            row = tally.row(self.file_names)
            rows.append(tuple([row[n] for n in _CONNECTION_NAMES]))
            self.facts.append((row["connection_id"], micros(tally.first_packet[0]), row["first_file"],
                               row["first_index"], tally.first_copies, None, None, None, None, None))

    cdef void _observe(self, list events, tuple position, copies) except *:
        """Fill the tallies from TCP events; `position` is that of the segment they came from (reached, file, index),
        `copies` where each file holding it holds it."""
        cdef tuple ev
        cdef _Tally tally
        for event in events:
            kind = type(event)
            ev = <tuple>event
            if kind is _StreamData:  # (conn, direction, offset, data, ts)
                tally = self.tallies[ev[0][0]]
                tally.bytes[<int>ev[1]] += len(<bytes>ev[3])
            elif kind is _ConnectionOpened:
                self.current = self.tallies[ev[0][0]] = _Tally(ev, position, copies)
            elif kind is _Gap:  # (conn, direction, offset, size, ts)
                tally = self.tallies[ev[0][0]]
                tally.gaps += 1
                tally.gap_bytes += ev[3]
            elif kind is _StreamEnd and ev[1] == _BOTH:  # (conn, direction, reason, ts)
                tally = self.tallies[ev[0][0]]
                tally.end_reason = ev[2]

    cdef void _rows(self, list events, tuple position) except *:
        """Rows of the events handed over by the segment at `position` (time reached, file, index), or by waits that
        ended at a time (that time, BEFORE_THE_PACKETS twice); None: by the connection's end."""
        cdef MessageEvent ev
        cdef Message m
        cdef _Tally tally
        for event in events:
            conn = event.conn
            if conn is not None and conn.tls is not None:
                (<_Tally>self.tallies[conn.stream]).tls = conn.tls
            if type(event) is not MessageEvent:
                continue  # notices; SASL tokens are not Kafka messages
            ev = <MessageEvent>event
            tally = self.tallies[ev.conn.stream]
            tally.client = ev.conn.client
            m = ev.message
            if m.kind == "request":
                tally.requests += 1
                tally.client_ids[m.client_id] = None  # (null too: the request's header said null, or was cut short)
                client_id = m.client_id
            else:
                tally.responses += 1
                client_id = ev.request.message.client_id if ev.request is not None else None
            record_count = self.records.add(ev, tally.id, client_id)
            files = [self.file_names[f] for f in tally.files_between(ev.first_ts, ev.ts)]
            src, dst = tally.sender_and_receiver(ev)
            self.messages.add(ev, tally.id, files, src, dst, client_id, self.topic_resolver.event_topics(ev),
                              record_count)
            read = plain_seen(ev, tally.id)
            if read is not None:
                if position is None:
                    self.staged_seen.add(_AT_THE_END, tally.first_packet, read)
                elif position[1] == BEFORE_THE_PACKETS:
                    self.staged_seen.add(position, tally.first_packet, read)
                else:
                    self.staged_seen.add(position, IN_A_PACKET, read)


cdef void _feed_tie(ConnectionDecoder decoder, list tie, double reached) except *:
    """Feed the connection's segments of one time reached, (segment, file, index) sorted by (file, index), after
    the waits that ended by then."""
    cdef tuple one
    decoder.advance(reached)
    if len(tie) > 1 and (<tuple>tie[0])[1] != (<tuple>tie[-1])[1]:
        for one in _tie_order(tie):
            decoder.feed(one[0], reached, one[1], one[2], one[3])
    else:
        for one in tie:
            decoder.feed(one[0], reached, one[1], one[2], None)


cdef object _UNASKED = object()


cdef object _asked(ends, capture_end):
    """The capture's end time: `ends` once asked (_UNASKED before), else capture_end's answer (None: unknown)."""
    if ends is not _UNASKED:
        return ends
    return capture_end() if capture_end is not None else None
cdef tuple _AT_THE_END = (AT_THE_END, BEFORE_THE_PACKETS, BEFORE_THE_PACKETS)  # a connection's end's position


cdef void _finish_connection(ConnectionDecoder decoder, list tie, double tie_reached, ends) except *:
    """Feed the 4-tuple's last segments, end the waits that end by the capture's end (`ends`: its time; None:
    unknown), and end its connections."""
    _feed_tie(decoder, tie, tie_reached)
    if ends is not None:
        decoder.advance(ends)
    decoder.finish(-INFINITY if ends is None else ends)


cdef list _tie_order(list tie):
    """The segments of one connection at one time reached that several files hold, in the order to feed them: each
    file's own order kept, a segment that several files hold (the same packet in overlapping inputs) taken once, and
    where the files' orders say nothing, by the latest file that holds each (rotated files: what one file holds at
    the time it ends came before what the next one holds at that time), then as the files give them. In the files'
    order alone, a packet a file taken earlier holds went before what another file holds before it at that time: of
    two captures of the same traffic, each missing some packets, a SYN only the smaller held went after its
    connection's SYN-ACK, and the connection was decoded as two. The k-th of identical segments in a file is the
    k-th of them in another (a file may hold a retransmission identical to the packet before it). Each comes as
    (segment, file, index, copies): its position is its first file's, raised where needed so that positions never go
    back, as the Seens' keys must not within a connection; `copies` [file, index, ...] where each file holding it
    holds it, when several do (else None)."""
    cdef list fed = _held_alike(tie)
    if fed is not None:
        return fed
    cdef list nodes = []  # (segment, file, index) of each distinct segment: its first file's, file after file
    cdef list latest = []  # per node: the latest file holding it
    cdef list copies = []  # per node: [file, index, ...] of each file holding it
    cdef list after = []  # per node: the nodes a file holds right after it
    cdef list before = []  # per node: how many nodes are still to come before it
    cdef dict same = {}  # segment -> its nodes, in order
    cdef dict count = {}  # (segment, file) -> how many of it the file held so far
    cdef Py_ssize_t node, previous = -1, n
    cdef int file, previous_file = -1
    cdef tuple one
    for item in tie:
        one = <tuple>item
        seg, file = one[0], one[1]
        if file != previous_file:
            previous, previous_file = -1, file
        alike = same.setdefault(seg, [])
        k = count.get((seg, file), 0)
        count[seg, file] = k + 1
        if k < len(<list>alike):
            node = (<list>alike)[k]
            latest[node] = file  # (files come in order)
            (<list>copies[node]).extend((file, one[2]))
        else:
            node = len(nodes)
            alike.append(node)
            nodes.append(one)
            latest.append(file)
            copies.append([file, one[2]])
            after.append([])
            before.append(0)
        if previous >= 0:  # (a node holds one segment of a file: never the previous one)
            (<list>after[previous]).append(node)
            before[node] += 1
        previous = node
    cdef list order = order_of_files(latest, after, before)
    fed = []
    cdef tuple position, last = (-1, -1)
    for n in order:
        one = <tuple>nodes[n]
        position = (one[1], one[2])
        if position < last:
            position = last
        fed.append((one[0], position[0], position[1], copies[n] if len(<list>copies[n]) > 2 else None))
        last = position
    return fed


cdef list _held_alike(list tie):
    """_tie_order's answer when every file holds the same segments in the same order (overlapping inputs: a merged
    capture given with its parts holds each packet twice), without the graph, which cost such a run a quarter more
    (bench60 with its six rotated parts: 0.35-0.5 s more of ~1.8 s a task); else None."""
    cdef Py_ssize_t size = len(tie), count = 1, start, i
    cdef tuple one, held
    first_file = (<tuple>tie[0])[1]
    while count < size and (<tuple>tie[count])[1] == first_file:
        count += 1
    if size % count:
        return None
    for start in range(count, size, count):  # each block of `count`: one file's, the first file's segments
        file = (<tuple>tie[start])[1]
        if file == (<tuple>tie[start - 1])[1]:
            return None
        for i in range(start, start + count):
            one, held = <tuple>tie[i], <tuple>tie[i - start]
            if one[1] != file or one[0] != held[0]:
                return None
    cdef list fed = []
    for i in range(count):
        held = <tuple>tie[i]
        fed.append((held[0], held[1], held[2],
                    [place for start in range(i, size, count) for place in (<tuple>tie[start])[1:3]]))
    return fed


cpdef list order_of_files(list latest, list after, list before):
    """The order of nodes that files hold, keeping each file's (Kahn's): `after[n]` the nodes a file holds right after
    node n, `before[n]` how many nodes come right before it in some file; of the nodes free to go, the one whose
    latest file (`latest[n]`, in the run's order) comes first, then the lowest. Nodes on a cycle (files that disagree)
    go last, lowest first. Used for a connection's packets of one time (_tie_order) and for the first packets of
    connections opened at one time (build.connection_order)."""
    cdef list ready = [(latest[n], n) for n in range(len(latest)) if before[n] == 0]
    cdef list order = []
    heapq.heapify(ready)
    while ready:
        n = heapq.heappop(ready)[1]
        order.append(n)
        for later in <list>after[n]:
            before[later] -= 1
            if before[later] == 0:
                heapq.heappush(ready, (latest[later], later))
    if len(order) < len(latest):
        taken = set(order)
        order += [n for n in range(len(latest)) if n not in taken]
    return order


def rows_of_batches(batches):
    """Each batch's rows as segment tuples (reading.SEGMENT_SCHEMA's order), a batch at a time."""
    for batch in batches:
        yield list(zip(*[column.to_pylist() for column in batch.columns]))


def decode_segment_rows(row_lists, list file_names, port_hints: frozenset, str out, str staging, str task,
                        bytes keylog_text=b"", int tasks=1, capture_end=None):
    """A decode task's segment rows (tuples in reading.SEGMENT_SCHEMA's order) given a list at a time, sorted by
    reading.SEGMENT_ORDER: a shuffled partition's (rows_of_batches) or a task's share of the files
    (reading.shard_rows).
    Rows of every table staged under out/staging (files named after `task`); returns the run's facts, tuples in
    RUN_FACTS_SCHEMA's order. keylog_text: the TLS key log lines the driver read, parsed once per task; `tasks`: how
    many decode tasks the run has (the staged Seen files each may leave: analysis.files_left); `capture_end`: a
    callable giving the capture time the run ends at (None: unknown), asked once all the rows have been read: the
    waits of a connection that end after its last packet end by then, as `decode`'s sweeps end them (asked when
    the first connection ends: every read is done by then)."""
    staged = StagedTables(out, staging, task)
    staged_seen = StagedSeen(out, staging, task, files_left(tasks))
    keylog = KeyLog()
    keylog.add_text(keylog_text)
    cdef list facts = []
    # decode's own topic lookup; the ids it learns are pooled over the run by the job
    topic_resolver = Output(OutputOptions(view="json"))
    cdef ConnectionDecoder decoder = None
    cdef str key, current_key = None
    cdef tuple first, second, src, dst
    cdef list tie = []  # the connection's (segment, file, index) at the last one's time reached, fed when it moves
    cdef double reached, tie_reached = 0.0
    cdef tuple row
    ends = _UNASKED  # (capture_end's answer)
    with collecting_rarely():
        for rows in row_lists:
            for item in <list>rows:
                row = <tuple>item  # (key, ts, file, index, forward, seq, ack, flags, payload, missing, reached)
                key, reached = row[0], row[10]
                if key != current_key:
                    if decoder is not None:
                        ends = _asked(ends, capture_end)
                        _finish_connection(decoder, tie, tie_reached, ends)
                    decoder = ConnectionDecoder(port_hints, topic_resolver, file_names, staged, facts, staged_seen,
                                                keylog)
                    current_key = key
                    first, second = key_endpoints(key)
                    tie = []
                elif reached != tie_reached:
                    _feed_tie(decoder, tie, tie_reached)
                    tie = []
                tie_reached = reached
                src, dst = (first, second) if row[4] else (second, first)
                tie.append((named_tuple(TcpSegment, (row[1], src[0], src[1], dst[0], dst[1], row[5], row[6], row[7],
                                                     row[8], row[9])), row[2], row[3]))
            staged.flush()
        if decoder is not None:
            _finish_connection(decoder, tie, tie_reached, _asked(ends, capture_end))
    facts += ((None, None, None, None, None, topic_id, name, None, None, None)
              for topic_id, name in topic_resolver.topic_names.by_id.items())
    facts += ((None, None, None, None, None, None, None, table, path, rows) for table, path, rows in staged.close())
    facts += ((None, None, None, None, None, None, None, STAGED_NAME, path, rows)
              for path, rows in staged_seen.close())
    return facts
