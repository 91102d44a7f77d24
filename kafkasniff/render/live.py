"""What `sniff --top` and `sniff --metrics-port` show while capturing: the --stats counters (per API, client id
and topic, consumer lag, produce-to-fetch latency) kept up to date as events go by, a rich dashboard of their
rates over the last refresh, and a Prometheus collector that reads them when scraped."""

from __future__ import annotations

import time

from rich.console import Group as Stack
from rich.table import Table
from rich.text import Text

from kafkasniff.analyses.groups import causes, clock, took_ms
from kafkasniff.protocol.topics import TopicNames
from kafkasniff.render.stats import Stats
from kafkasniff.stream.session import MessageEvent

# Rows per table: the busiest first.
TOP_ROWS = 10
RECENT_REBALANCES = 5


class LiveStats:
    """A Stats fed by the capture loop (`observe`), whatever the view prints."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.topic_names = TopicNames()
        self.started = time.monotonic()

    def observe(self, ev) -> None:
        topics = self.topic_names.resolve(ev.message.mentions) if type(ev) is MessageEvent else None
        self.stats.observe(ev, topics)


def _rate(now: int, before: int, seconds: float) -> str:
    return f"{(now - before) / seconds:,.1f}"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:,.2f}"


NAME_COLUMNS = frozenset({"API", "client id", "topic", "formed", "group", "cause", "consumer"})


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", show_edge=False, expand=False)
    for col in columns:
        table.add_column(col, justify="left" if col in NAME_COLUMNS else "right", no_wrap=True)
    return table


class Dashboard:
    """The --top screen: rates since the last `render`, latency percentiles of that window, errors since start,
    rebalances as they happen, the consumers furthest behind."""

    def __init__(self, live: LiveStats):
        self.live = live
        self.previous: dict = {}
        self.at = time.monotonic()

    def render(self, frames: int, drops: int | None = None):
        now = time.monotonic()
        seconds = max(now - self.at, 1e-3)
        stats, before = self.live.stats, self.previous
        current: dict = {}

        apis = _table("per API (last refresh)", ("API", "requests/s", "bytes/s", "p50 ms", "p99 ms", "errors"))
        rows = []
        for a in stats.api_rows():
            key = ("api", a.api_key)
            was = before.get(key, (0, 0, None))
            window = a.latency.since(was[2]) if was[2] is not None else a.latency
            current[key] = (a.requests, a.request_bytes + a.response_bytes, a.latency.buckets.copy())
            rows.append((a.requests - was[0], a.api_name or "?", _rate(a.requests, was[0], seconds),
                         _rate(current[key][1], was[1], seconds), _ms(window.percentile(50)),
                         _ms(window.percentile(99)), f"{sum(a.errors.values()) + a.malformed:,}"))
        for row in sorted(rows, key=lambda r: -r[0])[:TOP_ROWS]:
            apis.add_row(*row[1:])

        clients = _table("per client id", ("client id", "requests/s", "bytes/s", "responses with errors"))
        rows = []
        for cid, c in stats.clients.items():
            key = ("client", cid)
            was = before.get(key, (0, 0))
            current[key] = (c.requests, c.bytes)
            rows.append((c.bytes - was[1], Text("(null)" if cid is None else cid), _rate(c.requests, was[0], seconds),
                         _rate(c.bytes, was[1], seconds), f"{c.errors:,}"))
        for row in sorted(rows, key=lambda r: -r[0])[:TOP_ROWS]:
            clients.add_row(*row[1:])

        topics = _table("per topic", ("topic", "messages/s", "bytes/s", "records produced/s", "records fetched/s"))
        rows = []
        for name, t in stats.topics.items():
            key = ("topic", name)
            was = before.get(key, (0, 0, 0, 0))
            current[key] = (t.messages, t.bytes, t.records_produced, t.records_fetched)
            rows.append((t.bytes - was[1], Text(name), *(_rate(n, w, seconds) for n, w in zip(current[key], was))))
        for row in sorted(rows, key=lambda r: -r[0])[:TOP_ROWS]:
            topics.add_row(*row[1:])

        self.previous, self.at = current, now
        parts = [Text(f"kafkasniff --top: {frames:,} packets, {sum(a.requests + a.responses for a in stats.apis.values()):,} "
                      f"messages in {now - self.live.started:,.0f} s" + (f", kernel drops {drops:,}" if drops else "")),
                 apis, clients, topics, self._rebalances(), self._lagging()]
        return Stack(*(part for part in parts if part is not None))

    def _rebalances(self) -> Table | None:
        formed = [(gen.formed, group, gen) for group in self.live.stats.insight.groups.groups.values()
                  for gen in group.generations[-RECENT_REBALANCES:]]
        if not formed:
            return None
        table = _table("rebalances", ("formed", "group", "generation", "members", "rebalance ms", "cause"))
        for ts, group, gen in sorted(formed, key=lambda f: f[0])[-RECENT_REBALANCES:]:
            table.add_row(clock(ts), Text(group.group_id), str(gen.generation), str(len(gen.members)),
                          _ms(took_ms(gen)), Text("; ".join(t.text for t in causes(gen))))
        return table

    def _lagging(self) -> Table | None:
        positions = sorted(self.live.stats.insight.lag.positions.values(), key=lambda p: -p.last[4])[:TOP_ROWS]
        if not positions:
            return None
        table = _table("consumer lag (last fetch)", ("consumer", "topic", "partition", "lag", "max lag"))
        for p in positions:
            table.add_row(Text(p.consumer), Text(p.topic or "?"), str(p.partition), f"{p.last[4]:,}",
                          f"{p.max_lag[4]:,}")
        return table


# Prometheus histogram bounds in seconds, from half a millisecond to ten seconds.
LATENCY_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _histogram_buckets(hist) -> list[tuple[str, int]]:
    """Cumulative counts at LATENCY_BOUNDS_S from a LatencyHistogram (bucket edges within 1% of the bounds)."""
    counts = sorted((hist.upper_bound(bucket), n) for bucket, n in list(hist.buckets.items()))
    out, seen, at = [], 0, 0
    for bound in LATENCY_BOUNDS_S:
        while at < len(counts) and counts[at][0] <= bound * 1000:
            seen += counts[at][1]
            at += 1
        out.append((str(bound), seen))
    out.append(("+Inf", hist.count))
    return out


class MetricsCollector:
    """Prometheus metrics read from a LiveStats at each scrape (the capture loop only counts): counters and
    latency histograms per API, client id and topic, consumer-lag gauges, rebalances per group."""

    def __init__(self, live: LiveStats):
        self.live = live

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        stats = self.live.stats
        requests = CounterMetricFamily("kafkasniff_requests", "Kafka requests seen", labels=["api"])
        responses = CounterMetricFamily("kafkasniff_responses", "Kafka responses seen", labels=["api"])
        message_bytes = CounterMetricFamily("kafkasniff_message_bytes", "Bytes of Kafka messages",
                                            labels=["api", "kind"])
        errors = CounterMetricFamily("kafkasniff_errors", "Error codes in responses, malformed messages",
                                     labels=["api", "error"])
        latency = HistogramMetricFamily("kafkasniff_latency_seconds", "Request to response latency",
                                        labels=["api"])
        for a in list(stats.apis.values()):
            api = a.api_name or "unknown"
            requests.add_metric([api], a.requests)
            responses.add_metric([api], a.responses)
            message_bytes.add_metric([api, "request"], a.request_bytes)
            message_bytes.add_metric([api, "response"], a.response_bytes)
            for name, n in list(a.errors.items()) + ([("malformed", a.malformed)] if a.malformed else []):
                errors.add_metric([api, name], n)
            latency.add_metric([api], _histogram_buckets(a.latency), a.latency.total / 1000)
        yield from (requests, responses, message_bytes, errors, latency)

        client_requests = CounterMetricFamily("kafkasniff_client_requests", "Requests per client id",
                                              labels=["client_id"])
        client_bytes = CounterMetricFamily("kafkasniff_client_bytes", "Message bytes per client id",
                                           labels=["client_id"])
        client_errors = CounterMetricFamily("kafkasniff_client_error_responses", "Responses with errors per client id",
                                            labels=["client_id"])
        for cid, c in list(stats.clients.items()):
            label = [cid if cid is not None else ""]
            client_requests.add_metric(label, c.requests)
            client_bytes.add_metric(label, c.bytes)
            client_errors.add_metric(label, c.errors)
        yield from (client_requests, client_bytes, client_errors)

        topic_bytes = CounterMetricFamily("kafkasniff_topic_bytes", "Bytes of messages about a topic",
                                          labels=["topic"])
        records = CounterMetricFamily("kafkasniff_topic_records", "Records produced and fetched",
                                      labels=["topic", "direction"])
        for name, t in list(stats.topics.items()):
            topic_bytes.add_metric([name], t.bytes)
            records.add_metric([name, "produced"], t.records_produced)
            records.add_metric([name, "fetched"], t.records_fetched)
        yield from (topic_bytes, records)

        insight = stats.insight
        end_to_end = HistogramMetricFamily("kafkasniff_end_to_end_latency_seconds",
                                           "Produce request to Fetch response, per record", labels=["topic"])
        for topic, hist in list(insight.lag.latency.by_topic.items()):
            end_to_end.add_metric([topic], _histogram_buckets(hist), hist.total / 1000)
        lag = GaugeMetricFamily("kafkasniff_consumer_lag", "Records between a consumer's last fetch offset and "
                                "the partition's end", labels=["consumer", "topic", "partition"])
        for p in list(insight.lag.positions.values()):
            lag.add_metric([p.consumer, p.topic or "", str(p.partition)], p.last[4])
        committed = GaugeMetricFamily("kafkasniff_committed_lag", "Records between a group's committed offset "
                                      "and the log end seen", labels=["group", "topic", "partition"])
        for commit in list(insight.lag.commits.values()):
            row = insight.lag.commit_json(commit)
            if row["lag"] is not None:
                committed.add_metric([commit.group, commit.topic or "", str(commit.partition)], row["lag"])
        rebalances = CounterMetricFamily("kafkasniff_generations", "Consumer-group generations formed",
                                         labels=["group"])
        for group in list(insight.groups.groups.values()):
            rebalances.add_metric([group.group_id], len(group.generations))
        yield from (end_to_end, lag, committed, rebalances)


def serve_metrics(live: LiveStats, port: int, address: str = "0.0.0.0") -> None:
    """Serve the metrics on http://ADDRESS:PORT/metrics from a thread; OSError when the port is taken."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(live))
    start_http_server(port, address, registry=registry)
