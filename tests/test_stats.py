"""`decode --stats`: the latency histogram's error bound and memory bound, and the summary of a real
capture checked against tshark's reading of it."""

from __future__ import annotations

import json
import math
import pickle
import random

from click.testing import CliRunner

from kafkasniff.capture.files import open_capture
from kafkasniff.cli import main
from kafkasniff.analyses.histogram import LatencyHistogram
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.session import MessageEvent

CAPTURE = "captures/aiokafka_codecs.pcap"


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def test_percentiles_are_within_half_a_percent_and_the_maximum_is_exact():
    rng = random.Random(7)
    # log-uniform from 1 µs to 100 s, rounded to the microsecond like pcap timestamps
    values = [round(10 ** rng.uniform(-3, 5), 3) for _ in range(20_000)]
    hist = LatencyHistogram()
    for v in values:
        hist.add(v)
    for p in (1, 50, 90, 95, 99, 99.9, 100):
        exact = nearest_rank(values, p)
        assert abs(hist.percentile(p) - exact) <= exact * 0.005, p
    assert hist.max == max(values) and hist.percentile(100) == max(values)
    assert hist.count == 20_000
    # bounded by the value range, not the number of values: 1 µs .. 100 s spans ~1,852 buckets
    assert len(hist.buckets) <= math.ceil(math.log(1e5 / 1e-3) / math.log(1.01)) + 1


def test_memory_does_not_grow_with_the_number_of_latencies():
    hist = LatencyHistogram()
    for i in range(200_000):
        hist.add(0.25 + (i % 1000) * 0.001)  # 0.250 .. 1.249 ms
    assert hist.count == 200_000
    # a bucket per 1% from 0.250 ms (log(250) / log(1.01) = 554.9) to 1.249 ms (716.9), each of them used
    assert sorted(hist.buckets) == list(range(554, 717))


def test_equal_latencies_come_back_exactly_and_tiny_or_negative_ones_as_zero():
    hist = LatencyHistogram()
    for _ in range(3):
        hist.add(0.337)
    assert [hist.percentile(p) for p in (50, 95, 99)] == [0.337, 0.337, 0.337]
    zero = LatencyHistogram()
    zero.add(0.0)
    zero.add(-0.004)  # a capture clock stepping back
    assert zero.percentile(50) == 0.0 and zero.max == 0.0
    assert LatencyHistogram().percentile(50) is None
    assert LatencyHistogram().to_json() == {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}



def test_latencies_that_are_not_numbers_or_endless_count_without_failing():
    """Compiled, the bucket is computed into a C integer: NaN counts as no time and an endless latency as the
    longest one (31,700 years), as a negative one counts as zero, instead of an undefined conversion."""
    hist = LatencyHistogram()
    for ms in (math.nan, math.inf, -math.inf, 2.5, 1e300):
        hist.add(ms)
    assert hist.count == 5 and hist.min == 0.0 and hist.max == 1e15
    middle = int(math.log(2.5 / 1e-3) / math.log(1.01))  # 2.5 ms's bucket
    assert sorted(hist.buckets.items()) == [(-1, 2), (middle, 1), (4165, 2)]
    assert hist.to_json() == {"count": 5, "p50": round(1e-3 * 1.01 ** (middle + 0.5), 3), "p95": 1e15, "p99": 1e15,
                              "max": 1e15}
    assert pickle.loads(pickle.dumps(hist)).to_json() == hist.to_json()  # a worker's totals reach the parent

def stats_json(*args: str) -> tuple[dict, list[str]]:
    result = CliRunner().invoke(main, ["decode", "--stats", "--json", *args])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    return json.loads(lines[-1]), lines[:-1]


