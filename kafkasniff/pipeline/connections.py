"""Decode the packets of one TCP 4-tuple, in order, into table rows (runs on Spark workers).

The project's own TcpReassembler and Analyzer do the work, exactly as for `decode`; a
reassembler subclass only watches the TCP events go by to fill the `connections` table.
One 4-tuple can hold several connections one after another (a port reused with a new SYN,
or reused after a close); each gets its own row.

The one difference from decoding a whole file in one process: capture time only advances
with this 4-tuple's packets, so a hole in the stream is given up on at this connection's
next packet (or its end) rather than at any later packet of the capture. A retransmission
arriving more than the reassembler's max_wait after the hole can still fill it here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from itertools import groupby

from kafkasniff.capture.packets import TcpSegment
from kafkasniff.pipeline.rows import message_row, micros, record_rows
from kafkasniff.pipeline.tables import CONNECTIONS, MESSAGES, RECORDS
from kafkasniff.render.output import Output, OutputOptions
from kafkasniff.stream import tcp
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.session import MessageEvent, endpoint_text

# Tags of the rows mapPartitions emits, one stream of (tag, row) for all tables.
MESSAGE_ROW, RECORD_ROW, CONNECTION_ROW, TOPIC_NAME_ROW = range(4)
_MESSAGE_NAMES, _RECORD_NAMES, _CONNECTION_NAMES = MESSAGES.raw_names, RECORDS.raw_names, CONNECTIONS.raw_names


def connection_key(seg: TcpSegment) -> tuple[str, int, str, int]:
    """The same key for both directions of a connection."""
    a, b = (seg.src, seg.sport), (seg.dst, seg.dport)
    return (*a, *b) if a <= b else (*b, *a)


def connection_id(a: tcp.Endpoint, b: tcp.Endpoint, first_seen: float) -> str:
    low, high = sorted((endpoint_text(a), endpoint_text(b)))
    return hashlib.blake2b(f"{low} {high} {micros(first_seen)}".encode(), digest_size=8).hexdigest()


class _Tally:
    """What the connections table says about one TCP connection."""

    __slots__ = ("conn", "id", "first_seen", "last_seen", "handshake", "packets", "bytes", "gaps", "gap_bytes",
                 "end_reason", "file_spans", "client", "client_ids", "requests", "responses", "tls")

    def __init__(self, opened: tcp.ConnectionOpened) -> None:
        self.conn = opened.conn
        self.id = connection_id(opened.conn.a, opened.conn.b, opened.ts)
        self.first_seen = self.last_seen = opened.ts
        self.handshake = opened.client_guess is not None
        self.packets = 0
        self.bytes = [0, 0]  # by TCP direction: A_TO_B, B_TO_A
        self.gaps = self.gap_bytes = 0
        self.end_reason = tcp.END_CAPTURE
        self.file_spans: list[list] = []  # [file, first ts, last ts] in feed order
        self.client: tcp.Endpoint | None = None
        self.client_ids: dict[str, None] = {}
        self.requests = self.responses = 0
        self.tls: dict | None = None  # {"version", "cipher"} of a TLS connection

    def files_between(self, first_ts: float, last_ts: float) -> list[str]:
        files = [name for name, lo, hi in self.file_spans if lo <= last_ts and hi >= first_ts]
        return files or [self.file_spans[-1][0]]

    def row(self) -> dict:
        a, b = self.conn.a, self.conn.b
        client_is_a = self.client is None or self.client == a
        client, server = (a, b) if client_is_a else (b, a)
        to_server, to_client = self.bytes if client_is_a else reversed(self.bytes)
        protocol = "kafka" if self.requests else "tls" if self.tls is not None else "unknown"
        return {"connection_id": self.id, "client": endpoint_text(client), "server": endpoint_text(server),
                "first_seen": micros(self.first_seen), "last_seen": micros(self.last_seen),
                "protocol": protocol, "tls_version": self.tls and self.tls["version"],
                "tls_cipher": self.tls and self.tls["cipher"], "handshake": self.handshake, "client_ids": list(self.client_ids),
                "requests": self.requests, "responses": self.responses, "packets": self.packets,
                "bytes_to_server": to_server, "bytes_to_client": to_client, "gaps": self.gaps,
                "gap_bytes": self.gap_bytes, "end_reason": self.end_reason,
                "capture_files": [name for name, _, _ in self.file_spans]}


class _TallyingReassembler(tcp.TcpReassembler):
    """A TcpReassembler that also keeps a _Tally per connection (all of one 4-tuple)."""

    def __init__(self) -> None:
        super().__init__()
        self.tallies: dict[int, _Tally] = {}
        self._current: _Tally | None = None  # the 4-tuple's latest connection
        self.file = ""

    def feed(self, seg: TcpSegment) -> list:
        late = self.late_segments
        events = super().feed(seg)
        self._observe(events)
        tally = self._current
        if self.late_segments == late and tally is not None:
            tally.packets += 1
            tally.last_seen = max(tally.last_seen, seg.ts)
            spans = tally.file_spans
            if spans and spans[-1][0] == self.file:
                spans[-1][2] = max(spans[-1][2], seg.ts)
            else:
                spans.append([self.file, seg.ts, seg.ts])
        return events

    def flush(self) -> list:
        events = super().flush()
        self._observe(events)
        return events

    def _observe(self, events: list) -> None:
        for ev in events:
            kind = type(ev)
            if kind is tcp.StreamData:
                self.tallies[ev.conn.stream].bytes[ev.direction] += len(ev.data)
            elif kind is tcp.ConnectionOpened:
                self._current = self.tallies[ev.conn.stream] = _Tally(ev)
            elif kind is tcp.Gap:
                tally = self.tallies[ev.conn.stream]
                tally.gaps += 1
                tally.gap_bytes += ev.size
            elif kind is tcp.StreamEnd and ev.direction == tcp.BOTH:
                self.tallies[ev.conn.stream].end_reason = ev.reason


def decode_connection(keyed_segments: Iterable[tuple[tuple, TcpSegment]], port_hints: frozenset[int],
                      keylog: KeyLog | None = None) -> Iterator[tuple[int, tuple]]:
    """(tag, raw row) for everything in one 4-tuple's packets, given as ((…, file, …), segment)
    pairs in feed order; the file name is the third item of the key. keylog: TLS secrets."""
    reassembler = _TallyingReassembler()
    analyzer = Analyzer(port_hints, reassembler=reassembler, keylog=keylog)
    tallies = reassembler.tallies
    # decode's own topic lookup; the ids it learns here are pooled over the run by the job
    topic_resolver = Output(OutputOptions(view="json"))
    for key, segment in keyed_segments:
        reassembler.file = key[2]
        yield from _rows(analyzer.feed(segment), tallies, topic_resolver)
    yield from _rows(analyzer.finish(), tallies, topic_resolver)
    for tally in tallies.values():
        yield CONNECTION_ROW, _ordered(tally.row(), _CONNECTION_NAMES)
    for pair in topic_resolver.topic_names.by_id.items():
        yield TOPIC_NAME_ROW, pair


def _rows(events: list, tallies: dict[int, _Tally], topic_resolver: Output) -> Iterator[tuple[int, tuple]]:
    for ev in events:
        if ev.conn is not None and ev.conn.tls is not None:
            tallies[ev.conn.stream].tls = ev.conn.tls
        if type(ev) is not MessageEvent:
            continue  # notices; SASL tokens are not Kafka messages
        tally = tallies[ev.conn.stream]
        tally.client = ev.conn.client
        m = ev.message
        if m.kind == "request":
            tally.requests += 1
            if m.client_id is not None:
                tally.client_ids[m.client_id] = None
            client_id = m.client_id
        else:
            tally.responses += 1
            client_id = ev.request.message.client_id if ev.request is not None else None
        records = record_rows(ev, tally.id, client_id)
        files = tally.files_between(ev.first_ts, ev.ts)
        topics = list(topic_resolver.event_topics(ev))
        row = message_row(ev, tally.id, files, topics, len(records) if records is not None else None)
        yield MESSAGE_ROW, _ordered(row, _MESSAGE_NAMES)
        for record in records or ():
            yield RECORD_ROW, _ordered(record, _RECORD_NAMES)


def _ordered(row: dict, names: tuple[str, ...]) -> tuple:
    return tuple(row[n] for n in names)


def decode_sorted_partition(items: Iterator[tuple[tuple, TcpSegment]], port_hints: frozenset[int],
                            keylog_text: bytes = b"") -> Iterator[tuple[int, tuple]]:
    """A Spark partition sorted by (4-tuple, file order, packet index): decode each 4-tuple's run.
    keylog_text: the TLS key log lines the driver read, parsed once per partition."""
    keylog = KeyLog()
    keylog.add_text(keylog_text)
    for _, run in groupby(items, key=lambda item: item[0][0]):
        yield from decode_connection(run, port_hints, keylog)
