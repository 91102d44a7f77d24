"""The Spark pipeline on the project's captures, run twice: in a local Spark (`local[*]`) and on
a real standalone cluster (a master and a worker on 127.0.0.1, see sparkcluster.py), one
session each for the module.

The tables must agree with `kafkasniff decode --json` message for message, and the groups and
partitions tables with `kafkasniff groups --json` and `lag --json`; a capture cut into rotated
files, with overlapping inputs and a client port reused, must give the tables of the whole
capture; the report's numbers must equal those computed from decode's and the commands' JSON.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import heapq
import json
import os
import math
import subprocess
import sys
import weakref
from array import array
from collections import Counter, defaultdict
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from urllib.parse import urlparse

import dpkt
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkasniff.capture.files import CONNECTION_BUCKETS, CaptureReader, open_capture
from kafkasniff.capture.packets import FrameParser
from kafkasniff.cli import main
from kafkasniff.pipeline import reading
from kafkasniff.pipeline.reading import connection_key, read_local, shard_rows
from kafkasniff.pipeline.sparkenv import INSTALL_PYSPARK
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.session import MessageEvent
from kafkasniff.stream.tcp import TcpReassembler
from pcapkit import write_pcap

pytest.importorskip("pyspark")

from kafkasniff.pipeline import build  # noqa: E402
from kafkasniff.pipeline.build import build_tables  # noqa: E402
from kafkasniff.pipeline.inputs import InputError, expand_local  # noqa: E402
from kafkasniff.pipeline.sparkenv import sql_session, start_context, stop_context  # noqa: E402
from kafkasniff.pipeline.tables import (DECODED_TABLES, GROUPS, MESSAGES, PARTITIONS, RECORDS, TABLES,  # noqa: E402
                                        raw_schema)

CAPTURES = sorted((Path(__file__).resolve().parents[1] / "captures").glob("*.pcap"))
SPLIT_CAPTURE = "confluent_codecs.pcap"  # several connections and a 1 MiB Produce over many segments


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    from sparkcluster import StandaloneCluster

    with StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")) as url:
        yield url


@pytest.fixture(scope="module", params=["local[*]", "standalone"])
def spark(request, monkeypatch_module):
    """One session per master for the module (a session takes seconds to start)."""
    if request.param == "standalone":
        master = request.getfixturevalue("standalone_cluster")
        monkeypatch_module.setenv("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this one
    else:
        master = request.param
    context, log_dir = start_context(master)
    yield sql_session()
    stop_context(context, log_dir)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def decode_json(path: Path) -> list[dict]:
    result = CliRunner().invoke(main, ["decode", "--json", str(path)])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    return [e for e in events if e["kind"] in ("request", "response")]


@pytest.fixture(scope="session")
def decoded() -> dict[str, list[dict]]:
    return {str(path): decode_json(path) for path in CAPTURES}


def read_table(spark, directory: Path, table) -> list[dict]:
    """Rows as dicts, timestamps as epoch microseconds (PySpark would make local-time datetimes)."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(directory / table.name))
    columns = [F.unix_micros(c.name).alias(c.name) if c.type == "timestamp" else F.col(c.name)
               for c in table.columns]
    return [row.asDict(recursive=True) for row in frame.select(*columns).collect()]


def read_tables(spark, directory: Path) -> dict[str, list[dict]]:
    return {table.name: read_table(spark, directory, table) for table in DECODED_TABLES}


# ---------------------------------------------------------------- the analysed tables against the commands

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
# keys of the commands' JSON that are capture times (seconds; the tables hold timestamps)
TIME_KEYS = {"started", "first_join", "formed", "completed", "assigned_at", "ts", "committed_at",
             "first_produced_at", "last_produced_at", "high_watermark_at", "log_end_at"}
MAP_COLUMNS = {"errors", "assignment"}  # (pyarrow reads a map as a list of pairs)


