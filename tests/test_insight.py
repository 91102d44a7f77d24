"""Consumer groups, lag and produce-to-fetch latency from the wire (kafkasniff.analyses), checked against what
the clients themselves reported while the captures were recorded (their manifests' notes): the assignment each
member was given after each membership change, committed offsets, positions, the slow consumer's position and
high watermark after each poll, and the end offsets it asked for."""

from __future__ import annotations

import json
import marshal
import re
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from capture_manifest import capture_names, load_capture
from clients import GROUP_SESSION_TIMEOUT_MS
from kafkasniff.analyses import lag
from kafkasniff.analyses.groups import GroupTracker, named
from kafkasniff.analyses.insight import Insight
from kafkasniff.capture.files import open_capture
from kafkasniff.cli import main
from kafkasniff.analyses.wire import FACTS_READ, REQUESTS_READ_ALONE, PlainSeens, plain_seen, seen
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.session import MessageEvent
from tests.test_partition_facts import unpack_partitions

REBALANCES = ["rebalance_kafka_python", "rebalance_confluent_kafka", "rebalance_aiokafka"]
REBALANCES_GROUPS = [name.replace("_", "-") for name in REBALANCES]  # each capture's group


@cache
def insight(name: str) -> Insight:
    found = Insight(samples=True)
    with open_capture(load_capture(name).pcap) as reader:
        for ev in Analyzer(()).run(reader.segments()):
            found.observe(ev)
    return found


def by_member(assignment: dict) -> dict:
    """A phase's assignment ({client id: [[topic, partition], ...]}) as the analysis gives it."""
    out = {}
    for client, held in assignment.items():
        topics = {}
        for topic, partition in held:
            topics.setdefault(topic, []).append(partition)
        out[client] = {topic: sorted(partitions) for topic, partitions in sorted(topics.items())}
    return out


@pytest.mark.parametrize("name", REBALANCES)
def test_each_membership_change_is_a_generation_with_the_assignment_the_clients_got(name):
    notes = load_capture(name).manifest["notes"]["group"]
    (group,) = insight(name).groups.to_json()
    assert group["group_id"] == notes["group_id"]
    assert [g["generation"] for g in group["generations"]] == [0, 1, 2, 3]
    for phase, gen in zip(notes["phases"], group["generations"], strict=True):
        assert gen["protocol"] == "classic" and gen["protocol_type"] == "consumer"
        got = {m["client_id"]: m["assignment"] for m in gen["members"]}
        assert got == by_member(phase["assignment"])
        assert sum(m["leader"] for m in gen["members"]) == 1
        assert all(m["host"].startswith("127.0.0.1:") for m in gen["members"])
        (cause,) = gen["causes"]
        if phase["action"] == "join":
            assert cause.startswith(f"{phase['member']} (127.0.0.1:") and cause.endswith(") joined")
        else:
            assert cause == f"{phase['member']} left (LeaveGroup)"
        # Tansu answers the JoinGroup that forms a generation only after half the session timeout.
        assert GROUP_SESSION_TIMEOUT_MS / 2 <= gen["took_ms"] < GROUP_SESSION_TIMEOUT_MS
        assert gen["started"] <= gen["first_join"] < gen["formed"] <= gen["completed"]
    # Every newcomer's first JoinGroup is sent back for a member id; the members already in are told to rejoin.
    assert [g["errors"].get("MEMBER_ID_REQUIRED") for g in group["generations"]] == [1, 1, 1, None]
    assert all(g["errors"].get("REBALANCE_IN_PROGRESS") for g in group["generations"][1:])
    # At the end the two members left hold every partition, then leave too.
    assert group["state"] == "Empty"
    last = notes["phases"][-1]["assignment"]
    assert group["after_last_generation"]["causes"] == [f"{member} left (LeaveGroup)" for member in sorted(last)]


@pytest.mark.parametrize("name", REBALANCES)
def test_committed_offsets_and_positions_are_what_the_last_holders_reported(name):
    notes = load_capture(name).manifest["notes"]["group"]
    found = insight(name)
    lag = found.lag.to_json()
    committed = {(row["topic"], row["partition"]): row for row in lag["committed"]}
    positions = {(row["topic"], row["partition"]): row for row in lag["consumers"]}
    for member in notes["phases"][-1]["assignment"]:
        reported = notes["members"][member]
        for topic, partition, offset in reported["committed"]:
            assert committed[topic, partition]["committed_offset"] == offset
            assert committed[topic, partition]["group"] == notes["group_id"]
            assert committed[topic, partition]["lag"] == 0
        for topic, partition, offset in reported["positions"]:
            row = positions[topic, partition]
            assert (row["group"], row["delivered_to"], row["last"]["lag"]) == (notes["group_id"], offset, 0)
    assert len(positions) == len(committed) == 3


