"""`decode --jobs N`: connections shared out among worker processes give exactly the output of one process."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from kafkasniff.capture.files import open_capture
from kafkasniff.capture.packets import FIN, RST
from kafkasniff.cli import main
from kafkasniff.commands import decode
from kafkasniff.engine import parallel
from kafkasniff.engine.parallel import WorkerFailed, sniff_parallel
from kafkasniff.engine.share import Merge, Replies
from kafkasniff.protocol.encoder import encode_request, encode_response
from kafkasniff.protocol.records_encoder import Record, encode_record_batch
from kafkasniff.render.output import CONTINUED, RENDERED_BY_PARENT, TREE_PART_BYTES, Output, OutputOptions
from kafkasniff.stream.session import MessageEvent
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.keylog import KeyLog
from tests import pcapkit
from tests.capture_manifest import CAPTURES_DIR, capture_names

ALL_CAPTURES = [str(CAPTURES_DIR / f"{name}.pcap") for name in capture_names()]
CONFLUENT = str(CAPTURES_DIR / "confluent_codecs.pcap")


def run(*args: str) -> str:
    result = CliRunner().invoke(main, ["decode", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("view", [[], ["--json"], ["-V"], ["--hex"]], ids=["line", "json", "tree", "hex"])
@pytest.mark.parametrize("jobs", ["2", "3"])
def test_workers_write_what_one_process_writes(view, jobs):
    # All captures in one run: stream numbers and topic ids carry over from file to file as in one process.
    single = run(*view, "-j", "1", *ALL_CAPTURES)
    shared = run(*view, "-j", jobs, *ALL_CAPTURES)
    assert shared == single
    # 2,229 messages and 11 `unanswered` notices, each naming a request by its correlation id; their end, which the
    # parent tells the workers, is the connection's or the capture's
    assert (single.count("when the connection ended: "), single.count("when the capture ended: ")) == (5, 6)
    if view in (["-V"], ["--hex"]):  # a headline per message or notice, at the start of a line
        assert sum(line[:2].isdigit() and " corr=" in line for line in single.splitlines()) == 2229 + 11
        assert "\0" not in single
    else:
        assert len(single.splitlines()) == 2240  # 52 + 120 + 206 + 62 + 526 + 94 + 100 + 60 + 272 + 398 + 216 + 134


@pytest.mark.parametrize("filters", [
    ["--topic", "confluent-zstd"], ["--errors-only"], ["--api", "Fetch", "--api", "Metadata"],
    ["--client-id", "rdkafka"], ["--stream", "3"], ["--topic", "nope"], ["--api", "Fetch"], ["--api", "Produce"],
])
def test_filters_apply_alike(filters):
    for view in ([], ["--json"], ["-V"], ["--hex"]):
        assert run(*view, *filters, "-j", "2", *ALL_CAPTURES) == run(*view, *filters, "-j", "1", *ALL_CAPTURES)


def test_topic_ids_resolve_across_workers():
    """A topic id learned from a Metadata response in one worker names the topic of a Fetch in the other."""
    events = [json.loads(line) for line in run("--json", "-j", "2", CONFLUENT).splitlines()]
    learned_by: dict[str, set[int]] = {}  # topic id -> workers (stream % 2) that saw it with its name
    resolved_elsewhere = 0
    for ev in events:
        body = ev.get("body") or {}
        for topic in body.get("topics") or body.get("responses") or ():
            if not isinstance(topic, dict) or not topic.get("topic_id"):
                continue
            if topic.get("name") or topic.get("topic"):
                learned_by.setdefault(topic["topic_id"], set()).add(ev["stream"] % 2)
            elif learned_by.get(topic["topic_id"]) == {1 - ev["stream"] % 2}:
                assert topic["topic_id"] not in ev["topics"], ev["topics"]  # a name, not the id
                resolved_elsewhere += 1
    assert resolved_elsewhere > 0


def test_a_failing_worker_stops_the_run_with_its_traceback(monkeypatch, tmp_path):
    def broken(*args):
        raise ValueError("decoder broke")

    monkeypatch.setattr(parallel, "handle_all", broken)  # before the workers fork: they inherit it
    with pytest.raises(WorkerFailed, match="decoder broke"):
        CliRunner().invoke(main, ["decode", "-j", "2", CONFLUENT], catch_exceptions=False)


# The capture's 1 MiB messages are written in pieces (a record batch at a time): the reader goes while one is.
@pytest.mark.parametrize("view, jobs", [(["--json"], "2"), (["--json"], "1"), (["-V"], "1"), (["-V"], "2"),
                                       ([], "2")])
def test_reader_going_away_ends_the_run_quietly(view, jobs):
    proc = subprocess.Popen([sys.executable, "-m", "kafkasniff", "decode", *view, "-j", jobs, CONFLUENT],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=30) == 0
    assert b"request" in first
    assert proc.stderr.read() == b""


def stats_of(paths: list[str], jobs: int, **options) -> tuple[dict, int]:
    """--stats of the captures as its JSON (every count, latency, lag and end-to-end figure), and the events shown."""
    output = Output(OutputOptions(stats=True, **options), out=open(os.devnull, "w"))
    for path in paths:
        with open_capture(path) as reader:
            decode.decode_file(reader, output, (), jobs)
    return output.stats.to_json(), output.shown


@pytest.mark.parametrize("options", [{}, {"topics": frozenset({"confluent-zstd"})}, {"apis": frozenset({"fetch"})},
                                     {"streams": frozenset({3})}, {"errors_only": True}],
                         ids=["all", "topic", "api", "stream", "errors"])
def test_stats_on_workers_count_what_one_process_counts(options):
    # The workers count what does not depend on order; topics and the analyses (lag, groups, end-to-end latency)
    # are counted by the parent in capture order; a --topic filter has the parent count everything.
    single = stats_of(ALL_CAPTURES, 1, **options)
    assert stats_of(ALL_CAPTURES, 3, **options) == single
    assert single[1] > 0 and single[0]["apis"]


def test_pipes_carry_plain_values_marshalled_and_anything_else_pickled():
    """What workers and parent send each other is marshalled (faster than a pickle to make) when it is plain values,
    as lines and --stats' items are; a worker's totals (compiled counters) and a message the parent renders
    go pickled, and the reader tells the two apart by their first byte."""
    from kafkasniff.render.stats import ApiStats

    index = struct.pack("=4q", 40, 5, 41, -1)  # a line, then a --stats item
    reply = (41, index, b"line\n", [((3, False, 61, (1.5, 9, ("127.0.0.1", 21055), None)),
                                      [["orders", None, 0, [2]], None])], 7, 0)
    data = parallel._dumps(reply)
    assert data[0] != 0x80 and parallel._loads(data) == reply
    stats = ApiStats(0, "Produce")
    stats.requests = 3
    data = parallel._dumps((parallel.END, struct.pack("=2q", parallel.END, -1), b"", [((4, {0: stats}), None)], 1, 0))
    assert data[0] == 0x80
    assert parallel._loads(data)[3][0][0][1][0].to_json() == stats.to_json()


def test_a_batch_is_read_back_as_written_and_a_cut_one_is_refused():
    """Events go to the workers as native values, one bytearray a batch after its watermark (share.pyx); a worker
    reads them in order and hands each to its Analyzer, which makes what it makes of the capture in one process. A
    batch that ends inside a value, or holds a kind of event there is not, is an error: never a read past its end."""
    from kafkasniff.engine.share import handle_all, share_out
    from kafkasniff.stream.tcp import TcpReassembler

    batches, sent = [bytearray(8)], []

    def send(watermark: int) -> None:
        sent.append(bytes(batches[0]))
        del batches[0][8:]

    with open_capture(CONFLUENT) as reader:
        assert share_out(reader.segment_batches(), TcpReassembler(), batches, send, lambda: False, 16, 1 << 20)
    sent.append(bytes(batches[0]))
    assert len(sent) > 10

    def summary(ev):
        message = getattr(ev, "message", None)
        return type(ev).__name__, message and (message.api_key, message.correlation_id, message.kind)

    read, analyzer, replies = [], Analyzer(), Replies(lambda *reply: None)
    for batch in sent:
        handle_all(analyzer, batch, 8, lambda ev, _: read.append(summary(ev)), replies, 1 << 40)
    with open_capture(CONFLUENT) as reader:
        assert read == [summary(ev) for ev in Analyzer().run(reader.segments())] and len(read) > 100
    batch = next(b for b in sent if len(b) > 100)
    for broken in (batch[:-3], batch[:8] + b"\0" * 8 + b"\x09" + batch[17:]):
        with pytest.raises(ValueError, match="parallel: "):
            handle_all(Analyzer(), broken, 8, lambda ev, _: None, replies, 1 << 40)


class _Written:
    """What share.Merge hands an Output: lines written whole, and items delivered."""

    def __init__(self):
        self.calls = []

    def write_lines(self, data, count):
        self.calls.append(("lines", bytes(data), count))

    def deliver(self, items):
        self.calls.append(("deliver", list(items)))


def test_merge_writes_the_workers_items_in_event_order_once_no_worker_can_precede_them():
    """Each worker's reply: lines back to back with an index of (event number, end) pairs, or (number, -1 - k) for
    its k-th special item (anything the parent must look at). Items are written by event number across workers,
    each worker's in its own order, once every other worker's watermark says nothing earlier can come."""
    replies = []

    def reply(*args):
        replies.append(args)

    worker = Replies(reply)
    for number, rendered in [(1, (b"a1\n", None)), (1, (b"a1 again\n", None)), (4, (b"a4 ", ["mention"])),
                             (7, (b"a7\n", None))]:
        worker.number = number
        worker.add(rendered)
    worker.send(7)
    (watermark, index, text, specials, messages, big), = replies
    assert (watermark, messages, big) == (7, 0, None)
    assert struct.unpack(f"={len(index) // 8}q", index) == (1, 3, 1, 12, 4, -1, 7, 15)
    assert bytes(text) == b"a1\na1 again\na7\n" and specials == [(b"a4 ", ["mention"])]

    merge, written = Merge(2), _Written()
    merge.add(0, bytes(index), bytes(text), specials)
    merge.add(1, struct.pack("=4q", 2, 3, 3, -1), b"b2\n", [(b"b3", ["m"])])
    assert merge.queued == [15 + 3, 3 + 2]
    # worker 0 has done event 7, worker 1 event 5: worker 0's items up to 6, worker 1's up to 8
    assert merge.deliver([7, 5], written)
    assert written.calls == [("lines", b"a1\na1 again\nb2\n", 3), ("deliver", [(b"b3", ["m"]), (b"a4 ", ["mention"])])]
    assert merge.queued == [3, 0]
    written.calls.clear()
    assert not merge.deliver([7, 5], written) and written.calls == []
    merge.add(1, struct.pack("=2q", 9, 3), b"b9\n", [])
    assert merge.deliver([7, 9], written)  # worker 1 has done event 9: worker 0's event 7 is next
    assert written.calls == [("lines", b"a7\n", 1)]
    written.calls.clear()
    assert not merge.deliver([7, 9], written)  # worker 0 may still make event 8
    assert merge.deliver([parallel.END, 9], written)
    assert written.calls == [("lines", b"b9\n", 1)] and merge.queued == [0, 0]


def test_stats_tables_alike_on_workers():
    assert run("--stats", "-j", "3", *ALL_CAPTURES) == run("--stats", "-j", "1", *ALL_CAPTURES)


def test_trees_with_topic_ids_name_them_across_workers():
    """A worker marks the topic ids its tree would name; the parent names them as the capture has so far, learned
    from messages of the other worker too (the Metadata responses of other connections)."""
    tree = run("-V", "-j", "2", CONFLUENT)
    named = [line for line in tree.splitlines() if "TopicId: '" in line and "' (confluent-" in line]
    assert len(named) == 30 and tree == run("-V", "-j", "1", CONFLUENT)


@pytest.fixture(scope="module")
def big_trees(tmp_path_factory) -> str:
    """CONFLUENT with one more producer's connection beside its own, while they go on: two Produce requests of
    6,000 records (gzip, none), each a tree of about 1.3 MB, and their responses."""
    conversation = pcapkit.TcpConversation(("10.9.0.1", 41000), ("10.9.0.2", 9092),
                                           start=pcapkit.read_packets(Path(CONFLUENT))[0].ts + 0.001)
    for correlation_id, codec in ((1, "gzip"), (2, "none")):
        records = [Record(key=f"key-{i}".encode(), value=f"value {i} of {codec} ".encode() * (1 + i % 5))
                   for i in range(6000)]
        conversation.send(True, encode_request(0, 9, correlation_id, "big", {
            "Acks": 1, "TimeoutMs": 1000, "TopicData": [{"Name": "big-tree", "PartitionData": [
                {"Index": 0, "Records": encode_record_batch(records, codec=codec)}]}]}))
        conversation.send(False, encode_response(0, 9, correlation_id, {"Responses": [
            {"Name": "big-tree", "PartitionResponses": [{"Index": 0}]}]}))
    packets = pcapkit.merged(pcapkit.read_packets(Path(CONFLUENT)), conversation.close())
    return str(pcapkit.write_pcap(tmp_path_factory.mktemp("big") / "big_trees.pcap", packets))


@pytest.mark.parametrize("filters", [[], ["--topic", "big-tree"], ["--topic", "confluent-zstd"], ["--api", "Fetch"]])
def test_big_trees_on_workers_write_what_one_process_writes(big_trees, filters):
    single = run("-V", *filters, "-j", "1", big_trees)
    assert run("-V", *filters, "-j", "2", big_trees) == single
    assert ("record offset 5999," in single) == (filters in ([], ["--topic", "big-tree"]))


def test_topic_names_that_are_not_printable_are_escaped_alike(tmp_path):
    """A damaged capture's topic name can hold any bytes: lines show it as repr() does when it is not printable
    (never a raw NUL, newline or terminal escape), in one process and on workers, where a NUL once read as one of
    the marks a worker leaves for the parent (found by fuzzing)."""
    name = "evil\x00\x1b[31m\nname"
    conversation = pcapkit.TcpConversation(("10.9.0.1", 41000), ("10.9.0.2", 9092))
    conversation.send(True, encode_request(0, 9, 1, "c", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": name, "PartitionData": [{"Index": 0, "Records": encode_record_batch([Record(b"k", b"v")])}]}]}))
    conversation.send(False, encode_response(0, 9, 1, {"Responses": [{"Name": name, "PartitionResponses": [
        {"Index": 0}]}]}))
    # a Metadata response gives the name an id; a Fetch by id is then shown with the name beside the id
    topic_id = "0a0b0c0d-0000-4000-8000-00000000abcd"
    conversation.send(True, encode_request(3, 12, 2, "c", {"Topics": [{"Name": name, "TopicId": topic_id}]}))
    conversation.send(False, encode_response(3, 12, 2, {"Topics": [{"Name": name, "TopicId": topic_id}]}))
    conversation.send(True, encode_request(1, 13, 3, "c", {"Topics": [{"TopicId": topic_id, "Partitions": [
        {"Partition": 0}]}]}))
    conversation.send(False, encode_response(1, 13, 3, {"Responses": [{"TopicId": topic_id, "Partitions": [
        {"PartitionIndex": 0}]}]}))
    path = str(pcapkit.write_pcap(tmp_path / "names.pcap", pcapkit.merged(
        pcapkit.read_packets(Path(CONFLUENT)), conversation.close())))
    lines = [line for line in run("-j", "1", path).splitlines() if "10.9.0.1" in line]
    shown = "'evil\\x00\\x1b[31m\\nname'"
    assert [line.split("B ", 1)[1].removeprefix("0.099ms ") for line in lines if "Produce" in line] == [
        f"{shown}[0] 1 batch 1 record", f"{shown}[0]"]
    assert sum(line.endswith(f"{shown}[0]") for line in lines if "Fetch" in line) == 2
    for view in ([], ["-V"]):
        single = run(*view, "-j", "1", path)
        assert run(*view, "-j", "2", path) == single
        assert "\x00" not in single and "\x1b" not in single
    assert f"TopicId: '{topic_id}' ({shown})  uuid" in single  # the Fetch's tree names the id


def test_a_big_tree_goes_to_the_parent_in_parts(big_trees):
    """A tree of 6,000 records leaves the worker a TREE_PART_BYTES at a time, the first part with the message's
    mentions and the others marked CONTINUED: what the parent writes of them is one process's."""
    options = decode.make_options(True, False, False, (), (), (), (), False, False, False, False)

    worker, parts, big = Output(options, out=open(os.devnull, "w")), Parts(), 0
    with open_capture(big_trees) as reader:
        for ev in Analyzer().run(reader.segments()):
            before = len(parts.items)
            rendered = worker.render(ev, parts)
            if rendered is not None:
                parts.items.append(rendered)
            made = parts.items[before:]
            if type(ev) is MessageEvent:
                assert rendered is None and made[0][1] is not CONTINUED
                assert all(mentions is CONTINUED for _, mentions in made[1:])
                big += len(made) > 1
                assert all(len(text) >= TREE_PART_BYTES for text, _ in made[1:-1])
    assert big == 2
    parent = io.BytesIO()
    output = Output(options, out=io.TextIOWrapper(parent, write_through=True))
    output.deliver(parts.items)
    output.finish()
    assert parent.getvalue().decode() == run("-V", "-j", "1", big_trees)


