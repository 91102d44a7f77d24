# cython: language_level=3
"""`--stats`: counts, bytes, latencies and errors per API, topic and client id; consumer lag and
produce-to-fetch latency (kafkasniff.analyses).

Computed as events go by, in memory that does not grow with the number of
messages: counters per API, topic and client id, and per API a latency
histogram with logarithmic buckets (see `kafkasniff.analyses.histogram`).
"""

from __future__ import annotations

from collections import Counter
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kafkasniff.analyses.histogram import PERCENTILES, LatencyHistogram
from kafkasniff.analyses.insight import Insight
from kafkasniff.protocol.schema import apis
from kafkasniff.render.insight import lag_tables, latency_table
from kafkasniff.render.tables import print_tables
from kafkasniff.render.values import error_names
from kafkasniff.protocol.messages cimport Message
from kafkasniff.stream.session cimport MessageEvent
from kafkasniff.stream.session import NoticeEvent, SaslTokenEvent

# Compiled: every message of --stats, --top and --metrics-port is counted here (the counters are C fields).


cdef class ApiStats:
    cdef public object api_key, api_name, latency, errors
    cdef public long long requests, responses, request_bytes, response_bytes, malformed

    def __init__(self, api_key: int | None, api_name: str | None):
        self.api_key = api_key
        self.api_name = api_name
        self.requests = self.responses = self.request_bytes = self.response_bytes = self.malformed = 0
        self.latency = LatencyHistogram()
        self.errors: Counter[str] = Counter()

    def to_json(self) -> dict:
        return {"api_key": self.api_key, "api_name": self.api_name, "requests": self.requests,
                "responses": self.responses, "request_bytes": self.request_bytes,
                "response_bytes": self.response_bytes, "latency_ms": self.latency.to_json(),
                "errors": dict(sorted(self.errors.items())), "malformed": self.malformed}


cdef class TopicStats:
    cdef public long long messages, bytes, records_produced, records_fetched


cdef class ClientStats:
    cdef public long long requests, bytes, errors


_NO_TOPICS: dict = {}
# Where the bytes of the TCP streams went: shown as messages or SASL tokens, or reported by notices of
# these kinds; "missing" bytes were never captured.
BYTE_KINDS = ("messages", "sasl_tokens", "skipped", "tls", "not-kafka", "missing")
FRAME_PREFIX = 4


class Stats:
    def __init__(self) -> None:
        self.apis: dict[int | None, ApiStats] = {}
        self.topics: dict[str, TopicStats] = {}
        self.clients: dict[str | None, ClientStats] = {}
        self.sasl_tokens = 0
        self.notices: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.insight = Insight(samples=False)  # consumer lag and produce-to-fetch latency

    def observe(self, ev, topics: dict[str, list] | None = None) -> None:
        """Count one event; `topics` maps each topic the message is about to [records carried, partitions]."""
        kind = type(ev)
        if kind is MessageEvent:
            self._message(ev, topics or _NO_TOPICS)
            self.insight.observe(ev)
        elif kind is SaslTokenEvent:
            self.sasl_tokens += 1
            self.bytes["sasl_tokens"] += FRAME_PREFIX + len(ev.token)
        elif kind is NoticeEvent:
            self.notices[ev.kind] += 1
            self.bytes[ev.kind] += ev.size

    def byte_totals(self) -> dict[str, int]:
        """Bytes captured, and where they went (every kind, zeros too)."""
        totals = {kind.replace("-", "_"): self.bytes[kind] for kind in BYTE_KINDS}
        return {"captured": sum(self.bytes.values()) - self.bytes["missing"], **totals}

    def _message(self, MessageEvent ev, dict topics) -> None:
        # No call where there is nothing to count (most messages have no errors, no topics).
        cdef Message m = ev.message
        cdef ApiStats api
        cdef ClientStats client
        cdef TopicStats topic
        cdef long long size
        cdef bint request
        api = self.apis.get(m.api_key)
        if api is None:
            # API keys Kafka does not define (damaged or made-up bytes) share the row of messages with no API: a
            # row each would grow the tables without end
            key = m.api_key if m.api_key in apis() else None
            api = self.apis.get(key)
            if api is None:
                api = self.apis[key] = ApiStats(key, m.api_name if key is not None else None)
        size = m.size
        self.bytes["messages"] += FRAME_PREFIX + size
        request = m.kind == "request"
        if request:
            api.requests += 1
            api.request_bytes += size
            client_id = m.client_id
        else:
            api.responses += 1
            api.response_bytes += size
            if ev.latency_ms is not None:
                api.latency.add(ev.latency_ms)
            client_id = ev.request.message.client_id if ev.request is not None else None
        errors = error_names(m) if m.errors else None
        if errors:
            api.errors.update(errors)
        if m.malformed is not None:
            api.malformed += 1
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = ClientStats()
        client.requests += request
        client.bytes += size
        if errors:
            client.errors += 1
        for name, (records, _) in topics.items():
            topic = self.topics.get(name)
            if topic is None:
                topic = self.topics[name] = TopicStats()
            topic.messages += 1
            topic.bytes += size
            if request:
                topic.records_produced += records
            else:
                topic.records_fetched += records

    def api_rows(self) -> list[ApiStats]:
        return sorted(self.apis.values(), key=lambda a: (a.api_key is None, a.api_key or 0))

    def to_json(self) -> dict:
        return {
            "kind": "stats",
            "apis": [a.to_json() for a in self.api_rows()],
            "topics": [{"topic": name, "messages": t.messages, "bytes": t.bytes,
                        "records_produced": t.records_produced, "records_fetched": t.records_fetched}
                       for name, t in sorted(self.topics.items())],
            "clients": [{"client_id": cid, "requests": c.requests, "bytes": c.bytes, "errors": c.errors}
                        for cid, c in sorted(self.clients.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))],
            "sasl_tokens": self.sasl_tokens,
            "notices": dict(sorted(self.notices.items())),
            "bytes": self.byte_totals(),
            "lag": self.insight.lag.to_json(),
            "end_to_end": self.insight.lag.latency.to_json(),
        }


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _table(title: str, columns: tuple[str, ...], numeric_from: int) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", show_edge=False)
    for i, col in enumerate(columns):
        table.add_column(col, justify="right" if i >= numeric_from else "left", no_wrap=i < numeric_from)
    return table