def test_a_slow_consumer_lags_as_its_client_saw_it():
    notes = load_capture("consumer_lag").manifest["notes"]["lag"]
    found = insight("consumer_lag")
    consumers = found.lag.to_json()["consumers"]
    assert sorted((c["group"], c["partition"]) for c in consumers) == [
        ("lag-fast", 0), ("lag-fast", 1), ("lag-slow", 0), ("lag-slow", 1)]
    slow = {c["partition"]: c for c in consumers if c["group"] == "lag-slow"}
    fast = {c["partition"]: c for c in consumers if c["group"] == "lag-fast"}
    # After each of its polls the slow client knew its position and the high watermark of its last fetch:
    # that fetch is on the wire, at an offset no further than the position, with that high watermark.
    client_lag = {0: 0, 1: 0}
    for poll in notes["slow"]["polls"]:
        for _topic, partition, position, highwater in poll:
            if highwater is None:
                continue
            client_lag[partition] = max(client_lag[partition], highwater - position)
            assert any(s[2] == highwater and s[1] <= position for s in slow[partition]["samples"]), poll
    for partition in (0, 1):
        assert slow[partition]["max_lag"]["lag"] >= client_lag[partition] > 0
        assert fast[partition]["max_lag"]["lag"] < slow[partition]["max_lag"]["lag"]
    for side in ("slow", "fast"):
        for topic, partition, offset in notes[side]["positions"]:
            (row,) = [c for c in consumers if (c["group"], c["topic"], c["partition"]) ==
                      (f"lag-{side}", topic, partition)]
            assert row["delivered_to"] == offset
        committed = {(c["topic"], c["partition"]): c["committed_offset"] for c in found.lag.to_json()["committed"]
                     if c["group"] == f"lag-{side}"}
        assert committed == {(topic, partition): offset for topic, partition, offset in notes[side]["committed"]}
    # Tansu 0.6 answers ListOffsets for the latest offset with the base offset of the partition's last batch
    # (96, as kafka-python's end_offsets() reported), not the log end: the log end is the highest end seen,
    # here the high watermark of the last Fetch responses, the count of records produced to each partition.
    produced = {0: 0, 1: 0}
    for record in load_capture("consumer_lag").produced():
        produced[record.partition] += 1
    log_end = {e["partition"]: e["offset"] for e in found.lag.to_json()["log_end"]}
    assert log_end == produced == {0: 100, 1: 100}
    assert {partition: offset for _, partition, offset in notes["slow"]["end_offsets"]} == {0: 96, 1: 96}


def test_every_produced_record_is_matched_once_per_consumer_that_fetched_it():
    produced = len(load_capture("consumer_lag").produced())
    (topic,) = insight("consumer_lag").lag.latency.to_json()
    assert (topic["topic"], topic["records"]) == ("lag-topic", 2 * produced)
    consumers = {c["consumer"]: c for c in topic["consumers"]}
    assert {name: c["records"] for name, c in consumers.items()} == {"lag-fast": produced, "lag-slow": produced}
    fast, slow = consumers["lag-fast"]["latency_ms"], consumers["lag-slow"]["latency_ms"]
    assert 0 < fast["p50"] <= fast["p95"] <= fast["p99"] <= fast["max"]
    assert topic["latency_ms"]["max"] == max(fast["max"], slow["max"])
    assert slow["p50"] > fast["p99"]  # the slow consumer's median record waited longer than nearly all fast ones
    for name in REBALANCES:  # one consumer group, each record read once (a re-fetched batch is not counted)
        (topic,) = insight(name).lag.latency.to_json()
        assert topic["records"] == len(load_capture(name).produced())


def index_from_scratch(tracker: GroupTracker) -> tuple[dict, dict]:
    """The owners' index (Owners.by_partition, Owners.by_member) made anew from every group's latest generation as
    it is now (the index GroupTracker keeps is remade only for the groups that changed)."""
    owners, members = {}, {}
    for group in tracker.groups.values():
        gen = group.latest
        for member_id, assignment in (gen.members.items() if gen is not None else ()):
            info = group.members.get(member_id)
            if info is None or info.ip is None:
                continue
            who = (info.client_id, info.ip)
            members.setdefault(who, set()).add(group.group_id)
            for name, numbers in (named(assignment, tracker.topic_names.by_id) or {}).items():
                for number in numbers:
                    owners.setdefault((name, number, *who), set()).add(group.group_id)
    return owners, members