def test_trees_and_stats_beside_json_stay_in_one_process():
    # They need every event object in one place; --jobs is accepted and does not change them.
    for view in (["--stats", "--json"], ["--stats", "-V"], ["--stats", "--hex", "--api", "ApiVersions"]):
        assert run(*view, "-j", "2", CONFLUENT) == run(*view, "-j", "1", CONFLUENT)


@pytest.mark.parametrize("cores, size_mb, packets, view, expected", [
    (2, 60, 190_000, "line", 3), (2, 60, 190_000, "json", 2), (2, 60, 190_000, "tree", 2), (2, 7, 20_000, "line", 1),
    (1, 60, 190_000, "line", 1), (4, 60, 190_000, "line", 4), (4, 60, 190_000, "json", 4),
    (16, 60, 190_000, "json", 4), (2, 64, 3_500, "line", 1), (2, 64, 3_500, "json", 1),
])
def test_default_workers(monkeypatch, cores, size_mb, packets, view, expected):
    monkeypatch.setattr(decode, "usable_cores", lambda: cores)
    reader = SimpleNamespace(total_size=size_mb << 20, estimated_packets=lambda: packets)
    assert decode.default_jobs(reader, OutputOptions(view=view)) == expected


class Parts:
    """What Output.render hands a worker's replies, kept: (text, mentions, topics or CONTINUED) items."""

    def __init__(self):
        self.items = []

    def add(self, rendered):
        self.items.append(rendered)

    def add_big(self, data, mentions):
        self.items.append((bytes(data), mentions))


