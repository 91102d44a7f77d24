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

from kafkasniff.analyses.histogram import PERCENTILES, LatencyHistogram
from kafkasniff.analyses.insight import Insight
from kafkasniff.analyses.wire import PlainSeens, plain_seen, seen
from kafkasniff.protocol.schema import apis
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

    def add(self, ApiStats other) -> None:
        """Another's counts of the same API (a parallel decode's worker's)."""
        self.requests += other.requests
        self.responses += other.responses
        self.request_bytes += other.request_bytes
        self.response_bytes += other.response_bytes
        self.malformed += other.malformed
        self.latency.merge(other.latency)
        self.errors.update(other.errors)

    def to_json(self) -> dict:
        return {"api_key": self.api_key, "api_name": self.api_name, "requests": self.requests,
                "responses": self.responses, "request_bytes": self.request_bytes,
                "response_bytes": self.response_bytes, "latency_ms": self.latency.to_json(),
                "errors": dict(sorted(self.errors.items())), "malformed": self.malformed}


cdef class TopicStats:
    cdef public long long messages, bytes, records_produced, records_fetched

    def add(self, TopicStats other) -> None:
        self.messages += other.messages
        self.bytes += other.bytes
        self.records_produced += other.records_produced
        self.records_fetched += other.records_fetched


cdef class ClientStats:
    cdef public long long requests, bytes, errors

    def add(self, ClientStats other) -> None:
        self.requests += other.requests
        self.bytes += other.bytes
        self.errors += other.errors


# Where the bytes of the TCP streams went: shown as messages or SASL tokens, or reported by notices of
# these kinds; "missing" bytes were never captured.
BYTE_KINDS = ("messages", "sasl_tokens", "skipped", "tls", "not-kafka", "missing")
FRAME_PREFIX = 4


cdef class Stats:
    # An extension type: every message of --stats (and --top, --metrics-port) is counted here, so its own methods
    # are C calls, and the bytes of messages a C counter (assigning a Counter's item is a Python call: Counter
    # defines __delitem__, which takes dict's slot for both).
    cdef public dict apis, topics, clients
    cdef public long long sasl_tokens
    cdef public long long message_bytes  # bytes["messages"], kept apart
    cdef public object notices, bytes, insight
    cdef object _plain  # PlainSeens: a worker's plain_seen tuples -> Seens

    def __init__(self) -> None:
        self.apis = {}  # ApiStats by API key
        self.topics = {}  # TopicStats by name
        self.clients = {}  # ClientStats by client id
        self.sasl_tokens = 0
        self.message_bytes = 0
        self.notices = Counter()
        self.bytes = Counter()  # by kind (BYTE_KINDS), but messages (message_bytes)
        self.insight = Insight(samples=False)  # consumer lag and produce-to-fetch latency
        self._plain = PlainSeens()

    def observe(self, ev, topics: dict[str, list] | None = None) -> None:
        """Count one event; `topics` maps each topic the message is about to [records carried, partitions]."""
        self.count(counted(ev), topics)

    def count(self, tuple item, topics: dict[str, list] | None = None) -> None:
        """Count what `counted` read of an event (made here, or by a parallel decode's worker: in capture order,
        as the analyses follow the capture), what `count_apart` left, or a worker's `totals`."""
        if item is None:
            return
        kind = item[0]
        if kind == _MESSAGE:
            facts = <tuple>item[1]
            self._count_message(facts)
            self._count_topics(facts[2], facts[3], topics)
            read = item[2]
            if read is not None:  # a Seen, or plain_seen's tuples from a worker (--topic: counted in order)
                self.insight.take(self._plain.seen(read) if type(read) is tuple else read)
        elif kind == _LEFT:
            self._count_topics(item[1], item[2], topics)
            if item[3] is not None:
                self.insight.take(self._plain.seen(item[3]))
        elif kind == _SASL_TOKEN:
            self.sasl_tokens += 1
            self.bytes["sasl_tokens"] += <long long>item[1]
        elif kind == _NOTICE:
            self.notices[item[1]] += 1
            self.bytes[item[1]] += <long long>item[2]
        else:
            self._merge(item[1])

    def count_apart(self, tuple item, dict topics, bint mentions) -> tuple | None:
        """A parallel decode's worker: count here what does not depend on the capture's order (the message's API,
        client id and bytes; SASL tokens, notices; `topics`, when its mentions name no topic id and so resolve
        the same anywhere), and return what the parent must count in capture order, or None: (_LEFT, is a
        request, size, plain Seen) when the message names topic ids (`mentions`: they are named in order) or the
        analyses read it. The worker's counts go to the parent at the end (`totals`)."""
        if item is None or item[0] != _MESSAGE:
            self.count(item)
            return None
        facts = <tuple>item[1]
        self._count_message(facts)
        self._count_topics(facts[2], facts[3], topics)
        if not mentions and item[2] is None:
            return None
        return (_LEFT, facts[2], facts[3], item[2])

    def totals(self) -> tuple:
        """What count_apart counted here, for the parent to add to its own (`count`)."""
        return (_TOTALS, (self.apis, self.clients, self.topics, self.sasl_tokens, self.notices, self.bytes,
                          self.message_bytes))

    cdef _merge(self, tuple totals):
        apis_, clients, topics, sasl_tokens, notices, byte_counts, message_bytes = totals
        _add_each(self.apis, apis_)
        _add_each(self.clients, clients)
        _add_each(self.topics, topics)
        self.sasl_tokens += sasl_tokens
        self.notices.update(notices)
        self.bytes.update(byte_counts)
        self.message_bytes += message_bytes

    def byte_totals(self) -> dict[str, int]:
        """Bytes captured, and where they went (every kind, zeros too)."""
        totals = {kind.replace("-", "_"): self.bytes[kind] for kind in BYTE_KINDS}
        totals["messages"] += self.message_bytes
        return {"captured": sum(self.bytes.values()) + self.message_bytes - self.bytes["missing"], **totals}

    cdef _count_message(self, tuple facts):
        """The message's API, client id and bytes."""
        # No call where there is nothing to count (most messages have no errors).
        cdef ApiStats api
        cdef ClientStats client
        cdef long long size = facts[3]
        cdef bint request = facts[2]
        api_key, api_name, _, _, latency_ms, client_id, errors, malformed = facts
        api = self.apis.get(api_key)
        if api is None:
            # API keys Kafka does not define (damaged or made-up bytes) share the row of messages with no API: a
            # row each would grow the tables without end
            key = api_key if api_key in apis() else None
            api = self.apis.get(key)
            if api is None:
                api = self.apis[key] = ApiStats(key, api_name if key is not None else None)
        self.message_bytes += FRAME_PREFIX + size
        if request:
            api.requests += 1
            api.request_bytes += size
        else:
            api.responses += 1
            api.response_bytes += size
            if latency_ms is not None:
                api.latency.add(latency_ms)
        if errors:
            api.errors.update(errors)
        if malformed:
            api.malformed += 1
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = ClientStats()
        client.requests += request
        client.bytes += size
        if errors:
            client.errors += 1

    cdef _count_topics(self, bint request, long long size, dict topics):
        """The message's share of each topic it is about: {name: [records carried, partitions]}."""
        cdef TopicStats topic
        if not topics:
            return
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


