"""Decode a Spark partition of TCP segments into table rows (runs on Spark workers).

The partition's segments come sorted by (connection key, time, file, index in the file), as
Arrow batches (see `reading`); every run of one key (one TCP 4-tuple, both directions) goes
through its own TcpReassembler and Analyzer, the code behind `decode`, which sees the
packets as it would in one capture merged from all the inputs. One 4-tuple can hold several
connections one after another (a port reused with a new SYN, or reused after a close); each
gets its own row. A packet found, identical and at the same time, in several inputs (inputs
that overlap) is fed once.

The one difference from decoding a whole file in one process: capture time only advances
with this 4-tuple's packets, so a hole in the stream is given up on at this connection's
next packet (or its end) rather than at any later packet of the capture. A retransmission
arriving more than the reassembler's max_wait after the hole can still fill it here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pyarrow as pa

from kafkasniff.analyses.wire import seen
from kafkasniff.capture.packets import TcpSegment
from kafkasniff.pipeline.analysis import AT_THE_END, STAGED_NAME, StagedSeen
from kafkasniff.pipeline.rows import message_row, micros, record_rows
from kafkasniff.pipeline.tables import CONNECTIONS, MESSAGES, RECORDS
from kafkasniff.pipeline.writing import StagedTables
from kafkasniff.render.output import Output, OutputOptions
from kafkasniff.stream import tcp
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.session import MessageEvent, endpoint_text

_CONNECTION_NAMES = CONNECTIONS.raw_names
# What a decode task tells the job, one row per connection, topic id learned and staged file: the rest of
# what it decoded is in the staged files.
RUN_FACTS_DDL = ("connection_id string, first_seen bigint, first_file int, first_index bigint, topic_id string, "
                 "topic_name string, table_name string, staged string, rows bigint")
RUN_FACTS_SCHEMA = pa.schema([("connection_id", pa.string()), ("first_seen", pa.int64()), ("first_file", pa.int32()),
                              ("first_index", pa.int64()), ("topic_id", pa.string()), ("topic_name", pa.string()),
                              ("table_name", pa.string()), ("staged", pa.string()), ("rows", pa.int64())])


def connection_id(a: tcp.Endpoint, b: tcp.Endpoint, first_seen: float) -> str:
    low, high = sorted((endpoint_text(a), endpoint_text(b)))
    return hashlib.blake2b(f"{low} {high} {micros(first_seen)}".encode(), digest_size=8).hexdigest()


class _Tally:
    """What the connections table says about one TCP connection."""

    __slots__ = ("conn", "id", "first_seen", "last_seen", "handshake", "packets", "bytes", "gaps", "gap_bytes",
                 "end_reason", "file_spans", "client", "client_ids", "requests", "responses", "tls", "first_packet")

    def __init__(self, opened: tcp.ConnectionOpened, first_packet: tuple[int, int]) -> None:
        self.conn = opened.conn
        self.id = connection_id(opened.conn.a, opened.conn.b, opened.ts)
        self.first_seen = self.last_seen = opened.ts
        self.handshake = opened.client_guess is not None
        self.packets = 0
        self.bytes = [0, 0]  # by TCP direction: A_TO_B, B_TO_A
        self.gaps = self.gap_bytes = 0
        self.end_reason = tcp.END_CAPTURE
        self.file_spans: list[list] = []  # [file number, first ts, last ts] in feed order
        self.client: tcp.Endpoint | None = None
        self.client_ids: dict[str, None] = {}
        self.requests = self.responses = 0
        self.tls: dict | None = None  # {"version", "cipher"} of a TLS connection, once its handshake is seen
        self.first_packet = first_packet  # (file number, index in the file)

    def files_between(self, first_ts: float, last_ts: float) -> list[int]:
        if len(self.file_spans) == 1:
            return [self.file_spans[0][0]]
        files = [file for file, lo, hi in self.file_spans if lo <= last_ts and hi >= first_ts]
        return list(dict.fromkeys(files)) if files else [self.file_spans[-1][0]]

    def row(self, file_names: list[str]) -> dict:
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
                "capture_files": [file_names[f] for f in dict.fromkeys(f for f, _, _ in self.file_spans)],
                "first_file": self.first_packet[0], "first_index": self.first_packet[1]}



class ConnectionDecoder:
    """The packets of one 4-tuple, in capture order, to rows: TCP reassembly and Kafka decoding as in
    `decode`, with a _Tally per connection for the connections table, and what the analyses read of each
    message (`seen`) keyed by where in the capture it ended (see pipeline.analysis)."""

    def __init__(self, port_hints: frozenset[int], topic_resolver: Output, file_names: list[str],
                 out: StagedTables, facts: list[tuple], seen: StagedSeen, keylog: KeyLog | None = None) -> None:
        self.reassembler = tcp.TcpReassembler()
        self.analyzer = Analyzer(port_hints, reassembler=self.reassembler, keylog=keylog)
        self.tallies: dict[int, _Tally] = {}
        self._current: _Tally | None = None  # the 4-tuple's latest connection
        self._topic_resolver = topic_resolver
        self._file_names = file_names
        self._out = out
        self._facts = facts
        self._seen = seen

    def feed(self, seg: TcpSegment, file: int, index: int) -> None:
        reassembler = self.reassembler
        late = reassembler.late_segments
        events = reassembler.feed(seg)
        if events:
            self._observe(events, (file, index))
        tally = self._current
        if reassembler.late_segments == late and tally is not None:
            tally.packets += 1
            if seg.ts > tally.last_seen:
                tally.last_seen = seg.ts
            spans = tally.file_spans
            if spans and spans[-1][0] == file:
                spans[-1][2] = max(spans[-1][2], seg.ts)
            else:
                spans.append([file, seg.ts, seg.ts])
        if events:
            self._rows(self.analyzer.handle(events), (seg.ts, file, index))

    def finish(self) -> None:
        events = self.reassembler.flush()
        self._observe(events, None)
        self._rows(self.analyzer.handle(events), None)
        rows = self._out.rows[CONNECTIONS.name]
        for tally in self.tallies.values():
            row = tally.row(self._file_names)
            rows.append(tuple(row[n] for n in _CONNECTION_NAMES))
            self._facts.append((row["connection_id"], row["first_seen"], row["first_file"], row["first_index"],
                                None, None, None, None, None))

    def _observe(self, events: list, position: tuple[int, int] | None) -> None:
        """Fill the tallies from TCP events; `position` is that of the segment they came from."""
        for ev in events:
            kind = type(ev)
            if kind is tcp.StreamData:
                self.tallies[ev.conn.stream].bytes[ev.direction] += len(ev.data)
            elif kind is tcp.ConnectionOpened:
                self._current = self.tallies[ev.conn.stream] = _Tally(ev, position)
            elif kind is tcp.Gap:
                tally = self.tallies[ev.conn.stream]
                tally.gaps += 1
                tally.gap_bytes += ev.size
            elif kind is tcp.StreamEnd and ev.direction == tcp.BOTH:
                self.tallies[ev.conn.stream].end_reason = ev.reason

    def _rows(self, events: list, position: tuple[float, int, int] | None) -> None:
        """Rows of the events handed over by the segment at `position` (time, file, index); None: by the
        connection's end."""
        messages, records = self._out.rows[MESSAGES.name], self._out.rows[RECORDS.name]
        for ev in events:
            if ev.conn is not None and ev.conn.tls is not None:
                self.tallies[ev.conn.stream].tls = ev.conn.tls
            if type(ev) is not MessageEvent:
                continue  # notices; SASL tokens are not Kafka messages
            tally = self.tallies[ev.conn.stream]
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
            found = record_rows(ev, tally.id, client_id)
            files = [self._file_names[f] for f in tally.files_between(ev.first_ts, ev.ts)]
            topics = list(self._topic_resolver.event_topics(ev))
            messages.append(message_row(ev, tally.id, files, topics, len(found) if found is not None else None))
            if found:
                records += found
            read = seen(ev, tally.id)
            if read is not None:
                self._seen.add(*(position or (AT_THE_END, *tally.first_packet)), read)