def stats_tables(stats: Stats) -> list[Table]:
    apis = _table("per API (latency in ms)", ("API", "requests", "responses", "request bytes", "response bytes",
                                              "p50", "p95", "p99", "max", "errors"), 1)
    for a in stats.api_rows():
        lat = a.latency
        errors = ", ".join(f"{name}×{n}" for name, n in sorted(a.errors.items()))
        if a.malformed:
            errors = ", ".join(filter(None, (errors, f"malformed×{a.malformed}")))
        apis.add_row(a.api_name or "?", f"{a.requests:,}", f"{a.responses:,}", f"{a.request_bytes:,}",
                     f"{a.response_bytes:,}", *(_ms(lat.percentile(p)) for p in PERCENTILES),
                     _ms(lat.max if lat.count else None), errors)
    topics = _table("per topic", ("topic", "messages", "bytes", "records produced", "records fetched"), 1)
    for name, t in sorted(stats.topics.items()):
        topics.add_row(Text(name), f"{t.messages:,}", f"{t.bytes:,}", f"{t.records_produced:,}",
                       f"{t.records_fetched:,}")
    clients = _table("per client id", ("client id", "requests", "bytes", "responses with errors"), 1)
    for cid, c in sorted(stats.clients.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        clients.add_row(Text("(null)" if cid is None else cid), f"{c.requests:,}", f"{c.bytes:,}", f"{c.errors:,}")
    lag = stats.insight.lag
    return [apis, topics, clients, *lag_tables(lag), *filter(None, [latency_table(lag)])]


def print_stats(stats: Stats, out: TextIO) -> None:
    print_tables(stats_tables(stats), out)
    console = Console(file=out, width=None if out.isatty() else 200, highlight=False)
    extra = [f"{stats.sasl_tokens:,} raw SASL tokens"] if stats.sasl_tokens else []
    extra += [f"{n:,} {kind} notices" for kind, n in sorted(stats.notices.items())]
    if extra:
        console.print(", ".join(extra))
    totals = stats.byte_totals()
    console.print(f"bytes captured: {totals['captured']:,} = {totals['messages']:,} in messages + "
                  f"{totals['sasl_tokens']:,} in SASL tokens + {totals['skipped']:,} skipped + {totals['tls']:,} TLS + "
                  f"{totals['not_kafka']:,} not Kafka; {totals['missing']:,} missing from the capture")