cdef int _add_each(dict mine, dict theirs) except -1:
    """A worker's rows (ApiStats, ClientStats or TopicStats by key) added to these: each to its own, or taken as it
    is."""
    for key, row in theirs.items():
        own = mine.get(key)
        if own is None:
            mine[key] = row
        else:
            own.add(row)
    return 0


# What Stats counts of an event, as plain values: (_MESSAGE, (api key, API name, is a request, size, latency in ms,
# client id, error names, malformed), what the analyses read of it), (_SASL_TOKEN, bytes) or (_NOTICE, kind, bytes);
# None for events it does not count. A parallel decode's workers make them and the parent counts them in capture
# order (engine/parallel.py).
MESSAGE, SASL_TOKEN, NOTICE = range(3)
# Stats.count_apart's items: what is left of a message for the parent, a worker's totals.
LEFT, TOTALS = 3, 4
cdef int _MESSAGE = MESSAGE, _SASL_TOKEN = SASL_TOKEN, _NOTICE = NOTICE, _LEFT = LEFT, _TOTALS = TOTALS


cpdef tuple counted(ev, connection=None, bint plain=False):
    """What Stats counts of the event; `connection`: what tells its connection apart for the analyses (default:
    the connection itself; a worker gives its stream number, which is the whole capture's). `plain`: what the
    analyses read as plain_seen's tuples (a worker's, to send), not a Seen."""
    cdef MessageEvent mev
    cdef Message m
    kind = type(ev)
    if kind is MessageEvent:
        mev = <MessageEvent>ev
        m = mev.message
        request = m.kind == "request"
        if request:
            client_id = m.client_id
        else:
            client_id = mev.request.message.client_id if mev.request is not None else None
        facts = (m.api_key, m.api_name, request, m.size, None if request else mev.latency_ms, client_id,
                 error_names(m) if m.errors else None, m.malformed is not None)
        return (_MESSAGE, facts, plain_seen(mev, connection) if plain else seen(mev, connection))
    if kind is SaslTokenEvent:
        return (_SASL_TOKEN, FRAME_PREFIX + len(ev.token))
    if kind is NoticeEvent:
        return (_NOTICE, ev.kind, ev.size)
    return None


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


# The tables (rich, render.insight, render.tables) are imported when printed: --stats --json, and the counting,
# need none of them.


def _table(title: str, columns: tuple[str, ...], numeric_from: int):
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", show_edge=False)
    for i, col in enumerate(columns):
        table.add_column(col, justify="right" if i >= numeric_from else "left", no_wrap=i < numeric_from)
    return table


def stats_tables(stats: Stats) -> list:
    from rich.text import Text

    from kafkasniff.render.insight import lag_tables, latency_table

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


def print_stats(stats: Stats, out: TextIO, filtered: bool = False) -> None:
    """The tables, the notices counted and where the bytes went; `filtered`: of the events the filters passed only
    (said so: a capture of TLS connections filtered by --api read as if it had captured nothing)."""
    from rich.console import Console

    from kafkasniff.render.tables import print_tables

    print_tables(stats_tables(stats), out)
    console = Console(file=out, width=None if out.isatty() else 200, highlight=False)
    extra = [f"{stats.sasl_tokens:,} raw SASL tokens"] if stats.sasl_tokens else []
    extra += [f"{n:,} {kind} notices" for kind, n in sorted(stats.notices.items())]
    if extra:
        console.print(", ".join(extra))
    totals = stats.byte_totals()
    what = "bytes of what the filters pass" if filtered else "bytes captured"
    console.print(f"{what}: {totals['captured']:,} = {totals['messages']:,} in messages + "
                  f"{totals['sasl_tokens']:,} in SASL tokens + {totals['skipped']:,} skipped + {totals['tls']:,} TLS + "
                  f"{totals['not_kafka']:,} not Kafka; {totals['missing']:,} missing from the capture")