def decode_partition(batches: Iterator[pa.RecordBatch], file_names: list[str], port_hints: frozenset[int],
                     out: str, staging: str, task: str, keylog_text: bytes = b"") -> Iterator[pa.RecordBatch]:
    """A Spark partition of segment batches sorted by (key, ts, file, index): rows of every table staged
    under out/staging (files named after `task`), and the run's facts (RUN_FACTS_DDL) returned.
    keylog_text: the TLS key log lines the driver read, parsed once per partition."""
    staged = StagedTables(out, staging, task)
    staged_seen = StagedSeen(out, staging, task)
    keylog = KeyLog()
    keylog.add_text(keylog_text)
    facts: list[tuple] = []
    # decode's own topic lookup; the ids it learns are pooled over the run by the job
    topic_resolver = Output(OutputOptions(view="json"))
    decoder: ConnectionDecoder | None = None
    current_key = None
    last_ts, first_file_of = None, {}
    for batch in batches:
        columns = [column.to_pylist() for column in batch.columns]
        keys, files, indexes = columns[0], columns[2], columns[3]
        segments = map(TcpSegment, columns[1], *columns[4:])
        for key, file, index, seg in zip(keys, files, indexes, segments):
            if key != current_key:
                if decoder is not None:
                    decoder.finish()
                decoder = ConnectionDecoder(port_hints, topic_resolver, file_names, staged, facts, staged_seen, keylog)
                current_key = key
                last_ts, first_file_of = None, {}
            if seg.ts != last_ts:
                last_ts, first_file_of = seg.ts, {}
            # the same packet in several inputs: the first file's copy only
            if first_file_of.setdefault(seg[1:], file) != file:
                continue
            decoder.feed(seg, file, index)
        staged.flush()
    if decoder is not None:
        decoder.finish()
    facts += ((None, None, None, None, topic_id, name, None, None, None)
              for topic_id, name in topic_resolver.topic_names.by_id.items())
    facts += ((None, None, None, None, None, None, table, path, rows) for table, path, rows in staged.close())
    seen_file = staged_seen.close()
    if seen_file is not None:
        facts.append((None, None, None, None, None, None, STAGED_NAME, *seen_file))
    if facts:
        columns = [pa.array(column, field.type) for column, field in zip(zip(*facts), RUN_FACTS_SCHEMA)]
        yield pa.RecordBatch.from_arrays(columns, schema=RUN_FACTS_SCHEMA)