def test_workers_hand_big_messages_to_the_parent_and_write_records_in_parts():
    """A message of 16 KiB or more goes to the parent whole: its JSON is several times its bytes, and made where it is
    written it crosses no pipe. A smaller one with records is written in parts as it is made: a few KB of compressed
    records can make hundreds of MB of JSON (test_hostile_memory.py). The comparisons with one process above check
    what the parent writes of both."""
    output = Output(decode.make_options(False, False, True, (), (), (), (), False, False, False, False))
    handed = in_parts = whole = 0
    with open_capture(CONFLUENT) as reader:
        for ev in Analyzer().run(reader.segments()):
            parts = Parts()
            rendered = output.render(ev, parts)
            big = type(ev) is MessageEvent and len(ev.payload) >= RENDERED_BY_PARENT
            assert (rendered is not None and rendered[0] is ev) == big
            handed += big
            if rendered is None:
                assert ev.message.batches and len(parts.items) == 1  # small: one part
                in_parts += 1
            else:
                whole += type(rendered[0]) is bytes
    # a 1 MiB Produce request, its 1 MiB Fetch response; the rest whole, the `unanswered` notice among them
    assert (handed, in_parts, whole) == (2, 24, 179 + 1)


def message_identities(lines: list[str]) -> list[tuple]:
    events = [json.loads(line) for line in lines]
    return sorted((e["stream"], e["kind"], e["api_key"], e["api_version"], e["correlation_id"], e["size"])
                  for e in events if e["kind"] in ("request", "response"))