def with_micros(value, key=None):
    """Times as microseconds since the epoch, whether a table's timestamps or the commands' seconds."""
    if isinstance(value, datetime.datetime):
        return (value - EPOCH) // datetime.timedelta(microseconds=1)
    if isinstance(value, dict):
        return {k: with_micros(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [with_micros(v, key) for v in value]
    return micros(value) if key in TIME_KEYS and isinstance(value, float) else value


def analysed_rows(directory: Path, table) -> list[dict]:
    """An analysed table's rows, as its Parquet file holds them (read with pyarrow: Spark would hand nested
    timestamps over in the local time zone)."""
    import pyarrow.parquet as pq

    if not list((directory / table.name).glob("*.parquet")):
        return []
    rows = pq.read_table(directory / table.name).to_pylist()
    return [with_micros({k: dict(v) if k in MAP_COLUMNS and v is not None else v for k, v in row.items()})
            for row in rows]


def command_json(*args) -> dict | list:
    result = CliRunner().invoke(main, [*args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return with_micros(json.loads(result.stdout))


GENERATION_KEYS = ("generation", "protocol", "protocol_type", "assignor", "started", "first_join", "formed",
                   "completed", "causes", "errors", "events")
MEMBER_KEYS = ("member_id", "client_id", "host", "instance_id", "leader", "subscription", "assignment",
               "assigned_at")


def groups_of(rows: list[dict]) -> list[dict]:
    """`groups --json` made back from the groups table: generations from their members' rows, in order."""
    groups = {}
    for row in rows:
        group = groups.setdefault(row["group_id"], {"group_id": row["group_id"], "state": row["group_state"],
                                                    "generations": [], "after_last_generation": None})
        if row["generation"] is None:
            if row["started"] is not None or row["causes"] or row["errors"]:
                group["after_last_generation"] = {key: row[key] for key in ("started", "causes", "errors")}
            continue
        generations = group["generations"]
        if not generations or generations[-1]["generation"] != row["generation"]:
            generations.append({**{key: row[key] for key in GENERATION_KEYS}, "took_ms": row["rebalance_ms"],
                                "members": []})
        if row["member_id"] is not None:
            generations[-1]["members"].append({key: row[key] for key in MEMBER_KEYS})
    return list(groups.values())


def lag_of(rows: list[dict]) -> dict:
    """`lag --json` made back from the partitions table (but the samples and end_to_end)."""
    made = {"partitions": [], "consumers": [], "committed": [], "log_end": []}
    for row in rows:
        made["partitions"].append({k: v for k, v in row.items() if k not in ("consumers", "committed")})
        where = {"topic": row["topic"], "partition": row["partition"]}
        made["consumers"] += [{**where, **consumer} for consumer in row["consumers"]]
        made["committed"] += [{**where, **commit} for commit in row["committed"]]
        if row["log_end_offset"] is not None:
            made["log_end"].append({**where, "offset": row["log_end_offset"], "ts": row["log_end_at"]})
    return made


def in_time_order(paths) -> list[str]:
    """Captures by their first packet: the order the pipeline takes them in, and the commands read them in."""
    def first_ts(path):
        with open(path, "rb") as f:
            return next(iter(dpkt.pcap.Reader(f)))[0]

    return [str(path) for path in sorted(paths, key=first_ts)]


def assert_analysed_tables_equal_the_commands(directory: Path, paths: list[str]) -> tuple[list, list]:
    """The groups and partitions tables under `directory` hold what `groups --json` and `lag --json` say of
    the captures read in this order; returns both tables' rows."""
    groups, partitions = analysed_rows(directory, GROUPS), analysed_rows(directory, PARTITIONS)
    assert groups_of(groups) == command_json("groups", "--json", *paths)
    lag = command_json("lag", "--json", *paths)
    made = lag_of(partitions)
    for position in lag["lag"]["consumers"]:
        del position["samples"]

    def unordered(rows):  # the table holds consumers and commits by partition, the JSON by consumer or group
        return sorted(json.dumps(row, sort_keys=True) for row in rows)

    assert made["partitions"] == lag["partitions"] and made["log_end"] == lag["lag"]["log_end"]
    assert unordered(made["consumers"]) == unordered(lag["lag"]["consumers"])
    assert unordered(made["committed"]) == unordered(lag["lag"]["committed"])
    return groups, partitions


@pytest.fixture(scope="module")
def all_run(spark, tmp_path_factory):
    """All captures through the `spark` command in one run."""
    out = tmp_path_factory.mktemp("spark") / "all"
    result = CliRunner().invoke(main, ["spark", *map(str, CAPTURES), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.stdout, read_tables(spark, out)


def micros(ts: float) -> int:
    """Seconds as the tables' microseconds (rows.micros: round(ts, 6), exactly; ts * 1e6 is a microsecond off for some
    nanosecond times, test_times_are_the_microseconds_decode_prints)."""
    from kafkasniff.pipeline.rows import micros as exact

    return exact(ts)


def order(row: dict) -> tuple:
    ts = row["ts"] if isinstance(row["ts"], int) else micros(row["ts"])
    return ts, row["src"], row["dst"], row["kind"], row["correlation_id"]


@pytest.mark.parametrize("capture", [p.name for p in CAPTURES])
def test_messages_agree_with_decode_json(capture, all_run, decoded):
    path = str(next(p for p in CAPTURES if p.name == capture))
    assert_messages_agree(decoded[path], [r for r in all_run[2]["messages"] if r["capture_files"] == [path]])


def assert_messages_agree(events: list[dict], table_rows: list[dict]) -> None:
    expected = sorted(events, key=order)
    rows = sorted(table_rows, key=order)
    assert len(rows) == len(expected) > 0
    stream_shift = {r["stream"] - e["stream"] for r, e in zip(rows, expected)}
    assert len(stream_shift) == 1, "stream numbers keep decode's order within a capture"
    for row, event in zip(rows, expected):
        for key in ("kind", "src", "dst", "api_key", "api_name", "api_version", "header_version", "correlation_id",
                    "client_id", "size", "topics", "errors", "trailing_bytes"):
            assert row[key] == event[key], (key, event)
        tls = event.get("tls") or {}
        assert (row["tls_version"], row["tls_cipher"]) == (tls.get("version"), tls.get("cipher"))
        assert abs(row["ts"] - micros(event["ts"])) <= 1
        malformed = event["malformed"] or {}
        assert (row["malformed"], row["malformed_offset"]) == (malformed.get("reason"), malformed.get("offset"))
        if event["kind"] == "response":
            assert row["inferred"] == event["inferred"] and row["expects_response"] is None
            if event["latency_ms"] is None:
                assert row["latency_ms"] is None
            else:
                assert row["latency_ms"] == pytest.approx(event["latency_ms"], abs=0.0005)
            assert row["throttle_time_ms"] == (event["body"] or {}).get("throttle_time_ms")
        else:
            assert row["expects_response"] == event["expects_response"] and row["inferred"] is None
            assert row["latency_ms"] is None and row["throttle_time_ms"] is None


def json_records(event: dict) -> list[dict]:
    """Records in a decode --json event, with the topic (name or id) and partition around them."""
    found = []

    def walk(value, topic, partition):
        if isinstance(value, list):
            for item in value:
                walk(item, topic, partition)
        elif isinstance(value, dict):
            topic = value.get("name", value.get("topic", value.get("topic_id", topic)))
            partition = value.get("index", value.get("partition_index", value.get("partition", partition)))
            for key, inner in value.items():
                if key == "records" and isinstance(inner, list) and inner and "magic" in inner[0]:
                    for batch in inner:
                        for record in batch.get("records", ()):
                            found.append({"batch": batch, "topic": topic, "partition": partition, **record})
                else:
                    walk(inner, topic, partition)

    walk(event["body"], None, None)
    return found


def size_of(encoded: dict | None) -> int | None:
    return None if encoded is None else len(base64.b64decode(encoded["base64"]))


def topic_ids_in(events) -> dict[str, str]:
    """Topic id -> name from decode's Metadata/CreateTopics responses."""
    names = {}
    for event in events:
        if event["kind"] == "response" and event["api_name"] in ("Metadata", "CreateTopics"):
            for topic in event["body"]["topics"]:
                if topic.get("topic_id") and topic.get("name"):
                    names[topic["topic_id"]] = topic["name"]
    return names


def test_records_agree_with_decode_json(all_run, decoded):
    records = all_run[2]["records"]
    names = {}
    for events in decoded.values():
        names.update(topic_ids_in(events))
    expected = Counter()
    record_counts = {}
    for path, events in decoded.items():
        for event in events:
            found = json_records(event)
            if found:
                record_counts[(path, event["src"], event["dst"], event["correlation_id"])] = len(found)
            for r in found:
                timestamp = r["timestamp"] if r["timestamp"] is not None and r["timestamp"] >= 0 else None
                expected[(event["kind"] == "request", event["correlation_id"], event["src"],
                          names.get(r["topic"], r["topic"]), r["partition"], r["offset"], timestamp,
                          size_of(r["key"]), size_of(r["value"]), len(r["headers"]), r["batch"]["codec"],
                          r["batch"]["is_control"])] += 1
    messages = {(r["connection_id"], r["correlation_id"], r["kind"]): r for r in all_run[2]["messages"]}
    got = Counter()
    for r in records:
        src = messages[(r["connection_id"], r["correlation_id"],
                        "request" if r["direction"] == "produce" else "response")]["src"]
        got[(r["direction"] == "produce", r["correlation_id"], src, r["topic"], r["partition"], r["offset"],
             r["timestamp"] // 1000 if r["timestamp"] is not None else None, r["key_size"], r["value_size"],
             r["header_count"], r["codec"], r["is_control"])] += 1
    assert got == expected and len(records) == sum(expected.values()) > 300
    assert {r["topic"] for r in records if r["topic_id"]} <= set(names.values())
    assert all(r["topic"] for r in records), "every topic id in the captures is named by a Metadata response"
    assert {r["value_size"] for r in records if r["topic"] == "confluent-none"} >= {1048600}
    counted = {(r["capture_files"][0], r["src"], r["dst"], r["correlation_id"]): r["record_count"]
               for r in all_run[2]["messages"] if r["record_count"] is not None}
    assert {k: v for k, v in counted.items() if v} == record_counts


def test_connections_agree_with_decode_json(all_run, decoded):
    """Each capture's connections as `decode` has them; the run takes its inputs as one capture, which goes on after
    each file but the last: a connection open at the end of its file ends there (`capture end`) unless the run's
    capture goes on for more than 900 s after its last packet (`idle`, as tcp.flush and the sweeps end it)."""
    connections = all_run[2]["connections"]
    assert sorted(c["stream"] for c in connections) == list(range(len(connections)))
    run_end = max(c["last_seen"] for c in connections)  # (microseconds)

    def ending(c) -> str:
        in_its_file = endings[frozenset((c["client"], c["server"]))]
        return "idle" if in_its_file == "capture end" and run_end - c["last_seen"] > 900_000_000 else in_its_file

    idle = 0
    for path, events in decoded.items():
        endings = tcp_endings(Path(path))
        per_stream = defaultdict(lambda: {"requests": 0, "responses": 0, "bytes_to_server": 0, "bytes_to_client": 0,
                                          "client_ids": []})
        for e in events:
            tally = per_stream[e["stream"]]
            if e["kind"] == "request":
                tally.update(client=e["src"], server=e["dst"])
                if e["client_id"] not in tally["client_ids"]:
                    tally["client_ids"].append(e["client_id"])
            tally[e["kind"] + "s"] += 1
            tally["bytes_to_server" if e["kind"] == "request" else "bytes_to_client"] += 4 + e["size"]
        rows = sorted((c for c in connections if c["capture_files"] == [path]), key=lambda c: c["stream"])
        kafka = [c for c in rows if c["protocol"] == "kafka"]
        assert len(kafka) == len(per_stream)
        shift = rows[0]["stream"]
        for c in kafka:
            expected = per_stream[c["stream"] - shift]
            assert {k: c[k] for k in expected} == expected
            assert c["handshake"] and c["gaps"] == 0
            assert c["end_reason"] == ending(c)
            assert c["first_seen"] <= c["last_seen"] and c["packets"] > 0
            idle += c["end_reason"] == "idle"
    assert idle > 0


def read_segments(path: Path):
    with open(path, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        linktype, packets = reader.datalink(), list(reader)
    parser = FrameParser()
    segments = [parser.parse(frame, linktype, ts) for ts, frame in packets]
    assert None not in segments
    return linktype, packets, segments


def tcp_endings(path: Path) -> dict[frozenset, str]:
    """How each connection of a capture ends, from the TCP flags alone (one connection per 4-tuple)."""
    flags = defaultdict(set)
    for s in read_segments(path)[2]:
        flags[frozenset((f"{s.src}:{s.sport}", f"{s.dst}:{s.dport}"))].add(
            "rst" if s.flags & dpkt.tcp.TH_RST else f"fin {s.src}:{s.sport}" if s.flags & dpkt.tcp.TH_FIN else "")
    return {key: "rst" if "rst" in seen else "fin" if len({f for f in seen if f.startswith("fin")}) == 2
            else "capture end" for key, seen in flags.items()}


def split_capture(path: Path, directory: Path) -> tuple[list[Path], int, int]:
    """Cut a capture into three files (as tcpdump -C would): the first cut inside the largest
    segment's frame, the second at two thirds. Returns the files and both cut indexes."""
    linktype, packets, segments = read_segments(path)
    # just after the first full-size segment of the largest frame: the frame continues in the next file
    first_cut = max(range(len(segments)), key=lambda i: len(segments[i].payload)) + 1
    second_cut = len(packets) * 2 // 3
    files = []
    for part, (start, end) in enumerate(((0, first_cut), (first_cut, second_cut), (second_cut, len(packets))), 1):
        files.append(directory / f"{path.stem}.pcap{part}")
        with open(files[-1], "wb") as out:
            writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=linktype)
            for ts, frame in packets[start:end]:
                writer.writepkt(frame, ts)
    for cut in (first_cut, second_cut):
        before = {connection_key(s) for s in segments[:cut]}
        assert before & {connection_key(s) for s in segments[cut:]}, "a connection spans the cut"
    return files, first_cut, second_cut


def without(rows: list[dict], *columns: str) -> Counter:
    return Counter(json.dumps({k: v for k, v in r.items() if k not in columns}, sort_keys=True, default=str)
                   for r in rows)


def test_rotated_files_give_the_tables_of_the_whole_capture(spark, tmp_path):
    whole = next(p for p in CAPTURES if p.name == SPLIT_CAPTURE)
    parts, _, _ = split_capture(whole, tmp_path)
    build_tables(spark.sparkContext, expand_local([str(whole)])[0], str(tmp_path / "whole"))
    # the middle file goes through Hadoop (binaryFiles), the others through the local reader
    inputs = expand_local([str(parts[0]), str(parts[2])])[0]
    from kafkasniff.pipeline.inputs import expand_uris

    inputs += expand_uris(spark.sparkContext, [parts[1].as_uri()])
    summary = build_tables(spark.sparkContext, inputs, str(tmp_path / "split"))
    assert summary.files == 3 and summary.warnings == []
    whole_tables, split_tables = read_tables(spark, tmp_path / "whole"), read_tables(spark, tmp_path / "split")

    assert without(split_tables["messages"], "capture_files") == without(whole_tables["messages"], "capture_files")
    assert without(split_tables["records"]) == without(whole_tables["records"])
    assert without(split_tables["connections"], "capture_files") == \
        without(whole_tables["connections"], "capture_files")
    assert analysed_rows(tmp_path / "split", PARTITIONS) == analysed_rows(tmp_path / "whole", PARTITIONS) != []
    expected = sorted(decode_json(whole), key=order)
    assert [r["stream"] for r in sorted(whole_tables["messages"], key=order)] == [e["stream"] for e in expected]

    def names(files):
        return [os.path.basename(urlparse(f).path) for f in files]

    big = [r for r in split_tables["messages"] if r["api_name"] == "Produce" and r["size"] > 1048600]
    assert [names(r["capture_files"]) for r in big] == [[parts[0].name, parts[1].name]]
    spanning = [names(c["capture_files"]) for c in split_tables["connections"] if len(c["capture_files"]) > 1]
    assert [parts[0].name, parts[1].name] in spanning and any(parts[2].name in n for n in spanning)


def port_reuse_capture(directory: Path, reused: bool = True) -> Path:
    """kafka-python's 20 short connections, one after another, all from one client port (each a new
    SYN after the last one's FIN; `reused` False: each from its own, as captured), merged in time with a consumer
    group's two long connections."""
    sys.path.insert(0, str(Path(__file__).parent))
    from pcapkit import Packet, merged, read_packets, rewrite, shifted, tcp_of, write_pcap

    captures = Path(__file__).resolve().parents[1] / "captures"
    short = []
    for ts, frame in read_packets(captures / "kafka_python_api_versions.pcap"):
        tcp = tcp_of(frame)
        field = "sport" if tcp.dport == 9092 else "dport"
        short.append(Packet(ts, rewrite(frame, **{field: 40000}) if reused else frame))
    group = read_packets(captures / "consumer_group.pcap")
    return write_pcap(directory / "reuse.pcap", merged(short, shifted(group, short[0].ts - group[0].ts)))


@pytest.mark.parametrize("through", ["each task reading every file", "the shuffle", "the shuffle, files shared out"])
def assert_messages_and_connections_equal_decode(tables: dict, whole: Path) -> list[dict]:
    """The messages table is, row for row, what `decode --json` says of the whole capture (stream numbers included),
    and the connections table counts its requests and responses; returns the rows in that order."""
    expected = sorted(decode_json(whole), key=order)
    rows = sorted(tables["messages"], key=order)
    assert len(rows) == len(expected) > 100
    for row, event in zip(rows, expected):
        for key in ("stream", "kind", "src", "dst", "api_key", "api_name", "api_version", "correlation_id",
                    "client_id", "size", "topics", "errors", "trailing_bytes"):
            assert row[key] == event[key], (key, event)
        assert row["ts"] == micros(event["ts"])
        if event["kind"] == "response":
            assert (row["latency_ms"] is None) == (event["latency_ms"] is None)
            assert bool(row["inferred"]) == bool(event.get("inferred"))
    streams = defaultdict(lambda: [0, 0])
    for event in expected:
        streams[event["stream"]][event["kind"] == "response"] += 1
    connections = {c["stream"]: c for c in tables["connections"]}
    assert len(connections) == len(tables["connections"])  # (no two rows numbered alike)
    assert {s: [connections[s]["requests"], connections[s]["responses"]] for s in streams} == streams
    return rows


@pytest.mark.parametrize("through", ["each task reading every file", "the shuffle"])
def test_files_are_taken_in_the_order_of_their_first_packets_whatever_their_names(spark, tmp_path, monkeypatch,
                                                                                  through):
    """A capture of times in hundredths of a second (many packets share one) cut in three, each time between a SYN
    and the rest of its connection's start (SYN-ACK, ACK, first request) of the same time, the files named against
    their order (c, b, a), with a file repeating packets on both sides of the first cut named to come first (0):
    taken by name, a later file's packets came first at a cut (a connection's start before its SYN made two rows
    of it, and moved every later stream number). The tables equal what `decode --json` says of the whole capture
    (stream numbers included)."""
    if through == "the shuffle":
        monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", 0)
    linktype, packets, segments = read_segments(port_reuse_capture(tmp_path, reused=False))
    packets = [(math.floor(ts * 100) / 100, frame) for ts, frame in packets]

    def tied(at: int) -> bool:  # a connection's SYN before `at`, and after it the rest of its start, of one time
        key = connection_key(segments[at - 1])
        start = [packets[later][0] for later in range(at, len(packets)) if connection_key(segments[later]) == key][:3]
        return segments[at - 1].flags & 0x3F == dpkt.tcp.TH_SYN and start == [packets[at - 1][0]] * 3

    cuts = [next(at for at in range(len(packets) * share // 3, len(packets)) if tied(at)) for share in (1, 2)]

    def write(name: str, some) -> Path:
        return write_pcap(tmp_path / name, some, linktype)

    whole = write("whole.pcap", packets)
    parts = [write("c.pcap", packets[:cuts[0]]), write("b.pcap", packets[cuts[0]:cuts[1]]),
             write("a.pcap", packets[cuts[1]:]), write("0.pcap", packets[cuts[0] - 40:cuts[0] + 40])]
    out = tmp_path / "tables"
    result = CliRunner().invoke(main, ["spark", *map(str, parts), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert_messages_and_connections_equal_decode(read_tables(spark, out), whole)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("through", ["each task reading every file", "the shuffle"])
def test_overlapping_captures_that_each_missed_packets_give_decodes_answers(spark, tmp_path, monkeypatch, through,
                                                                            seed):
    """Two captures of the same traffic in times of hundredths of a second (many packets share one), each missing a
    random tenth of the packets the other holds, the first cut in two (rotated). The bigger is taken first at a tie,
    and the packets it missed went after all it holds of that time: a connection's SYN after its SYN-ACK, a request
    after its response; connections opened at one time were numbered by the file their first packets were taken
    from. At a tie each file's own order is kept, a packet both hold fed once, and connections numbered as the
    files holding their first packets order them. The tables equal what `decode --json` says of the whole capture,
    stream numbers included."""
    import random

    if through == "the shuffle":
        monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", 0)
    linktype, packets, _ = read_segments(port_reuse_capture(tmp_path, reused=False))
    packets = [(math.floor(ts * 100) / 100, frame) for ts, frame in packets]
    rng = random.Random(seed)
    first, second = [], []
    for packet in packets:
        missed = rng.random()
        if missed >= 0.1:
            first.append(packet)
        if missed < 0.1 or missed >= 0.2:
            second.append(packet)
    cut = rng.randrange(len(first) // 4, 3 * len(first) // 4)

    def write(name: str, some) -> Path:
        return write_pcap(tmp_path / name, some, linktype)

    whole = write("whole.pcap", packets)
    parts = [write("a.pcap", first[:cut]), write("a.pcap1", first[cut:]), write("b.pcap", second)]
    out = tmp_path / "tables"
    result = CliRunner().invoke(main, ["spark", *map(str, parts), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert_messages_and_connections_equal_decode(read_tables(spark, out), whole)


@pytest.mark.parametrize("through", ["each task reading every file", "the shuffle"])
def test_a_capture_whose_clock_steps_back_gives_decodes_answers(spark, tmp_path, monkeypatch, through):
    """A capture whose clock was stepped back (NTP) mid-way: from two fifths of its packets on, each is half the
    capture's span earlier, so the connections open across the step have packets whose times go back. Given alone,
    the tables equal what `decode --json` (and `groups`, `lag`) says of it, in the file's order; cut in three at the
    step and after it, what they say of the files merged as mergecap merges them (the file whose next packet is the
    earliest goes next: the files after the step start before the first). Sorted by the packets' own times, the
    connections across the step were each decoded as two, and every later stream number was off."""
    if through == "the shuffle":
        monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", 0)
    linktype, packets, segments = read_segments(port_reuse_capture(tmp_path))
    step, cut = len(packets) * 2 // 5, len(packets) * 7 // 10
    back = (packets[-1][0] - packets[0][0]) / 2
    stepped = packets[:step] + [(ts - back, frame) for ts, frame in packets[step:]]
    across = {connection_key(s) for s in segments[:step]} & {connection_key(s) for s in segments[step:]}
    assert len(across) >= 2 and stepped[step][0] < stepped[step - 1][0]
    whole = write_pcap(tmp_path / "stepped.pcap", stepped, linktype)
    pieces = [stepped[:step], stepped[step:cut], stepped[cut:]]
    parts = [write_pcap(tmp_path / f"stepped.pcap{n}", piece, linktype) for n, piece in enumerate(pieces)]
    in_merge = list(heapq.merge(*pieces, key=lambda packet: packet[0]))
    assert in_merge != stepped
    merged = write_pcap(tmp_path / "merged.pcap", in_merge, linktype)
    for inputs, reference in (([whole], whole), (parts, merged)):
        out = tmp_path / f"tables{len(inputs)}"
        result = CliRunner().invoke(main, ["spark", *map(str, inputs), "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert_messages_and_connections_equal_decode(read_tables(spark, out), reference)
        groups, _ = assert_analysed_tables_equal_the_commands(out, [str(reference)])
        assert {row["group_id"] for row in groups} == {"kafkasniff-group"}


def test_connections_silent_past_the_idle_timeout_end_as_in_decode(spark, tmp_path):
    """A consumer group's two long connections go silent a little after the middle of their capture, while
    kafka-python's connections go on for 1,100 s: one speaks again 1,000 s later (ended idle at that packet, which
    opens a connection captured from its middle), the other never does (ended idle, as the capture ends more than
    900 s after its last packet). A decode task sees only a connection's own packets, for which the capture ends
    at its last: the finishing ends it idle where the run's capture went on. The tables equal what `decode --json`
    says, and each connection ends as `decode`'s reassembler ends it."""
    from pcapkit import Packet, merged, read_packets, tcp_of

    captures = Path(__file__).resolve().parents[1] / "captures"
    group, other = read_packets(captures / "consumer_group.pcap"), read_packets(captures / "kafka_python_codecs.pcap")
    silent = []
    for n, (ts, frame) in enumerate(group):
        ports = {tcp_of(frame).sport, tcp_of(frame).dport}
        if n < 80 or 33280 in ports:  # (the other long connection, 33286, says nothing after packet 80)
            silent.append(Packet(ts + 1000 if n >= 80 else ts, frame))
    span = other[-1].ts - other[0].ts
    stretched = [Packet(group[0].ts + (ts - other[0].ts) * 1100 / span, frame) for ts, frame in other]
    whole = write_pcap(tmp_path / "silent.pcap", merged(silent, stretched))
    out = tmp_path / "tables"
    result = CliRunner().invoke(main, ["spark", str(whole), "--out", str(out)])
    assert result.exit_code == 0, result.output
    tables = read_tables(spark, out)
    assert_messages_and_connections_equal_decode(tables, whole)
    reassembler, ended = TcpReassembler(), {}
    with open_capture(str(whole)) as reader:
        for segment in reader.segments():
            ended.update((e.conn.stream, e.reason) for e in reassembler.feed(segment)
                         if type(e).__name__ == "StreamEnd" and e.direction == 2)
    ended.update((e.conn.stream, e.reason) for e in reassembler.flush()
                 if type(e).__name__ == "StreamEnd" and e.direction == 2)
    assert {c["stream"]: c["end_reason"] for c in tables["connections"]} == ended
    assert sum(reason == "idle" for reason in ended.values()) == 2


@pytest.mark.parametrize("through", ["each task reading every file", "the shuffle"])
@pytest.mark.parametrize("capture, seed", [("rebalance_kafka_python", 1), ("rebalance_confluent_kafka", 3)])
def test_captures_that_lost_packets_give_the_commands_analyses(spark, tmp_path, monkeypatch, through, capture, seed):
    """A rebalancing consumer group's capture that lost 3 % of its packets: the holes are given up 10 s on, in
    `decode` at a sweep of all its connections (before the first packet of the whole second after), which a Spark
    task, seeing one connection's packets, does with the time the capture reached at each (and where the run's
    capture ends): the groups and partitions tables equal what `groups --json` and `lag --json` say, and the
    messages what `decode --json` says. When a task gave a hole up at its connection's next packet, the messages
    it held reached the analyses later than in the commands (a generation, a fetch's group), on these two
    captures."""
    import random

    from pcapkit import read_packets

    if through == "the shuffle":
        monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", 0)
    rng = random.Random(seed)
    packets = read_packets(Path(__file__).resolve().parents[1] / "captures" / f"{capture}.pcap")
    lossy = write_pcap(tmp_path / "lossy.pcap", [packet for packet in packets if rng.random() >= 0.03])
    out = tmp_path / "tables"
    result = CliRunner().invoke(main, ["spark", str(lossy), "--out", str(out)])
    assert result.exit_code == 0, result.output
    tables = read_tables(spark, out)
    assert sum(c["gaps"] for c in tables["connections"]) >= 10
    assert_messages_and_connections_equal_decode(tables, lossy)
    groups, _ = assert_analysed_tables_equal_the_commands(out, [str(lossy)])
    assert groups


@pytest.mark.parametrize("second_misses", [0, 1])
def test_thousands_of_packets_of_one_time_in_two_files_are_ordered_in_linear_time(tmp_path, second_misses):
    """Hostile input: a connection's 60,000 segments, all of one time, in each of two files (the same packets; or the
    second missing the first of them, which takes the order the files give). The copies were looked for among every
    segment of that time before, 1.8 billion comparisons (50,000 took 44 s); now each is taken once, in about a
    second."""
    import time

    import pyarrow as pa

    from kafkasniff.pipeline.connections import decode_segment_rows

    key, count = "10.0.0.1 40000 10.0.0.2 9092", 60_000
    rows = [[(key, 5.0, file, index, True, 1000 + 10 * index, 1, 0x18, b"0123456789", 0, 5.0)
             for index in range(second_misses if file else 0, count)] for file in (0, 1)]
    started = time.monotonic()
    facts = decode_segment_rows(rows, ["a.pcap", "b.pcap"], frozenset(), str(tmp_path), "_staging", "t0")
    assert time.monotonic() - started < 20
    staged = next(f.staged for f in map(build.RunFact._make, facts) if f.table_name == "connections")
    with pa.ipc.open_stream(staged) as connections:
        assert connections.read_all().column("packets").to_pylist() == [count]


@pytest.mark.parametrize("through", ["each task reading every file", "the shuffle", "the shuffle, files shared out"])
def test_a_capture_split_overlapping_and_rotated_gives_decodes_answers(spark, tmp_path, monkeypatch, through):
    """Inputs that are one capture: cut in three (as tcpdump -C would, inside connections), plus a file
    repeating packets on both sides of the first cut (overlapping inputs). The tables equal what `decode
    --json` says of the whole capture, stream numbers included, and identical packets count once: whether each
    task reads every file and keeps its connections (reading.shard_rows) or the files go through the shuffle, each
    read by one task or shared out among several (build.read_shares)."""
    if through.startswith("the shuffle"):
        monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", 0)
    whole = port_reuse_capture(tmp_path)
    linktype, packets, segments = read_segments(whole)
    reused = {connection_key(s) for s in segments if 40000 in (s.sport, s.dport)}
    assert len(reused) == 1
    cuts = (len(packets) // 3, 2 * len(packets) // 3)
    parts = []
    for number, (start, end) in enumerate(((0, cuts[0]), (cuts[0], cuts[1]), (cuts[1], len(packets)),
                                           (cuts[0] - 40, cuts[0] + 40))):
        parts.append(tmp_path / f"part{number}.pcap")
        with open(parts[-1], "wb") as out:
            writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=linktype)
            for ts, frame in packets[start:end]:
                writer.writepkt(frame, ts)
    if through.endswith("shared out"):  # only the biggest file is big: read by two tasks, the others by one
        sizes = sorted(part.stat().st_size for part in parts)
        assert sizes[-2] < sizes[-1] < 2 * sizes[-2]
        monkeypatch.setattr(build, "READ_TASK_BYTES", sizes[-2])
    out = tmp_path / "tables"
    result = CliRunner().invoke(main, ["spark", *map(str, parts), "--out", str(out)])
    assert result.exit_code == 0, result.output
    tables = read_tables(spark, out)

    rows = assert_messages_and_connections_equal_decode(tables, whole)
    on_reused_port = [c for c in tables["connections"] if c["client"] == "127.0.0.1:40000"]
    assert len(on_reused_port) == 20 and {c["end_reason"] for c in on_reused_port} == {"fin"}
    whole_capture = TcpReassembler()  # as `decode` reassembles the whole capture
    for segment in segments:
        whole_capture.feed(segment)
    assert sum(c["packets"] for c in tables["connections"]) == len(packets) - whole_capture.late_segments > 300
    # (the file of repeats starts before the second part: the packets both hold are taken from it, once: the count)
    assert {f for r in rows for f in r["capture_files"]} == set(map(str, parts))
    printed = next(line for line in result.stdout.splitlines() if line.startswith("│"))
    cells = [c.strip() for c in printed.strip("│").split("│")]
    assert cells[2:6] == [str(len(packets) + 80), str(len(tables["connections"])), str(len(rows)),
                          str(len(tables["records"]))]
    groups, _ = assert_analysed_tables_equal_the_commands(out, [str(whole)])
    assert {row["group_id"] for row in groups} == {"kafkasniff-group"}


def test_one_file_is_shared_out_without_the_shuffle_as_decode_reads_it(spark, tmp_path, monkeypatch):
    """A run of one file: each of the tasks reads it whole and decodes the connections hashed to it
    (reading.shard_rows), no segment crossing into the JVM; the 20 connections on one reused port are
    decode's, and the summary counts the file once. Bigger files go through the shuffle, with the same tables,
    read by one task or, bigger still, shared out among two read tasks (build.read_shares); a session's first
    run through it starts the Python workers beside."""
    path = port_reuse_capture(tmp_path)
    with open_capture(str(path)) as reader:
        segments = list(reader.segments())
    expected = decode_json(path)
    size = path.stat().st_size
    tracker = spark.sparkContext.statusTracker()
    jobs_tasks = {}
    for unshuffled_max, read_task_bytes, name in ((size, size, "unshuffled"), (size - 1, size, "shuffled"),
                                                  (size - 1, size // 2 + 1, "read by two tasks")):
        monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", unshuffled_max)
        monkeypatch.setattr(build, "READ_TASK_BYTES", read_task_bytes)
        spark.sparkContext.setJobGroup(f"{tmp_path.name} {name}", name)
        if name == "shuffled":  # as a session's first run (this module's session has run others)
            monkeypatch.setattr(build, "_CONTEXTS_RUN", weakref.WeakSet())
        summary = build_tables(spark.sparkContext, expand_local([str(path)])[0], str(tmp_path / name), partitions=3)
        assert (summary.files, summary.bytes, summary.segments) == (1, size, len(segments))
        assert summary.messages == len(expected)
        jobs_tasks[name] = [[tracker.getStageInfo(stage).numTasks for stage in sorted(tracker.getJobInfo(job).stageIds)]
                            for job in sorted(tracker.getJobIdsForGroup(f"{tmp_path.name} {name}"))]
    # Tasks per stage of each job but the finishing (however many tasks its work is worth). Without the shuffle:
    # read and decode. Through it, a session's first run also starts the Python workers as the shuffle's job is
    # planned (a task per partition: build._start_python_workers), a later run does not; the read takes a task
    # per file, two for the file read by two tasks.
    assert {name: jobs[:-1] for name, jobs in jobs_tasks.items()} == {
        "unshuffled": [[3]], "shuffled": [[3], [1, 3]], "read by two tasks": [[2, 3]]}
    shuffled, unshuffled = read_tables(spark, tmp_path / "shuffled"), read_tables(spark, tmp_path / "unshuffled")
    assert_messages_agree(expected, unshuffled["messages"])
    assert [r["stream"] for r in sorted(unshuffled["messages"], key=order)] == \
        [e["stream"] for e in sorted(expected, key=order)]
    read_by_two = read_tables(spark, tmp_path / "read by two tasks")
    for table in ("messages", "records", "connections"):
        assert without(unshuffled[table]) == without(shuffled[table]) == without(read_by_two[table]), table
    assert len([c for c in unshuffled["connections"] if c["client"] == "127.0.0.1:40000"]) == 20
    assert analysed_rows(tmp_path / "unshuffled", PARTITIONS) == analysed_rows(tmp_path / "shuffled", PARTITIONS) \
        == analysed_rows(tmp_path / "read by two tasks", PARTITIONS)


def test_a_big_file_is_shared_out_among_the_cores_left_to_it(tmp_path, monkeypatch):
    """Through the shuffle, a local file of more than READ_TASK_BYTES is read by a task per READ_TASK_BYTES, no
    more than the cores left to each of the run's big files; a compressed, a small or an unreadable one by one."""
    from kafkasniff.pipeline.inputs import CaptureFile

    capture = Path(__file__).resolve().parents[1] / "captures" / "consumer_group.pcap"
    compressed = tmp_path / "consumer_group.pcap.gz"
    compressed.write_bytes(gzip.compress(capture.read_bytes()))
    monkeypatch.setattr(build, "READ_TASK_BYTES", 1000)
    shares = {(name, size, cores, big): build.read_shares(CaptureFile(str(path), size, True), cores, big)
              for name, path in (("plain", capture), ("gzip", compressed), ("missing", tmp_path / "none.pcap"))
              for size, cores, big in ((1000, 8, 1), (1001, 8, 1), (3500, 8, 1), (3500, 2, 1), (3500, 8, 3),
                                       (3500, 8, 5), (9000, 8, 2))}
    assert {key: count for key, count in shares.items() if count != 1} == {
        ("plain", 1001, 8, 1): 2, ("plain", 3500, 8, 1): 4, ("plain", 3500, 2, 1): 2, ("plain", 3500, 8, 3): 2,
        ("plain", 9000, 8, 2): 4}


def test_a_file_read_by_two_tasks_is_reported_once_and_its_segments_split_between_them(tmp_path):
    """The read tasks sharing a file (build.read_shares) each send on the segments of their connections, with
    their indexes in the whole file; only the first reports the file, its frames and its warnings."""
    data = (Path(__file__).resolve().parents[1] / "captures" / "consumer_group.pcap").read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[:-37])  # inside the last record
    reports, rows = [], {}
    for share in (None, 0, 1):
        rows[share] = [row for batch in read_local(str(cut), "cut.pcap", 0, reports.append,
                                                   *((share, 2) if share is not None else ()))
                       for row in batch.to_pylist()]
    whole, first, second = reports
    assert sorted(rows[0] + rows[1], key=lambda row: row["index"]) == rows[None]
    assert len(rows[0]) == 76 and len(rows[1]) == 38 and not {r["key"] for r in rows[0]} & {r["key"] for r in rows[1]}
    assert whole == {**first, "segments": 114} and first["segments"] == 76 and second == {"segments": 38}
    assert whole["warnings"] == [f"cut.pcap: capture ends inside the record at byte {len(data) - 82} (29 of 66 "
                                 "bytes; file truncated?)"]


def test_each_tasks_share_of_the_files_comes_in_the_shuffles_order(tmp_path, monkeypatch):
    """Without the shuffle, each task's segments (reading.shard_rows) come as a shuffled partition's would: sorted
    by (key, time reached, file, index), each connection in one task only, every segment of the files in some task,
    when packet times go back inside a file and a second file overlaps the first in time."""
    _, packets, _ = read_segments(port_reuse_capture(tmp_path))
    stepped = [(ts - 0.5 if i % 7 == 3 else ts, frame) for i, (ts, frame) in enumerate(packets)]
    files = [tmp_path / "stepped.pcap", tmp_path / "overlapping.pcap"]
    for path, part in zip(files, (stepped, [(ts - 1.0, frame) for ts, frame in packets[len(packets) // 3:]])):
        with open(path, "wb") as out:
            writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
            for ts, frame in part:
                writer.writepkt(frame, ts)
    every = sorted(row for number, path in enumerate(files)
                   for batch in read_local(str(path), path.name, number, lambda read: None)
                   for row in zip(*(column.to_pylist() for column in batch.columns)))
    monkeypatch.setattr(reading, "BATCH_SEGMENTS", 100)  # several batches a task
    paths = [str(path) for path in files]
    owners = reading.connection_shares(paths, 3)
    shares = [[row for batch in shard_rows(paths, shard, owners, lambda read: None, []) for row in batch]
              for shard in range(3)]
    assert all(shares) and sorted(row for share in shares for row in share) == every
    for share in shares:
        assert share == sorted(share, key=lambda row: (row[0], row[10], row[2], row[3]))
    keys = [{row[0] for row in share} for share in shares]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    times = defaultdict(list)  # each connection's times in the order read (file, index)
    for row in sorted(every, key=lambda row: (row[0], row[2], row[3])):
        times[row[0]].append(row[1])
    assert sum(t != sorted(t) for t in times.values()) == 6  # times do go back, in six connections


@pytest.mark.parametrize("shards", [2, 3, 5])
def test_each_task_gets_about_as_many_bytes_of_connections(shards, monkeypatch):
    """reading.connection_shares: the connections' buckets by their captured bytes over all the run's files, the
    biggest first, each to the task with the fewest bytes so far; each task's share (shard_rows) is then that
    table's, and the tasks' bytes differ by less than the biggest bucket's. Dealing the buckets round (a hash, as
    without files) leaves the tasks further apart (checked: here it would)."""
    from test_capture_files import _bucket

    paths = [str(path) for path in CAPTURES]
    sizes = Counter()  # captured bytes per bucket, over every file
    with_key = {}  # each connection's bucket
    for path in paths:
        with open_capture(path) as reader:
            for ts, linktype, frame, _ in reader.frames():
                seg = FrameParser().parse(frame, linktype, ts)
                if seg is not None and not isinstance(seg, str):
                    sizes[_bucket(seg)] += len(frame)
                    with_key[connection_key(seg)] = _bucket(seg)
    loads, owner = [0] * shards, {}
    for bucket in sorted(sizes, key=lambda bucket: (-sizes[bucket], bucket)):
        owner[bucket] = loads.index(min(loads))
        loads[owner[bucket]] += sizes[bucket]
    assert max(loads) - min(loads) < max(sizes.values())
    hashed = [sum(size for bucket, size in sizes.items() if bucket % shards == task) for task in range(shards)]
    assert max(hashed) - min(hashed) > max(loads) - min(loads)
    dealt_round = array("H", [bucket % shards for bucket in range(CONNECTION_BUCKETS)]).tobytes()
    assert reading.connection_shares((), shards) == dealt_round
    owners = reading.connection_shares(paths, shards)
    # a task takes the run's table as it is given and counts nothing itself (one counting a file still being
    # written could disagree with another about a connection)
    monkeypatch.setattr(CaptureReader, "bucket_bytes", lambda reader: pytest.fail("a task counted bytes"))
    for shard in range(shards):
        keys = {row[0] for batch in shard_rows(paths, shard, owners, lambda read: None, []) for row in batch}
        assert keys == {key for key, bucket in with_key.items() if owner[bucket] == shard}
    assert reading.connection_shares(paths, 1) is None


def test_only_uncompressed_local_files_skip_the_shuffle(tmp_path, monkeypatch):
    """Their sizes bound what each task holds; gzip does not bound it, and a URI is not read by the tasks."""
    path = port_reuse_capture(tmp_path)
    copy = tmp_path / "copy.pcap"
    copy.write_bytes(path.read_bytes())
    zipped = tmp_path / "reuse.pcap.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    size = path.stat().st_size
    monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", 2 * size)
    files = expand_local([str(path), str(copy)])[0]
    assert build.unshuffled(files) and build.unshuffled(files[:1])
    assert not build.unshuffled(expand_local([str(zipped)])[0])
    assert not build.unshuffled(files[:1] + expand_local([str(zipped)])[0])
    assert not build.unshuffled([files[0], files[1]._replace(local=False)])
    monkeypatch.setattr(build, "UNSHUFFLED_MAX_BYTES", 2 * size - 1)
    assert not build.unshuffled(files) and build.unshuffled(files[1:])


def decoded_in_one_task(path, out) -> list:
    """The run facts of one decode task given every connection of the capture at `path`, staged under `out`."""
    from kafkasniff.pipeline.connections import decode_segment_rows

    return [build.RunFact._make(fact) for fact in decode_segment_rows(
        shard_rows([str(path)], 0, None, lambda read: None, []), [str(path)], frozenset(), str(out), "_staging",
        "00000-0")]


def records_staged_ten_at_a_time(tmp_path, monkeypatch):
    """(out, the run facts, the records' staged file's fact) of kafka-python's codecs capture decoded in one task
    that stages its records in batches of 10."""
    from kafkasniff.pipeline import writing

    monkeypatch.setattr(writing.StagedTables, "ROWS_PER_GROUP", 10)
    out = tmp_path / "tables"
    facts = decoded_in_one_task(Path(__file__).resolve().parents[1] / "captures" / "kafka_python_codecs.pcap", out)
    return out, facts, next(f for f in facts if f.table_name == "records")


def test_staged_messages_hold_each_text_once_a_batch_and_nulls_where_decode_has_none(tmp_path, monkeypatch):
    """A decode task stages the messages as columns (rows.MessageColumns): text dictionary-encoded, each distinct
    value once a batch (a connection's id, endpoints and client id repeat in every message), numbers null where the
    message has none (a request's latency, a response's expects_response), lists as lists; batch after batch."""
    import pyarrow as pa

    from kafkasniff.pipeline import writing

    monkeypatch.setattr(writing.StagedTables, "ROWS_PER_GROUP", 30)
    out = tmp_path / "tables"
    path = Path(__file__).resolve().parents[1] / "captures" / "kafka_python_codecs.pcap"
    facts = decoded_in_one_task(path, out)
    staged = next(f for f in facts if f.table_name == "messages")
    batches = list(writing.staged_batches(writing.output_fs(str(out))[0], staged.staged))
    assert len(batches) > 1 and sum(batch.num_rows for batch in batches) == staged.rows
    connections = {f.connection_id for f in facts if f.connection_id is not None}
    for batch in batches:
        ids = batch.column("connection_id")
        assert ids.type == pa.dictionary(pa.int32(), pa.string())
        assert len(ids.dictionary) == len(set(ids.to_pylist())) and set(ids.to_pylist()) <= connections
        assert batch.column("kind").dictionary.to_pylist() in (["request", "response"], ["response", "request"])
        assert batch.column("capture_files").to_pylist() == [[str(path)]] * batch.num_rows
        for row in batch.to_pylist():
            response = row["kind"] == "response"
            assert (row["latency_ms"] is not None) <= response and (row["throttle_time_ms"] is None) >= (not response)
            assert (row["expects_response"] is None) == response and (row["inferred"] is None) != response
            assert row["malformed"] is row["malformed_offset"] is row["tls_version"] is None
            assert row["errors"] == [] and type(row["topics"]) is list and row["size"] > 0
    rows = [row for batch in batches for row in batch.to_pylist()]
    lines = CliRunner().invoke(main, ["decode", "--json", str(path)]).stdout.splitlines()
    events = sorted((e for e in map(json.loads, lines) if "kind" in e),
                    key=lambda e: (micros(e["ts"]), e["correlation_id"], e["kind"]))
    assert [(r["api_name"], r["correlation_id"], r["client_id"], r["topics"], r["record_count"]) for r in
            sorted(rows, key=lambda r: (r["ts"], r["correlation_id"], r["kind"]))] == [
        (e["api_name"], e["correlation_id"], e["client_id"], e["topics"],
         len(json_records(e)) if e["api_name"] in ("Produce", "Fetch") and json_records(e) else None)
        for e in events]


def test_a_connection_s_client_ids_are_its_requests_null_ones_too(tmp_path):
    """The connections table lists a connection's client ids as its requests give them, in order of first use: a
    request whose client id is null (the protocol allows it; a corrupt header reads so too) is one of them, as the
    messages table and `decode --json` show it, not left out."""
    import pyarrow as pa
    from pcapkit import TcpConversation, write_pcap

    from kafkasniff.pipeline import writing
    from kafkasniff.protocol.encoder import encode_request

    conversation = TcpConversation(("10.9.0.1", 40000), ("10.9.0.2", 9092))
    for correlation_id, client_id in enumerate(["first", None, "first", "second", None]):
        conversation.send(True, encode_request(18, 2, correlation_id, client_id, {}))
    path = write_pcap(tmp_path / "ids.pcap", conversation.close())
    out = tmp_path / "tables"
    staged = next(f for f in decoded_in_one_task(path, out) if f.table_name == "connections")
    rows = pa.Table.from_batches(writing.staged_batches(writing.output_fs(str(out))[0], staged.staged)).to_pylist()
    assert [row["client_ids"] for row in rows] == [["first", None, "second"]]
    lines = CliRunner().invoke(main, ["decode", "--json", str(path)]).stdout.splitlines()
    assert [e["client_id"] for e in map(json.loads, lines) if e.get("kind") == "request"] == [
        "first", None, "first", "second", None]


def test_records_past_64_bits_are_null_and_their_table_is_written(tmp_path):
    """A batch whose base offset and timestamp put its records' past 64 bits (hostile, or corrupt) once stopped the
    decode task: pyarrow cannot hold such a number. They are null in the records table; every other value stands."""
    import pyarrow.parquet as pq
    from pcapkit import TcpConversation, write_pcap

    from kafkasniff.pipeline.writing import finish_staged
    from kafkasniff.protocol.encoder import encode_request
    from kafkasniff.protocol.records_encoder import Record, encode_record_batch

    records = encode_record_batch([Record(key=b"k", value=b"v1"), Record(value=b"v22", headers=[("h", b"x")]),
                                   Record(key=b"kk", timestamp_delta=-2**62)],
                                  base_offset=2**63 - 2, base_timestamp=2**62, producer_id=7)
    produce = encode_request(0, 9, 5, "hostile", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "far", "PartitionData": [{"Index": 2, "Records": records}]}]})
    path = write_pcap(tmp_path / "far.pcap",
                      TcpConversation(("10.9.0.1", 40000), ("10.9.0.2", 9092)).send(True, produce).close())
    out = tmp_path / "tables"
    facts = decoded_in_one_task(path, out)
    streams = {f.connection_id: 0 for f in facts if f.connection_id is not None}
    staged = [f.staged for f in facts if f.table_name == "records" and f.staged is not None]
    assert [finish_staged("records", file, str(out), "00000", streams, {}) for file in staged] == [3]
    rows = pq.read_table(out / "records").to_pylist()
    assert [(r["topic"], r["partition"], r["offset"], r["timestamp"], r["key_size"], r["value_size"],
             r["header_count"], r["producer_id"], r["crc_valid"]) for r in rows] == [
        ("far", 2, 2**63 - 2, None, 1, 2, 0, 7, True),
        ("far", 2, 2**63 - 1, None, None, 3, 1, 7, True),
        ("far", 2, None, datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc), 2, None, 0, 7, True)]


def test_a_decode_task_writes_records_as_they_come_and_the_finishing_gathers_them_into_row_groups(tmp_path,
                                                                                                 monkeypatch):
    """A batch of segments of records-heavy traffic carries millions of records: they were held until the batch
    was done (a Spark worker at 910 MB on a 73 MB capture), and the finishing read the staged file whole. Now a
    decode task stages them once ROWS_PER_GROUP have come (with the message that passed it), and the finishing reads
    a staged batch at a time and writes row groups of at least its own ROWS_PER_GROUP (the last one smaller)."""
    import pyarrow.parquet as pq

    from kafkasniff.pipeline import writing

    monkeypatch.setattr(writing._DayFiles, "ROWS_PER_GROUP", 25)
    out, facts, staged = records_staged_ten_at_a_time(tmp_path, monkeypatch)
    batches = [batch.num_rows for batch in writing.staged_batches(writing.output_fs(str(out))[0], staged.staged)]
    assert len(batches) > 3 and sum(batches) == staged.rows and max(batches) < staged.rows / 2
    streams = {f.connection_id: 0 for f in facts if f.connection_id is not None}
    assert writing.finish_staged("records", staged.staged, str(out), "00000", streams, {}) == staged.rows
    layout = pq.ParquetFile(next((out / "records").glob("date=*/part-00000.parquet"))).metadata
    groups = [layout.row_group(i).num_rows for i in range(layout.num_row_groups)]
    assert sum(groups) == staged.rows and len(groups) > 1 and min(groups[:-1]) >= 25 and max(groups) < 25 + 10


def test_rows_dated_on_many_days_are_finished_with_few_files_open_and_few_rows_held(tmp_path, monkeypatch):
    """Hostile input may date every packet on another day: each day is a folder, and a file was open for each day
    until the end (a capture of random times: as many open files as days) and each batch was filtered once per
    day. Now a pass over the staged file writes at most OPEN_FILES days (the others wait for the next pass), a day's
    rows sorted together, and at most about ROWS_PER_GROUP rows wait: every row is written once, in its day's one
    file."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from kafkasniff.pipeline import writing

    monkeypatch.setattr(writing._DayFiles, "ROWS_PER_GROUP", 3)
    monkeypatch.setattr(writing._DayFiles, "OPEN_FILES", 4)
    out, facts, staged = records_staged_ten_at_a_time(tmp_path, monkeypatch)
    filesystem = writing.output_fs(str(out))[0]
    batches = list(writing.staged_batches(filesystem, staged.staged))
    day = 86_400_000_000
    redated, expected, row = [], {}, 0
    for batch in batches:  # the run's row i on day 7i mod 40 of 2020: a batch's ten rows on ten days
        days = [(7 * i) % 40 for i in range(row, row + batch.num_rows)]
        row += batch.num_rows
        times = pa.array([18_262 * day + d * day + 1 for d in days], batch.schema.field("ts").type)
        redated.append(batch.set_column(batch.schema.get_field_index("ts"), "ts", times))
        for d in days:
            expected[d] = expected.get(d, 0) + 1
    writer = writing.StagedWriter(filesystem, staged.staged, batches[0].schema)
    for batch in redated:
        writer.write(batch)
    writer.close()

    opened, passes = [0, 0], []

    class CountedWriter(pq.ParquetWriter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened[0] += 1
            opened[1] = max(opened)

        def close(self):
            super().close()
            opened[0] -= 1

    read_staged = writing.staged_batches

    def counted_batches(*args):
        passes.append(1)
        return read_staged(*args)

    monkeypatch.setattr(writing.pq, "ParquetWriter", CountedWriter)
    monkeypatch.setattr(writing, "staged_batches", counted_batches)
    streams = {f.connection_id: 0 for f in facts if f.connection_id is not None}
    assert writing.finish_staged("records", staged.staged, str(out), "00000", streams, {}) == staged.rows
    assert (len(passes), opened) == (10, [0, 4])
    folders = sorted((out / "records").iterdir())
    assert (staged.rows, len(folders), len(expected)) == (80, 40, 40)
    for d, folder in zip(sorted(expected), folders):
        assert folder.name == f"date={datetime.date(2020, 1, 1) + datetime.timedelta(days=d)}"
        assert [file.name for file in folder.iterdir()] == ["part-00000.parquet"]
        layout = pq.ParquetFile(folder / "part-00000.parquet").metadata
        assert max(layout.row_group(i).num_rows for i in range(layout.num_row_groups)) <= 3
        rows = pq.read_table(folder / "part-00000.parquet")
        assert rows.num_rows == expected[d]
        assert pc.all(pc.equal(pc.floor_temporal(rows.column("ts"), unit="day"),
                               pa.scalar(datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
                                         + datetime.timedelta(days=d)))).as_py()


def test_a_message_of_millions_of_records_is_handed_on_a_chunk_at_a_time(tmp_path):
    """A few KB of compressed records can be millions (a zstd batch of 7-byte records: 5 KB for 9 million). A
    message's record columns were made whole (a decode task at 749 MB for that 6 KB capture); the walker hands them
    on RECORDS_PER_CHUNK at a time, and once rows_per_group are held the table writes them (`full`)."""
    import cramjam
    from pcapkit import TcpConversation, write_pcap

    from kafkasniff.pipeline.rows import RECORDS_PER_CHUNK, RecordColumns
    from kafkasniff.protocol.encoder import encode_request
    from kafkasniff.protocol.records_encoder import encode_record_batch

    count = 3 * RECORDS_PER_CHUNK + 5
    record = b"\x0c\x00\x00\x00\x01\x01\x00"  # 6 bytes follow: no key, no value, no header
    records = encode_record_batch([], codec="zstd", compressed_payload=bytes(cramjam.zstd.compress(record * count)),
                                  record_count=count, base_offset=100)
    produce = encode_request(0, 9, 5, "many", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "many", "PartitionData": [{"Index": 0, "Records": records}]}]})
    path = write_pcap(tmp_path / "many.pcap",
                      TcpConversation(("10.9.0.1", 40000), ("10.9.0.2", 9092)).send(True, produce).close())
    with open_capture(str(path)) as reader:
        event = next(ev for ev in Analyzer().run(reader.segments()) if type(ev) is MessageEvent)
    written = []

    def full():
        batch = columns.batch(raw_schema(RECORDS))
        written.append((batch.num_rows, batch.column("offset")[0].as_py(), batch.column("topic")[0].as_py()))
        columns.clear()

    columns = RecordColumns(10, full)
    assert columns.add(event, "connection", "many") == count
    assert written == [(RECORDS_PER_CHUNK, 100, "many")] * 3 and len(columns) == 5


def test_ipv6_connections_give_decodes_messages(spark, tmp_path):
    """A segment's endpoints travel in its connection's key only (with which way it goes): IPv6 addresses
    and ports come back whole, each message from its sender."""
    sys.path.insert(0, str(Path(__file__).parent))
    from pcapkit import Packet, as_ipv6, read_packets, write_pcap

    source = next(p for p in CAPTURES if p.name == "consumer_group.pcap")
    ipv6 = write_pcap(tmp_path / "ipv6.pcap", [Packet(ts, as_ipv6(frame)) for ts, frame in read_packets(source)])
    build_tables(spark.sparkContext, expand_local([str(ipv6)])[0], str(tmp_path / "tables"))
    rows = read_table(spark, tmp_path / "tables", MESSAGES)
    assert {r["src"].rsplit(":", 1)[0] for r in rows} == {"[fd00::7f00:1]"}
    assert_messages_agree(decode_json(ipv6), rows)


def test_a_capture_without_packets_gives_empty_tables(spark, tmp_path):
    empty = tmp_path / "empty.pcap"
    with open(empty, "wb") as out:
        dpkt.pcap.Writer(out, linktype=dpkt.pcap.DLT_EN10MB)
    out = tmp_path / "tables"
    (out / "messages").mkdir(parents=True)
    (out / "messages" / "old.parquet").write_bytes(b"an earlier run's file")
    summary = build_tables(spark.sparkContext, expand_local([str(empty)])[0], str(out))
    assert (summary.files, summary.segments, summary.connections, summary.messages, summary.records) == (1, 0, 0, 0, 0)
    assert sorted(p.name for p in out.iterdir()) == sorted(t.name for t in TABLES), "no staging left"
    assert all([p.name for p in (out / t.name).iterdir()] == ["_SUCCESS"] for t in TABLES)
    result = CliRunner().invoke(main, ["report", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"][0]["messages"] == 0


def test_python_workers_talk_to_the_jvm_over_a_unix_socket(spark):
    """Not loopback TCP, where a task's small writes wait on delayed acknowledgements (sparkenv's setting): each
    worker's daemon was told so by its JVM, in local mode and on the cluster's executors alike."""
    if tuple(int(part) for part in spark.version.split(".")[:2]) < (4, 1):
        pytest.skip(f"Spark {spark.version} has no Unix socket for its Python workers (4.1 has)")
    def told(_):
        yield os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "").lower()  # (as the daemon reads it)

    assert spark.sparkContext.parallelize(range(2), 2).mapPartitions(told).collect() == ["true", "true"]


def test_the_unix_socket_is_asked_for_only_where_python_has_one(monkeypatch):
    """PySpark 4.1+ refuses to start a context told to use Unix sockets where Python's socketserver has none
    (Windows): there the workers keep loopback TCP."""
    import socketserver

    from kafkasniff.pipeline.sparkenv import unix_socket_settings

    assert unix_socket_settings() == {"spark.python.unix.domain.socket.enabled": "true"}
    monkeypatch.delattr(socketserver, "UnixStreamServer")
    assert unix_socket_settings() == {}


def test_the_sql_side_and_the_rdd_jobs_share_python_workers(spark):
    """A mapInArrow task and an RDD job's task run in the same Python workers (sparkenv's setting): the job
    finishing a shuffled run finds the workers its decode tasks started, and the shuffle's tasks those started by
    build._start_python_workers. Without the setting, each side has workers of its own and no pid is shared."""
    import pyarrow as pa

    def arrow_pids(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()] * batch.num_rows})

    def rdd_pids(_):
        yield os.getpid()

    on_sql_side = {row.pid for row in spark.range(2, numPartitions=2).mapInArrow(arrow_pids, "pid long").collect()}
    assert set(spark.sparkContext.parallelize(range(2), 2).mapPartitions(rdd_pids).collect()) & on_sql_side


def test_the_driver_s_jvm_takes_sparkenv_s_options(spark):
    """The driver's JVM runs as sparkenv asks: C1 only, the serial collector, and no bytecode verification of the
    classes of Spark's jars (0.4-0.7 s of every start). That option is ignored where unrecognised, so a misspelt one
    would start the JVM without it: the JVM's own values are read back."""
    jvm = spark.sparkContext._jvm
    diagnostic = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.com.sun.management.HotSpotDiagnosticMXBean._java_lang_class)
    values = {name: diagnostic.getVMOption(name).getValue()
              for name in ("TieredStopAtLevel", "UseSerialGC", "BytecodeVerificationRemote")}
    assert values == {"TieredStopAtLevel": "1", "UseSerialGC": "true", "BytecodeVerificationRemote": "false"}


_A_COMMAND_S_CONTEXT = """
import json, pathlib, sys, tempfile, time
from pyspark.sql import SparkSession
from kafkasniff.pipeline.build import build_tables
from kafkasniff.pipeline.inputs import expand_local
from kafkasniff.pipeline.sparkenv import start_context, stop_context

context, log_dir = start_context("local[2]", {"spark.driver.extraJavaOptions": "-Dkafkasniff.probe=given"})
summary = build_tables(context, expand_local([sys.argv[1]])[0], tempfile.mkdtemp())
sql_side = SparkSession._instantiatedSession is not None
jvm = context._jvm
diagnostic = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
    jvm.com.sun.management.HotSpotDiagnosticMXBean._java_lang_class)
options = [jvm.System.getProperty("kafkasniff.probe"), diagnostic.getVMOption("BytecodeVerificationRemote").getValue(),
           jvm.System.getProperty("log4j.configurationFile") == f"file:{log_dir / 'log4j2.properties'}"]
socket_file = pathlib.Path(context._accumulatorServer.server_address)  # (the accumulator server's)
was_socket = socket_file.is_socket()
started = time.monotonic()
stop_context(context, log_dir)
print(json.dumps({"messages": summary.messages, "sql_side": sql_side, "stop_seconds": time.monotonic() - started,
                  "log": log_dir.exists(), "options": options, "socket": [str(socket_file), was_socket]}))

"""


def test_a_command_s_spark_context_runs_without_the_sql_side_and_stops_at_once(decoded):
    """In a process of its own, as the `spark` command runs (the module's context is this process's one): an
    unshuffled run makes no SparkSession (1.5 s of the driver's JVM, sparkenv.sql_session), and the context stops
    without PySpark's wait for its accumulator server's thread, which polls the JVM's connection once a second
    (measured: 1.0 s at the end of every command, 0.09 s of it the JVM's), and without leaving that server's Unix
    socket file behind. Driver options given with --conf are added to sparkenv's (its log's file, its JVM options),
    not put in their place."""
    import subprocess

    capture = next(path for path in CAPTURES if path.name == SPLIT_CAPTURE)
    done = subprocess.run([sys.executable, "-c", _A_COMMAND_S_CONTEXT, str(capture)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ran = json.loads(done.stdout)
    assert (ran["messages"], ran["sql_side"], ran["log"]) == (len(decoded[str(capture)]), False, False)
    assert ran["options"] == ["given", "false", True]
    socket_file, was_socket = ran["socket"]
    assert was_socket and not Path(socket_file).exists()  # (the process ended before the server's thread)
    assert ran["stop_seconds"] < 0.5, ran


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (Spark's `percentile`, numpy's default)."""
    ordered = sorted(values)
    position = p * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@settings(max_examples=3000, deadline=None)
@given(ts=st.floats(0, 4e9) | st.integers(0, 4 * 10**18).map(lambda nanoseconds: nanoseconds / 1e9))
def test_times_are_the_microseconds_decode_prints(ts):
    """A time in the tables is round(ts, 6) in microseconds (what `decode --json` prints): the exact product rounded
    half to even. ts * 1e6 rounds once more, onto a half for some nanosecond captures' times (a microsecond off)."""
    exact = (Decimal(ts) * 1_000_000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
    assert micros(ts) == int(exact)
    assert Decimal(micros(ts)) / 1_000_000 == Decimal(repr(round(ts, 6)))


def test_topic_ids_in_staged_messages_are_named_list_by_list():
    """The finishing names the topic ids in each message's topics list as decode names them (names and ids the
    run never named stay as they are, null lists stay null), in chunks Arrow may have sliced or left empty."""
    import pyarrow as pa

    from kafkasniff.pipeline.writing import _named_in_lists

    of_id = {"id-1": "orders", "id-2": "payments"}
    lists = [["id-1"], None, [], ["orders", "id-2", "id-9"], ["id-2", None], None, ["id-1", "id-1"]]
    column = pa.chunked_array([pa.array(lists, pa.list_(pa.string())).slice(1), pa.array([], pa.list_(pa.string())),
                               pa.array(lists[:2], pa.list_(pa.string()))])
    named = _named_in_lists(column, of_id)
    assert named.type == pa.list_(pa.string())
    assert named.to_pylist() == [None, [], ["orders", "payments", "id-9"], ["payments", None], None,
                                 ["orders", "orders"], ["orders"], None]


def test_staged_seens_are_merged_in_key_order_a_batch_at_a_time(tmp_path, monkeypatch):
    """The analyses read the decode tasks' staged Seens in capture order: tasks of many sizes (one empty), each
    sorting runs of a bounded size (a segment's Seens may straddle two) and merging them, as soon as there are
    MERGED_AT_ONCE of a generation, and at its end into one file when more than it may leave are left (else left as
    they are: here two); batches small enough to end anywhere, keys that tie on time, file and index and differ in
    the sequence number, messages released by waits that ended (before the packets of their time, by where their
    connections were opened) and by a connection's end (time infinite) after every segment. However many tasks a
    run has, the analyses merge at most FILES_MERGED files, or one a task."""
    import marshal
    import random

    from kafkasniff.pipeline import analysis

    monkeypatch.setattr(analysis, "_BATCH_ROWS", 7)
    monkeypatch.setattr(analysis.StagedSeen, "RUN_BYTES", 200)  # (task, seq) marshals to 12 bytes: 17 a run
    monkeypatch.setattr(analysis.StagedSeen, "MERGED_AT_ONCE", 3)
    merges = []
    merge = analysis.StagedSeen._merge
    monkeypatch.setattr(analysis.StagedSeen, "_merge", lambda self, files: merges[-1].append(
        [rows for _, rows, _ in files]) or merge(self, files))
    rng = random.Random(16)
    staged_files, left, every = [], [], []
    for task, rows in enumerate((0, 1, 5, 34, 40, 133)):
        merges.append([])
        staged = analysis.StagedSeen(str(tmp_path), "_staging", f"t{task}", files_left=2)
        for seq in range(rows):
            position = (rng.choice([1.5, 2.0, 2.25, analysis.AT_THE_END]), rng.randrange(-1, 3),
                        rng.randrange(4) * 5 + task)
            opened = analysis.IN_A_PACKET if position[1] >= 0 else (rng.choice([0.5, 1.0]), rng.randrange(2), task)
            staged.add(position, opened, (task, seq))
            every.append((*position, *opened, seq, (task, seq)))
        closed = staged.close()
        left.append([files_rows for _, files_rows in closed])
        staged_files += [path for path, _ in closed]
    # runs of 17 (the last one shorter); three runs make one file of the next generation; a task's end leaves two
    # files as they are (34 rows) and merges more (133 rows: two of the second generation, two runs)
    assert merges == [[], [], [], [], [[17, 17, 6]], [[17, 17, 17], [17, 17, 17], [51, 51, 17, 14]]]
    assert left == [[], [1], [5], [17, 17], [40], [133]]
    assert sorted(p.name for p in (tmp_path / "_staging" / "seen").iterdir()) == sorted(
        Path(path).name for path in staged_files), "the files left, the runs merged into them deleted"
    merged = [marshal.loads(seen)
              for seen in analysis._in_key_order(analysis.output_fs(str(tmp_path))[0], staged_files)]
    assert merged == [seen for *_, seen in sorted(every)]
    assert len(merged) == 213
    assert [tasks * analysis.files_left(tasks) for tasks in (1, 2, 3, 4, 8, 9, 100)] == [8, 8, 6, 8, 8, 9, 100]


def test_an_empty_report_section_is_one_line():
    """A section without rows (no error codes in a clean run) says so in one line under its title, not as a table
    without columns, which wraps its title to a few characters a line."""
    from rich.console import Console

    from kafkasniff.commands.spark import _rich_table

    console = Console(width=100, record=True)
    console.print(_rich_table("errors", []))
    assert console.export_text() == "Error codes in responses (rate: share of that API's responses): none\n"


def test_report_numbers_equal_those_from_decode_json(all_run, decoded):
    out = all_run[0]
    result = CliRunner().invoke(main, ["report", str(out), "--json", "--top", "100"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    events = [e for events in decoded.values() for e in events]
    responses = [e for e in events if e["kind"] == "response"]

    summary = report["summary"][0]
    assert (summary["messages"], summary["requests"], summary["responses"]) == \
        (len(events), len(events) - len(responses), len(responses))

    latencies = defaultdict(list)
    for e in responses:
        if e["latency_ms"] is not None:
            latencies[e["api_name"]].append(e["latency_ms"])
    assert {row["api_name"]: row["responses"] for row in report["latency"]} == \
        {api: len(v) for api, v in latencies.items()}
    for row in report["latency"]:
        values = latencies[row["api_name"]]
        for key, p in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99)):
            assert row[key] == pytest.approx(percentile(values, p), abs=0.001)
        assert row["max_ms"] == pytest.approx(max(values), abs=0.0005)
        assert row["mean_ms"] == pytest.approx(sum(values) / len(values), abs=0.0005)

    per_api = Counter(e["api_name"] for e in responses)
    errors = Counter((name, e["api_name"]) for e in responses for name in e["errors"])
    assert {(r["error"], r["api_name"]): (r["responses"], r["api_responses"]) for r in report["errors"]} == \
        {key: (n, per_api[key[1]]) for key, n in errors.items()}
    assert errors, "the captures hold at least one error code"

    names = topic_ids_in(events)
    topics = defaultdict(Counter)
    for e in events:
        for r in json_records(e):
            if not r["batch"]["is_control"]:
                side = "produced" if e["kind"] == "request" else "fetched"
                topic = topics[names.get(r["topic"], r["topic"])]
                topic[side + "_records"] += 1
                topic[side + "_bytes"] += (size_of(r["key"]) or 0) + (size_of(r["value"]) or 0)
    assert {r["topic"]: {k: v for k, v in r.items() if k.startswith(("produced", "fetched")) and v}
            for r in report["topics"]} == {t: dict(c) for t, c in topics.items()}

    clients = defaultdict(Counter)
    connections = defaultdict(set)
    for path, file_events in decoded.items():
        for e in file_events:
            clients[e["client_id"]][e["kind"] + "s"] += 1
            clients[e["client_id"]]["bytes"] += e["size"]
            connections[e["client_id"]].add((path, e["stream"]))
    assert {r["client_id"]: (r["requests"], r["responses"], r["bytes"], r["connections"]) for r in report["clients"]} \
        == {c: (n["requests"], n["responses"], n["bytes"], len(connections[c])) for c, n in clients.items()}

    groups = command_json("groups", "--json", *in_time_order(CAPTURES))
    assert report["groups"] == [{
        "group_id": group["group_id"], "state": group["state"], "protocol": group["generations"][-1]["protocol"],
        "generations": len(group["generations"]), "last_generation": group["generations"][-1]["generation"],
        "members": len(group["generations"][-1]["members"]),
        "max_rebalance_ms": max(g["took_ms"] for g in group["generations"] if g["took_ms"] is not None),
        "errors": sum(sum(g["errors"].values()) for g in group["generations"]),
        "last_cause": "; ".join(group["generations"][-1]["causes"])} for group in groups]
    lag = command_json("lag", "--json", *in_time_order(CAPTURES))
    expected = []
    for row in lag["partitions"]:
        where = (row["topic"], row["partition"])
        lags = [c["last"]["lag"] for c in lag["lag"]["consumers"] if (c["topic"], c["partition"]) == where]
        behind = [c["lag"] for c in lag["lag"]["committed"]
                  if (c["topic"], c["partition"]) == where and c["lag"] is not None]
        expected.append({**{key: row[key] for key in (
            "topic", "partition", "produced_records", "produced_bytes", "records_per_minute", "fetched_records",
            "fetched_bytes", "log_end_offset")}, "consumers": len(lags), "max_consumer_lag": max(lags, default=None),
            "max_committed_lag": max(behind, default=None)})
    expected.sort(key=lambda r: (-r["produced_bytes"], -r["fetched_bytes"], r["topic"], r["partition"]))
    assert report["partitions"] == expected and len(expected) > 20

    throttle = defaultdict(list)
    for e in responses:
        if e["body"] is not None and "throttle_time_ms" in e["body"]:
            throttle[e["api_name"]].append(e["body"]["throttle_time_ms"])
    assert {r["api_name"]: (r["responses"], r["total_ms"], r["max_ms"]) for r in report["throttle"]} == \
        {api: (len(v), sum(v), max(v)) for api, v in throttle.items()}


def test_groups_and_partitions_tables_equal_the_commands(all_run):
    """All captures in one run, connections spread over the tasks: the analyses see the run in capture order."""
    groups, partitions = assert_analysed_tables_equal_the_commands(all_run[0], in_time_order(CAPTURES))
    assert len({row["group_id"] for row in groups}) == 6 and len(groups) == 33
    assert len(partitions) == 86 and all(row["consumers"] for row in partitions)


def test_spark_command_prints_what_it_wrote(all_run, decoded):
    out, stdout, tables = all_run
    assert sorted(p.name for p in out.iterdir()) == sorted(t.name for t in TABLES)
    assert all(d.name.startswith("date=") for d in (out / "messages").iterdir() if d.is_dir())
    messages = sum(len(events) for events in decoded.values())
    row = next(line for line in stdout.splitlines() if line.startswith("│"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[0] == str(len(CAPTURES))
    assert cells[3:6] == [str(len(tables["connections"])), str(len(tables["messages"])), str(len(tables["records"]))]
    assert len(tables["messages"]) == messages


@pytest.mark.parametrize("missing", ["pyspark", "pandas"])
def test_without_pyspark_the_commands_say_what_to_install(monkeypatch, tmp_path, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # what `import` and find_spec see when it is not installed
    for args in (["spark", str(CAPTURES[0]), "--out", str(tmp_path)], ["report", str(tmp_path)]):
        if args[0] == "report":
            for table in TABLES:
                (tmp_path / table.name).mkdir(exist_ok=True)
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert result.stderr == f"kafkasniff: {INSTALL_PYSPARK}\n"


def test_without_java_the_commands_say_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # no bin/java in it
    result = CliRunner().invoke(main, ["spark", str(CAPTURES[0]), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr == ("kafkasniff: Spark needs Java and none was found: install a Java 17 runtime "
                             "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME\n")


def test_bad_inputs_fail_before_spark_starts(tmp_path):
    missing = tmp_path / "missing.pcap"
    result = CliRunner().invoke(main, ["spark", str(missing), "--out", str(tmp_path / "out")])
    assert (result.exit_code, result.stderr) == (2, f"kafkasniff: {missing}: no such file or folder\n")
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert (result.exit_code, result.stderr) == (
        2, f"kafkasniff: {tmp_path}: no messages, records, connections, groups, partitions table; give the --out "
           "folder of `kafkasniff spark`\n")
    result = CliRunner().invoke(main, ["report", str(missing)])
    assert (result.exit_code, result.stderr) == (
        2, f"kafkasniff: {missing}: no such folder; give the --out folder of `kafkasniff spark`\n")
    # an --out the tasks could not write in: a file (the capture itself, say), a folder that cannot be made
    capture = str(CAPTURES[0])
    result = CliRunner().invoke(main, ["spark", capture, "--out", capture])
    assert (result.exit_code, result.stderr) == (
        2, f"kafkasniff: --out {capture}: a file, not a folder; give a folder for the tables (made if it does not "
           "exist)\n")
    result = CliRunner().invoke(main, ["spark", capture, "--out", "/proc/kafka-tables"])
    assert (result.exit_code, result.stderr) == (
        2, "kafkasniff: --out /proc/kafka-tables: cannot make the folder (No such file or directory); give a folder "
           "you can write in\n")


def test_files_in_folders_that_are_not_captures_are_one_warning(tmp_path):
    """A folder of captures with notes, JSON and a capture being written beside them: the captures taken, the
    files that are something else named in one warning (the project's own captures/ folder gave seventeen lines),
    a damaged or empty capture in a warning of its own."""
    for name in ("README.md", "a.json", "b.json", "c.json"):
        (tmp_path / name).write_text('{"what": "notes"}\n')
    (tmp_path / "empty.pcap").write_bytes(b"")
    (tmp_path / "kafka.pcap").write_bytes(CAPTURES[0].read_bytes())
    files, warnings = expand_local([str(tmp_path)])
    assert [f.name for f in files] == [str(tmp_path / "kafka.pcap")]
    assert warnings == [
        "skipped 4 files that are not a pcap or pcapng capture: README.md, a.json, b.json, ...",
        f"skipped {tmp_path / 'empty.pcap'}: file too short to be a capture (0 bytes); give a file written by "
        "tcpdump, tshark, dumpcap or Wireshark"]
    with pytest.raises(InputError, match=r"a\.json: file is not a pcap or pcapng capture"):  # named: an error
        expand_local([str(tmp_path / "a.json"), str(tmp_path / "kafka.pcap")])


def test_a_master_spark_cannot_use_is_one_line_saying_why():
    result = subprocess.run([sys.executable, "-m", "kafkasniff", "spark", str(CAPTURES[0]), "--out", "unused",
                             "--master", "bogus"], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("kafkasniff: Spark did not start: org.apache.spark.SparkException: Master must either be "
                             "yarn or start with spark, k8s, or local; check --master and --conf\n")


def test_workers_import_kafkasniff_as_installed_not_from_the_folder_the_command_runs_in(tmp_path):
    """A source tree in the command's folder (a checkout, unbuilt or of another version) is not what the Python
    workers import: they ran in that folder and imported it first."""
    (tmp_path / "kafkasniff").mkdir()
    (tmp_path / "kafkasniff" / "__init__.py").write_text("raise ImportError('the folder\'s kafkasniff')\n")
    result = subprocess.run([sys.executable, "-P", "-m", "kafkasniff", "spark", str(CAPTURES[0]), "--out", "tables",
                             "--master", "local[1]"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr[-2000:]
    assert (tmp_path / "tables" / "messages" / "_SUCCESS").exists()



def test_kip848_and_share_groups_on_spark(spark, tmp_path):
    """The heartbeat conversations of test_group_epochs through the pipeline: the groups table says what
    `groups --json` says, epoch by epoch, and the fetches count towards their group."""
    from test_group_epochs import consumer_group_capture, share_group_capture

    paths = [consumer_group_capture(tmp_path / "consumer.pcap"), share_group_capture(tmp_path / "share.pcap")]
    summary = build_tables(spark.sparkContext, expand_local(list(map(str, paths)))[0], str(tmp_path / "tables"))
    groups, partitions = assert_analysed_tables_equal_the_commands(tmp_path / "tables", in_time_order(paths))
    assert (summary.groups, summary.partitions) == (len(groups), len(partitions)) == (24, 3)
    assert {c["group"] for row in partitions for c in row["consumers"]} == {"orders-app"}


# ---------------------------------------------------------------- TLS

TLS_CAPTURES = sorted((Path(__file__).resolve().parents[1] / "captures" / "tls").glob("*.pcap"))


def tls_keylog_options() -> list[str]:
    return [option for path in TLS_CAPTURES for option in ("--tls-keylog", str(path.with_suffix(".keys")))]


def test_tls_captures_decrypt_on_the_executors_as_in_decode(spark, tmp_path):
    """The key logs go to the executors: the tables of the TLS captures hold what decode shows with the same
    keys, TLS columns included; without keys, each connection is a `tls` one with its version and suite."""
    keyed, keyless = tmp_path / "keyed", tmp_path / "keyless"
    result = CliRunner().invoke(main, ["spark", *map(str, TLS_CAPTURES), *tls_keylog_options(), "--out", str(keyed)])
    assert result.exit_code == 0, result.output
    tables = read_tables(spark, keyed)
    for path in TLS_CAPTURES:
        decoded = CliRunner().invoke(main, ["decode", "--json", "--tls-keylog", str(path.with_suffix(".keys")),
                                            str(path)]).stdout
        events = [e for e in map(json.loads, decoded.splitlines()) if e["kind"] in ("request", "response")]
        assert_messages_agree(events, [r for r in tables["messages"] if r["capture_files"] == [str(path)]])
        connections = [c for c in tables["connections"] if c["capture_files"] == [str(path)]]
        assert {c["protocol"] for c in connections} == {"kafka"}
        assert {(c["tls_version"], c["tls_cipher"]) for c in connections} == {
            (e["tls"]["version"], e["tls"]["cipher"]) for e in events}
    result = CliRunner().invoke(main, ["spark", *map(str, TLS_CAPTURES), "--out", str(keyless)],
                                env={"SSLKEYLOGFILE": ""})
    assert result.exit_code == 0, result.output
    assert list((keyless / "messages").rglob("*.parquet")) == []  # no message: nothing decrypted
    keyless_connections = read_table(spark, keyless, next(t for t in TABLES if t.name == "connections"))
    assert sorted((c["client"], c["protocol"], c["tls_version"], c["tls_cipher"])
                  for c in keyless_connections) == sorted(
        (c["client"], "tls", c["tls_version"], c["tls_cipher"]) for c in tables["connections"])


def test_the_finishing_is_shared_out_so_that_its_tasks_end_together():
    """The finishing's jobs go to at most a task per core, the costliest first, each to the task with the least so
    far: the analyses of a message-heavy run alone on one core, a records-heavy run's two big record files on two;
    and no more tasks than have a task's own cost of work each (microseconds)."""
    assert build.finishing_tasks([1e6, 3e5, 3e5, 5e4, 5e4, 2e4], 2) == [[0], [1, 2, 3, 4, 5]]
    assert build.finishing_tasks([3e4, 6e5, 5e5, 1e4, 1e4, 2e4, 2e4], 2) == [[1], [2, 0, 5, 6, 3, 4]]
    assert build.finishing_tasks([2e5, 1e5], 8) == [[0], [1]]
    assert build.finishing_tasks([2e5, 1e5, 4e5], 1) == [[2, 0, 1]]
    assert build.finishing_tasks([7e3, 5e3, 4e3], 8) == [[0], [1, 2]]  # 16 ms of work: two tasks
    assert build.finishing_tasks([5e3, 2e3, 1e3, 1e3], 2) == [[0, 1, 2, 3]]  # a tiny run: one task
    assert build.finishing_tasks([], 2) == []