def test_the_group_a_fetch_counts_towards_follows_every_rebalance_of_every_group(monkeypatch):
    """Five captures' six groups in one run, rebalancing in turn: whenever a consumer's Fetch response asks which
    group its partitions are fetched for, the index that answers is the one the groups' latest generations give,
    as if it were made anew; and fetches count towards every group."""
    asked = []
    kept = GroupTracker.owners

    def checked(self):
        index = kept(self)
        asked.append(index)
        assert (index.by_partition, index.by_member) == index_from_scratch(self)
        return index

    monkeypatch.setattr(GroupTracker, "owners", checked)
    found = Insight(samples=False)
    for name in [*REBALANCES, "consumer_group", "consumer_lag"]:
        with open_capture(load_capture(name).pcap) as reader:
            for ev in Analyzer(()).run(reader.segments()):
                found.observe(ev)
    assert sorted(found.groups.groups) == ["kafkasniff-group", "lag-fast", "lag-slow", *sorted(REBALANCES_GROUPS)]
    assert len(asked) == 274 and {p.group for p in found.lag.positions.values()} - {None} == set(found.groups.groups)


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_groups_command():
    pcap = str(load_capture("rebalance_kafka_python").pcap)
    result = run("groups", "--json", pcap)
    assert result.exit_code == 0
    assert json.loads(result.output) == json.loads(json.dumps(insight("rebalance_kafka_python").groups.to_json()))
    text = run("groups", pcap).output
    assert "group rebalance-kafka-python (classic protocol): Empty" in text
    assert "kafka-python-c2 left (LeaveGroup)" in text
    assert "rebalance-kafka-python[0,1,2]" in text and "*kafka-python-c1" in text


def test_lag_command():
    pcap = str(load_capture("consumer_lag").pcap)
    result = run("lag", "--json", pcap)
    assert result.exit_code == 0
    found = json.loads(result.output)
    assert found["lag"] == json.loads(json.dumps(insight("consumer_lag").lag.to_json()))
    assert [t["records"] for t in found["end_to_end"]] == [400]
    lines = run("lag", pcap).output.splitlines()
    assert "lag-slow │ lag-topic │ 1 │ 5 │ 100 │ 100 │ 100 │ 0 │ 55 │ 21:31:34.431 │ 100" in [
        " ".join(line.split()) for line in lines]


def test_lag_decrypts_tls_with_the_key_log_and_says_which_connections_it_could_not():
    capture = load_capture("tls/tls13_suites")
    with_keys = CliRunner().invoke(main, ["lag", "--json", "--tls-keylog", str(capture.keylog), str(capture.pcap)])
    assert with_keys.exit_code == 0 and with_keys.stderr == ""
    found = json.loads(with_keys.stdout)
    assert sorted((c["client_id"], c["topic"], c["partition"], c["fetches"], c["last"]["fetch_offset"],
                   c["last"]["high_watermark"]) for c in found["lag"]["consumers"]) == [
        ("aiokafka-0.14.0", "tls-aes-256-gcm-sha384", 0, 2, 2, 2),
        ("aiokafka-0.14.0", "tls-aes-256-gcm-sha384", 1, 2, 2, 2),
        ("aiokafka-0.14.0", "tls-aes-256-gcm-sha384", 2, 2, 0, 0),
        *[("kafka-python-3.0.12", topic, p, 1, 0, hw) for topic in ("tls-aes-128-gcm-sha256",
                                                                     "tls-chacha20-poly1305-sha256")
          for p, hw in ((0, 2), (1, 2), (2, 0))]]
    assert [t["records"] for t in found["end_to_end"]] == [4, 4, 4]
    without = CliRunner().invoke(main, ["lag", str(capture.pcap)], env={"SSLKEYLOGFILE": ""})
    assert without.exit_code == 0 and without.stdout == "no consumer fetched in the capture\n"
    assert without.stderr == (f"kafkasniff: warning: {capture.pcap}: 12 TLS connections not decrypted, their messages "
                              "not analysed; give their key log (--tls-keylog FILE, or SSLKEYLOGFILE)\n")
    groups = CliRunner().invoke(main, ["groups", "--json", "--tls-keylog", str(capture.keylog), str(capture.pcap)])
    assert groups.exit_code == 0 and groups.stderr == ""