def recent(path: Path, until: float) -> list:
    """The segments of a capture whose connections are still open (no FIN, no RST), moved in time to end at
    `until`: as if captured just now, so that none has been idle for long."""
    with open_capture(str(path)) as reader:
        segments = [s for s in reader.segments() if not s.flags & (FIN | RST)]
    shift = until - segments[-1].ts
    return [s._replace(ts=s.ts + shift) for s in segments]


def test_live_workers_show_what_an_idle_tick_decrypts(tmp_path):
    """sniff on workers: a TLS client logs its keys only after its records were captured. When the capture is
    idle, every worker is told the time, reads the key log again and decrypts what waited, and the messages are
    written then, while the capture goes on (not at its end)."""
    capture = CAPTURES_DIR / "tls" / "tls13_suites.pcap"
    keys = capture.with_suffix(".keys")
    expected = message_identities(run("--json", "--tls-keylog", str(keys), str(capture)).splitlines())
    tls_streams = 1 + max(stream for stream, *_ in expected)
    late_keys = tmp_path / "client.keys"
    now = time.time()
    # Plaintext connections after the TLS ones: once their lines show, every worker has handled the block.
    block = recent(capture, now) + recent(CAPTURES_DIR / "admin.pcap", now)
    out_path = tmp_path / "out.jsonl"
    before_keys, while_capturing = [], []

    def shown(at_least: int) -> list[str]:
        waiting_until = time.monotonic() + 30
        while len(out_path.read_text().splitlines()) < at_least and time.monotonic() < waiting_until:
            time.sleep(0.05)
        return out_path.read_text().splitlines()

    def blocks():
        yield block
        before_keys.extend(shown(1))
        late_keys.write_bytes(keys.read_bytes())
        yield None  # idle
        while_capturing.extend(shown(len(before_keys) + len(expected)))

    with out_path.open("w") as out:
        output = Output(OutputOptions(view="json"), out)
        decoded = sniff_parallel(blocks, output, lambda: Analyzer(keylog=KeyLog([str(late_keys)], follow=True)), 2)
        output.finish()
    assert len(expected) == 64
    assert before_keys and [m for m in message_identities(before_keys) if m[0] < tls_streams] == []
    assert [m for m in message_identities(while_capturing) if m[0] < tls_streams] == expected
    assert decoded == len(message_identities(while_capturing))