def test_stats_of_a_capture_agree_with_tshark():
    stats, event_lines = stats_json(CAPTURE)
    assert len(event_lines) == 115 + 5  # and the notices of the 5 consumers' Fetch requests the capture's end left
    # tshark 4.0.17 (which decodes every version aiokafka uses) gives the same message counts and
    # byte totals: `tshark -Y kafka -T fields -e kafka.api_key -e kafka.len -e kafka.request_frame`.
    assert [(a["api_name"], a["requests"], a["request_bytes"], a["responses"], a["response_bytes"])
            for a in stats["apis"]] == [
        ("Produce", 5, 5213, 5, 606), ("Fetch", 10, 1632, 5, 5608), ("ListOffsets", 5, 446, 5, 486),
        ("Metadata", 20, 696, 20, 10096), ("ApiVersions", 20, 540, 20, 4520)]
    # ... and, from its frame times, these exact latencies (ms, nearest rank): p50, p95, p99, max
    exact = {"Produce": (0.404, 0.644, 0.644, 0.644), "Fetch": (0.438, 0.601, 0.601, 0.601),
             "ListOffsets": (0.204, 0.333, 0.333, 0.333), "Metadata": (0.188, 0.414, 0.418, 0.418),
             "ApiVersions": (0.196, 0.528, 0.708, 0.708)}
    for a in stats["apis"]:
        lat = a["latency_ms"]
        assert lat["count"] == a["responses"]
        assert lat["max"] == exact[a["api_name"]][3]
        for got, want in zip((lat["p50"], lat["p95"], lat["p99"]), exact[a["api_name"]]):
            assert abs(got - want) <= want * 0.005 + 0.0005  # + rounding to 3 decimals
        assert a["errors"] == {} and a["malformed"] == 0
    assert stats["topics"] == [
        {"topic": f"aiokafka-{codec}", "messages": 24, "bytes": size, "records_produced": 8, "records_fetched": 8}
        for codec, size in (("gzip", 12100), ("lz4", 12107), ("none", 12872), ("snappy", 12214), ("zstd", 12040))]
    assert stats["clients"] == [{"client_id": "aiokafka-0.14.0", "requests": 40, "bytes": 18219, "errors": 0}] + [
        {"client_id": f"aiokafka-producer-{i}", "requests": 4, "bytes": size, "errors": 0}
        for i, size in zip(range(1, 6), (2628, 2242, 2294, 2248, 2212))]
    assert stats["sasl_tokens"] == 0 and stats["notices"] == {"unanswered": 5}


def test_stats_per_client_id_sum_to_the_messages_they_sent_and_received():
    stats, _ = stats_json(CAPTURE)
    with open_capture(CAPTURE) as reader:
        evs = [ev for ev in Analyzer().run(reader.segments()) if type(ev) is MessageEvent]
    assert sum(c["bytes"] for c in stats["clients"]) == sum(ev.message.size for ev in evs)
    assert sum(c["requests"] for c in stats["clients"]) == sum(a["requests"] for a in stats["apis"]) == 60


def test_stats_count_error_names_per_api():
    stats, _ = stats_json("captures/consumer_group.pcap")
    errors = {a["api_name"]: a["errors"] for a in stats["apis"] if a["errors"]}
    # kafka-python's first JoinGroup carries no member id; the broker asks for one
    assert errors == {"JoinGroup": {"MEMBER_ID_REQUIRED": 1}}
    assert [c["errors"] for c in stats["clients"] if c["client_id"] == "kafka-python-3.0.12"] == [1]


def test_stats_follow_the_filters_and_resolve_topic_ids():
    # confluent-kafka fetches with Fetch v16, which names topics by id only
    stats, lines = stats_json("--topic", "confluent-gzip", "--api", "fetch", "captures/confluent_codecs.pcap")
    assert len(lines) == 6
    assert [(a["api_name"], a["requests"], a["responses"]) for a in stats["apis"]] == [("Fetch", 3, 3)]
    assert [(t["topic"], t["records_produced"], t["records_fetched"]) for t in stats["topics"]] == [
        ("confluent-gzip", 0, 8)]


def test_the_bytes_line_says_when_it_counts_only_what_the_filters_pass():
    """A capture of TLS connections filtered by --api: 'bytes captured: 0' read as if nothing had been captured."""
    tls = "captures/tls/tls12_suites.pcap"
    last_lines = [CliRunner().invoke(main, ["decode", "--stats", *options, tls]).stdout.splitlines()[-1]
                  for options in ([], ["--api", "Produce"], ["--api", "Produce", "-j", "2"])]
    assert last_lines == [
        "bytes captured: 63,998 = 0 in messages + 0 in SASL tokens + 0 skipped + 63,998 TLS + 0 not Kafka; 0 missing "
        "from the capture",
        *["bytes of what the filters pass: 0 = 0 in messages + 0 in SASL tokens + 0 skipped + 0 TLS + 0 not Kafka; 0 "
          "missing from the capture"] * 2]


def test_stats_alone_print_only_the_tables():
    result = CliRunner().invoke(main, ["decode", "--stats", CAPTURE])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert not any("→" in line or "←" in line for line in lines)
    assert [line.strip() for line in lines if line.startswith("per ")] == [
        "per API (latency in ms)", "per topic", "per client id"]
    produce = next(line for line in lines if line.split()[:1] == ["Produce"])
    assert [cell.strip() for cell in produce.split("│")] == [
        "Produce", "5", "5", "5,213", "606", "0.405", "0.641", "0.641", "0.644", ""]