@pytest.mark.parametrize("command", ["groups", "lag"])
def test_a_missing_capture_is_one_line_and_status_2(command, tmp_path):
    result = CliRunner().invoke(main, [command, str(tmp_path / "nothing.pcap")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("kafkasniff: ")


def test_a_capture_without_groups_says_so():
    result = run("groups", str(load_capture("admin").pcap))
    assert result.output == "no consumer-group traffic in the capture\n"


def test_fetches_over_ipv6_count_towards_their_group(tmp_path):
    """Members are told apart by their address as the connections name it: an IPv6 one too."""
    from pcapkit import Packet, as_ipv6, read_packets, write_pcap

    pcap = write_pcap(tmp_path / "lag6.pcap", [Packet(ts, as_ipv6(frame)) for ts, frame in
                                               read_packets(load_capture("consumer_lag").pcap)])
    found = Insight(samples=False)
    with open_capture(pcap) as reader:
        for ev in Analyzer(()).run(reader.segments()):
            found.observe(ev)
    assert [(c["group"], c["partition"]) for c in found.lag.to_json()["consumers"]] == [
        ("lag-fast", 0), ("lag-fast", 1), ("lag-slow", 0), ("lag-slow", 1)]


def test_each_partitions_traffic():
    """What Produce wrote to each partition (the records its clients reported, the bytes of the record sets of
    the Produce requests, read from their field trees) and what the two consumer groups fetched of it: every
    record once each."""
    from kafkasniff.protocol.messages import decode_request
    from kafkasniff.stream.session import MessageEvent

    produced = {0: 0, 1: 0}
    for record in load_capture("consumer_lag").produced():
        produced[record.partition] += 1
    sent_bytes, sent_at = {0: 0, 1: 0}, []
    with open_capture(load_capture("consumer_lag").pcap) as reader:
        for ev in Analyzer(()).run(reader.segments()):
            if type(ev) is MessageEvent and ev.message.kind == "request" and ev.message.api_key == 0:
                sent_at.append(ev.ts)
                for topic in decode_request(ev.payload).body["TopicData"].children:
                    for partition in topic["PartitionData"].children:
                        records = partition["Records"]
                        sent_bytes[partition["Index"].value] += records.end - records.children[0].offset
    rows = insight("consumer_lag").lag.partitions_json()
    assert [row["partition"] for row in rows] == [0, 1]
    for row in rows:
        partition = row["partition"]
        assert (row["topic"], row["produced_records"], row["fetched_records"]) == (
            "lag-topic", produced[partition], 2 * produced[partition])
        assert (row["produced_bytes"], row["fetched_bytes"]) == (sent_bytes[partition], 2 * sent_bytes[partition])
        assert (row["first_produced_offset"], row["last_produced_offset"]) == (0, produced[partition] - 1)
        assert (row["first_produced_at"], row["last_produced_at"]) == (min(sent_at), max(sent_at))
        assert row["records_per_minute"] == round(produced[partition] * 60 / (max(sent_at) - min(sent_at)), 3)
        assert (row["high_watermark"], row["last_stable_offset"], row["log_end_offset"]) == (100, 100, 100)
        assert row["fetch_responses"] == sum(c["fetches"] for c in insight("consumer_lag").lag.to_json()["consumers"]
                                             if c["partition"] == partition)


@pytest.mark.parametrize("name", capture_names())
def test_what_is_sent_to_the_analyses_is_what_they_read_in_one_process(name):
    """A worker's (or Spark task's) plain_seen, marshalled and read back in capture order (PlainSeens), is the Seen
    one process makes of the same message: bodies sent as their JSON text, facts only those the analyses read. The
    body of a request read alone is read once: its response's request holds the same dict."""
    runs = []
    for _ in range(2):  # a run for each: a request read alone keeps what was read of it for its response
        with open_capture(load_capture(name).pcap) as reader:
            runs.append([ev for ev in Analyzer(()).run(reader.segments()) if type(ev) is MessageEvent])
    events, events_plain = runs
    read = shared = 0
    requests_read_alone = {}  # request event -> its Seen read back
    plain_seens = PlainSeens()
    for ev, ev_plain in zip(events, events_plain, strict=True):
        plain = plain_seen(ev_plain, ev.conn.stream)
        expected = seen(ev, ev.conn.stream)
        if expected is None:
            assert plain is None
            continue
        read += 1
        got = plain_seens.seen(marshal.loads(marshal.dumps(plain)))
        assert got == expected
        for facts in [expected.root, *(p[3] for p in unpack_partitions(*expected.partitions, FACTS_READ))]:
            assert set(facts) <= set(FACTS_READ)
        if ev.message.kind == "request" and ev.message.api_key in REQUESTS_READ_ALONE and got.body is not None:
            requests_read_alone[ev] = got
        elif ev.request in requests_read_alone and got.request is not None:
            assert got.request.body is requests_read_alone.pop(ev.request).body
            shared += 1
    assert read
    if any(ev.message.api_key in REQUESTS_READ_ALONE and ev.request is not None for ev in events):
        assert shared


def test_the_facts_lag_reads_are_the_facts_made():
    """Every fact lag.pyx reads (by name, from a root or a partition) is one FACTS_READ makes: one it did not make
    would read as missing, silently."""
    source = (Path(lag.__file__).parent / "lag.pyx").read_text()
    names = set(re.findall(r'(?:(?:facts|root)\.get\(|FACTS_READ\.index\()"([a-z_.]+)"', source))
    assert {"fetch_offset", "high_watermark", "base_offset", "offset", "replica_state.replica_id"} <= names
    assert names <= set(FACTS_READ)
