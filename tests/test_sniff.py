"""`kafkasniff sniff` on loopback, against a real broker and real clients.

The clients talk to the broker through the recording proxy, and the sniffer captures
the proxy's port: what the proxy recorded, frame by frame, is what the sniffer must
report, request by request and response by response.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import dpkt
import pytest

from broker import BROKER_TO_CLIENT, CLIENT_TO_BROKER, TansuBroker, TlsTerminator, free_port
from clients import (Message, admin_kafka_python, consume_kafka_python, group_session_kafka_python,
                     produce_kafka_python, tls_context)
from kafkasniff.capture import live
from kafkasniff.capture.live import LiveCapture
from kafkasniff.stream.tcp import A_TO_B, B_TO_A, Gap, StreamData, TcpReassembler
from loopback import converse, tls_exchange

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
PERMISSION_LINE = ("kafkasniff: no permission to capture on lo: run as root or give python CAP_NET_RAW: "
                   "sudo setcap cap_net_raw+ep $(readlink -f $(which python3))")
SUMMARY = re.compile(r"(\d+) packets captured, (\d+) Kafka messages decoded; "
                     r"kernel: (\d+) packets received by filter, (\d+) dropped$")
UNREAD = re.compile(r"; \d+ received but not read before the capture ended$")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="live capture needs Linux and root (CI runs as root)")


class Sniffer:
    """`python -m kafkasniff sniff ARGS` in the background; stdout goes to a file."""

    def __init__(self, args: list[str], stdout: Path, prefix: list[str] = ()):
        self.stdout_path = stdout
        # as users run it: stdout block-buffered (the sniffer must flush it itself)
        environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "kafkasniff", "sniff", *args], cwd=REPO, env=environment,
            stdin=subprocess.DEVNULL, stdout=stdout.open("w"), stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self.stderr.append(line.rstrip("\n"))
            if line.startswith("capturing on "):
                self._ready.set()
        self._ready.set()  # exited before capturing: wait_ready reports it

    def wait_ready(self) -> Sniffer:
        assert self._ready.wait(READY_TIMEOUT_S), "sniffer never said it was capturing"
        assert self.process.poll() is None, f"sniffer exited: {self.stderr}"
        return self

    def finish(self, stop_signal: int | None = signal.SIGINT) -> int:
        if stop_signal is not None:
            self.process.send_signal(stop_signal)
        returncode = self.process.wait(STOP_TIMEOUT_S)
        self._reader.join(5)
        return returncode

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout_path.read_text().splitlines()]

    def summary(self) -> tuple[int, int, int, int]:
        """(captured, decoded, received by the kernel's filter, dropped). A capture that ends while packets wait in
        its ring (-c N reached, a stop signal) adds how many it left unread: whether any are left depends on when
        the clients' next packets come (the test of a sniffer told twice to stop checks that count)."""
        match = SUMMARY.fullmatch(UNREAD.sub("", self.stderr[-1]))
        assert match, self.stderr
        return tuple(int(n) for n in match.groups())


def messages(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] in ("request", "response")]


def identity(e: dict) -> tuple:
    return e["stream"], e["kind"], e["api_key"], e["api_version"], e["correlation_id"], e["size"]


def record_values(body) -> list[bytes]:
    """Every record value in a decoded Produce request or Fetch response body."""
    found = []
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "offset" in node and "value" in node and "headers" in node:
                found.append(base64.b64decode(node["value"]["base64"]) if node["value"] else None)
            else:
                stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def shows_response(sniffer: Sniffer, api_name: str) -> bool:
    return any(e.get("api_name") == api_name and e["kind"] == "response" for e in sniffer.events())


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("jobs", ["1", "3"])
def test_live_capture_reports_every_exchange_paired_and_writes_a_readable_pcap(recorded_broker, tmp_path, jobs):
    """In one process, and on workers (this process capturing and reassembling TCP)."""
    topic, admin_topic = "sniffed", "sniffed-admin"
    recorded_broker.create_topic(topic, partitions=2)  # straight to the broker: not on the captured port
    port = recorded_broker.port
    pcap_path = tmp_path / "t.pcap"
    sniffer = Sniffer(["-i", "lo", "--port", str(port), "--json", "-w", str(pcap_path), "-j", jobs],
                      tmp_path / "live.jsonl").wait_ready()
    assert sniffer.stderr[0] == f"capturing on lo (filter tcp port {port}; writing {pcap_path})"

    big = random.Random(7).randbytes(1 << 20)  # incompressible: the request really is 1 MiB on the wire
    sent = [Message(b"k1", "plain text ✓".encode()), Message(None, b"\x00\xffbinary"), Message(b"big", big)]
    produce_kafka_python(recorded_broker.bootstrap, topic, sent, codec="zstd")
    group = group_session_kafka_python(recorded_broker.bootstrap, topic, "sniffed-group", len(sent),
                                       heartbeat_wait_s=1.0)
    assert sorted(c.value for c in group.consumed) == sorted(m.value for m in sent)
    admin_kafka_python(recorded_broker.bootstrap, [admin_topic])
    assert recorded_broker.wait_closed()
    # stdout is a file, not a terminal: the last response must be out while the sniffer still runs
    assert wait_for(lambda: shows_response(sniffer, "DeleteTopics"))

    assert sniffer.finish(signal.SIGINT) == 0
    live = sniffer.events()
    captured, decoded, kernel_packets, drops = sniffer.summary()
    assert (drops, kernel_packets) == (0, captured)
    assert [e for e in live if e["kind"] not in ("request", "response")] == []  # no gap, skip or TLS notice
    live_messages = messages(live)
    assert decoded == len(live_messages)
    assert all(e["malformed"] is None and e["trailing_bytes"] == 0 for e in live_messages)

    # Each recorded connection, frame by frame, is one sniffed stream, message by message.
    streams = {}
    for e in live_messages:
        client = e["src"] if e["kind"] == "request" else e["dst"]
        streams.setdefault(client, []).append(e)
    assert len(streams) == len(recorded_broker.connections)
    for connection in recorded_broker.connections:
        sniffed = streams[f"127.0.0.1:{connection.client_address[1]}"]
        requests = [struct.unpack_from(">hhi", f, 4) + (len(f) - 4,)
                    for f in connection.frames(CLIENT_TO_BROKER)]
        responses = [(struct.unpack_from(">i", f, 4)[0], len(f) - 4) for f in connection.frames(BROKER_TO_CLIENT)]
        assert [(e["api_key"], e["api_version"], e["correlation_id"], e["size"])
                for e in sniffed if e["kind"] == "request"] == requests
        assert [(e["correlation_id"], e["size"]) for e in sniffed if e["kind"] == "response"] == responses

    requests = {(e["stream"], e["correlation_id"]): e for e in live_messages if e["kind"] == "request"}
    responses = [e for e in live_messages if e["kind"] == "response"]
    assert sum(e["expects_response"] for e in requests.values()) == len(responses)
    for response in responses:
        request = requests[(response["stream"], response["correlation_id"])]
        assert (response["api_key"], response["api_version"]) == (request["api_key"], request["api_version"])
        assert response["latency_ms"] is not None and response["latency_ms"] >= 0
        assert response["inferred"] is False
    apis = Counter(e["api_name"] for e in live_messages if e["kind"] == "request")
    for api in ("Produce", "Fetch", "JoinGroup", "SyncGroup", "OffsetCommit", "LeaveGroup", "CreateTopics",
                "DeleteTopics", "DescribeConfigs"):
        assert apis[api] >= 1, api

    produced = [v for e in live_messages if e["api_name"] == "Produce" and e["kind"] == "request"
                for v in record_values(e["body"])]
    assert sorted(produced, key=len) == [b"\x00\xffbinary", "plain text ✓".encode(), big]
    fetched = [v for e in live_messages if e["api_name"] == "Fetch" and e["kind"] == "response"
               for v in record_values(e["body"])]
    assert big in fetched
    texts = [r["value"].get("text") for e in live_messages if e["api_name"] == "Produce" and e["kind"] == "request"
             for t in e["body"]["topic_data"] for p in t["partition_data"] for b in p["records"] for r in b["records"]]
    assert "plain text ✓" in texts

    # The pcap holds every captured packet, loopback's frames over 65,535 bytes whole.
    with pcap_path.open("rb") as f:
        reader = dpkt.pcap.Reader(f)
        assert (reader.datalink(), reader.snaplen) == (dpkt.pcap.DLT_EN10MB, 262144)
        lengths = [len(frame) for _, frame in reader]
    assert len(lengths) == captured
    assert max(lengths) > 65535

    decoded_file = subprocess.run([sys.executable, "-m", "kafkasniff", "decode", str(pcap_path), "--json"],
                                  cwd=REPO, capture_output=True, text=True, timeout=60)
    assert decoded_file.returncode == 0, decoded_file.stderr
    from_file = messages([json.loads(line) for line in decoded_file.stdout.splitlines()])
    assert [identity(e) for e in from_file] == [identity(e) for e in live_messages]

    if shutil.which("tshark"):
        read_back = subprocess.run(["tshark", "-r", str(pcap_path), "-T", "fields", "-e", "frame.cap_len"],
                                   capture_output=True, text=True, timeout=60)
        assert read_back.returncode == 0, read_back.stderr
        assert [int(n) for n in read_back.stdout.split()] == lengths


def test_sigterm_stops_cleanly_and_count_stops_after_n_messages(broker, unique_name, tmp_path):
    topic = unique_name()
    broker.create_topic(topic, partitions=1)
    pcap_path = tmp_path / "term.pcap"
    everything = Sniffer(["-i", "lo", "--port", str(broker.port), "--json", "-w", str(pcap_path), "-j", "2"],
                         tmp_path / "all.jsonl").wait_ready()
    first_three = Sniffer(["-i", "lo", "--port", str(broker.port), "--json", "-c", "3"],
                          tmp_path / "three.jsonl").wait_ready()
    produce_kafka_python(broker.bootstrap, topic, [Message(b"k", b"v")], codec="lz4")
    assert wait_for(lambda: shows_response(everything, "Produce"))

    assert first_three.finish(stop_signal=None) == 0  # ends by itself
    assert everything.finish(signal.SIGTERM) == 0
    assert everything.summary()[3] == 0
    every_message = messages(everything.events())
    assert [identity(e) for e in messages(first_three.events())] == [identity(e) for e in every_message[:3]]
    assert first_three.summary()[1] == 3

    decoded = subprocess.run([sys.executable, "-m", "kafkasniff", "decode", str(pcap_path), "--json"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert decoded.returncode == 0, decoded.stderr
    assert [identity(e) for e in messages(json.loads(line) for line in decoded.stdout.splitlines())] == \
        [identity(e) for e in every_message]
    assert [e["api_name"] for e in every_message if e["kind"] == "response"][-1] == "Produce"


@pytest.mark.parametrize("hint", [["--port", "{port}"], ["--filter", "tcp port {port}"]], ids=["port", "filter"])
def test_tls_is_recognised_live_whatever_names_the_port(tmp_path, certificate, hint):
    """Before, --port made the sniffer frame the TLS records as Kafka (`implausible frame size`)."""
    port = free_port()
    sniffer = Sniffer(["-i", "lo", "--json", *[arg.format(port=port) for arg in hint]],
                      tmp_path / "tls.jsonl").wait_ready()
    tls_exchange(port, certificate, b"Kafka inside TLS " * 100)
    assert wait_for(lambda: len(sniffer.events()) >= 3)
    assert sniffer.finish() == 0
    events = sniffer.events()
    assert [(e["kind"], e["notice"], e.get("direction")) for e in events] == [
        ("notice", "tls", None), ("notice", "tls", "c2s"), ("notice", "tls", "s2c")]
    assert re.fullmatch(r"TLS 1\.3, TLS_AES_256_GCM_SHA384, SNI localhost, client random [0-9a-f]{64}: not decoded: "
                        r"no key log given \(--tls-keylog FILE, or SSLKEYLOGFILE\)", events[0]["text"])
    assert [e["text"] for e in events[1:]] == ["TLS: encrypted bytes, not decoded"] * 2


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_tls_is_decrypted_live_as_the_client_logs_its_keys(tmp_path, certificate, version):
    """The key log does not exist when the sniffer starts: the client writes it as it connects, and the
    sniffer reads it again while keys are missing, holding the records until they come."""
    keys = tmp_path / "client.keys"
    tls_port = free_port()
    sent = [Message(b"k%d" % i, b"sniffed through TLS %d " % i * 20, (), i % 3) for i in range(6)]
    with TansuBroker(advertised_port=tls_port) as broker, TlsTerminator(tls_port, broker.port, certificate):
        broker.create_topic("live-tls", partitions=3)
        sniffer = Sniffer(["-i", "lo", "--json", "--port", str(tls_port), "--tls-keylog", str(keys)],
                          tmp_path / "tls.jsonl").wait_ready()
        context = tls_context(str(keys), version)
        produce_kafka_python(broker.bootstrap, "live-tls", sent, tls=context)
        consumed = consume_kafka_python(broker.bootstrap, "live-tls", len(sent), tls=context)
        assert wait_for(lambda: shows_response(sniffer, "Fetch"))
        assert sniffer.finish() == 0
    assert len(consumed) == len(sent)
    found = messages(sniffer.events())
    assert {e["tls"]["version"] for e in found} == {version}
    assert [e for e in sniffer.events() if e["kind"] == "notice" and e.get("direction") is None] == []
    produced = [v for e in found if e["api_name"] == "Produce" and e["kind"] == "request"
                for v in record_values(e["body"])]
    fetched = [v for e in found if e["api_name"] == "Fetch" and e["kind"] == "response"
               for v in record_values(e["body"])]
    assert sorted(produced) == sorted(fetched) == sorted(m.value for m in sent)


def test_duration_stops_an_idle_capture(tmp_path):
    sniffer = Sniffer(["-i", "lo", "--port", "1", "--duration", "0.5"], tmp_path / "out.txt").wait_ready()
    began = time.monotonic()
    assert sniffer.finish(stop_signal=None) == 0
    assert time.monotonic() - began < 3
    assert sniffer.summary() == (0, 0, 0, 0)
    assert sniffer.stdout_path.read_text() == ""


def run_sniff(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "kafkasniff", "sniff", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_list_interfaces_shows_loopback():
    done = run_sniff("--list-interfaces")
    assert done.returncode == 0
    loopback = [line for line in done.stdout.splitlines() if line.startswith("lo\t")]
    assert len(loopback) == 1 and loopback[0].startswith("lo\tup, loopback\t127.0.0.1")


@pytest.mark.parametrize("args, message", [
    (("-i", "nosuch0"), re.compile(r"kafkasniff: no interface 'nosuch0'; available: (\S+, )*lo(, \S+)* "
                                   r"\(see --list-interfaces\)")),
    (("-i", "lo", "--filter", "tcp port"),
     "kafkasniff: invalid capture filter 'tcp port': can't parse filter expression: syntax error"),
    ((), "kafkasniff: give the interface to capture on with -i (see --list-interfaces)"),
    (("-i", "any"), "kafkasniff: -i any is not supported: capture on one interface (see --list-interfaces), or on "
                    "all of them with tcpdump -i any -U -w - port 9092 | kafkasniff decode -"),
    (("-i", "lo", "-w", "/nonexistent-dir/x.pcap"),
     "kafkasniff: cannot write /nonexistent-dir/x.pcap: No such file or directory; choose a writable path for -w"),
    (("-i", "lo", "--any-port", "--filter", "tcp"),
     "kafkasniff: --any-port and --filter exclude each other: put the ports in the --filter expression"),
])
def test_usage_errors_are_one_line_with_exit_status_2(args, message):
    done = run_sniff(*args)
    assert (done.returncode, done.stdout) == (2, "")
    line = done.stderr.rstrip("\n")
    assert "\n" not in line
    assert message.fullmatch(line) if isinstance(message, re.Pattern) else line == message


def test_the_buffer_is_at_least_the_2_mib_of_the_rings_smallest_size():
    """The README's "at least 2": -B 1 made a 2 MiB ring anyway."""
    done = run_sniff("-i", "lo", "-B", "1")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == \
        "Error: Invalid value for '-B' / '--buffer-size': 1 is not in the range x>=2."


def _can_run_as_nobody() -> bool:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return False
    probe = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            "import kafkasniff.cli"], cwd=REPO, capture_output=True, timeout=60)
    return probe.returncode == 0


@pytest.mark.parametrize("who", ["root without CAP_NET_RAW", "nobody"])
def test_no_permission_to_capture_says_how_to_get_it(who, tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) not installed")
    if who == "nobody":
        if not _can_run_as_nobody():
            pytest.skip("user nobody cannot run this interpreter or read the checkout")
        prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    else:
        prefix = ("setpriv", "--bounding-set=-net_raw", "--inh-caps=-net_raw")
    pcap_path = tmp_path / "never.pcap"
    tmp_path.chmod(0o777)
    done = run_sniff("-i", "lo", "-w", str(pcap_path), prefix=prefix)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", PERMISSION_LINE + "\n")
    assert not pcap_path.exists()


def scrape(port: int) -> dict[tuple, float]:
    """The samples of http://127.0.0.1:PORT/metrics, by (name, sorted labels)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_port_serves_what_the_sniffer_decodes_and_top_shows_it(broker, unique_name, tmp_path):
    """A consumer group reads what a producer sent, with `sniff --metrics-port` (one-line view on standard
    output), `sniff -q --metrics-port` (no messages written) and `sniff --top` watching: the scrapes count the
    messages the one-line view showed, the lag and generation of the group, and the dashboard's last screen shows
    the same traffic."""
    topic, group = unique_name(), unique_name("metrics-group")
    broker.create_topic(topic, partitions=1)
    port, quiet_port = free_port(), free_port()
    lines = tmp_path / "lines.txt"
    metered = Sniffer(["-i", "lo", "--port", str(broker.port), "--metrics-port", str(port)], lines).wait_ready()
    quiet = Sniffer(["-i", "lo", "--port", str(broker.port), "--metrics-port", str(quiet_port), "-q"],
                    tmp_path / "quiet.txt").wait_ready()
    top = Sniffer(["-i", "lo", "--port", str(broker.port), "--top"], tmp_path / "top.txt").wait_ready()
    produce_kafka_python(broker.bootstrap, topic, [Message(b"k%d" % i, b"v%d" % i) for i in range(5)])
    session = group_session_kafka_python(broker.bootstrap, topic, group, 5)
    assert len(session.consumed) == 5
    assert wait_for(lambda: any(words[5:8:2] == ["LeaveGroup", "response"]
                                for words in map(str.split, lines.read_text().splitlines())))
    time.sleep(0.5)  # the client's last requests after leaving
    metrics = scrape(port)
    quiet_metrics = scrape(quiet_port)
    counted = [key for key in metrics if key[0] in ("kafkasniff_requests_total", "kafkasniff_topic_records_total")]
    assert counted and {key: quiet_metrics[key] for key in counted} == {key: metrics[key] for key in counted}
    shown = [line.split() for line in lines.read_text().splitlines()]
    for api in ("Produce", "Fetch", "JoinGroup", "OffsetCommit"):
        requests = sum(1 for words in shown if words[5] == api and words[7] == "request")
        responses = sum(1 for words in shown if words[5] == api and words[7] == "response")
        assert requests > 0
        assert metrics["kafkasniff_requests_total", (("api", api),)] == requests
        assert metrics["kafkasniff_latency_seconds_count", (("api", api),)] == responses
    assert metrics["kafkasniff_topic_records_total", (("direction", "produced"), ("topic", topic))] == 5
    assert metrics["kafkasniff_topic_records_total", (("direction", "fetched"), ("topic", topic))] == 5
    assert metrics["kafkasniff_generations_total", (("group", group),)] == 1
    assert metrics["kafkasniff_consumer_lag", (("consumer", group), ("partition", "0"), ("topic", topic))] == 0
    assert metrics["kafkasniff_committed_lag", (("group", group), ("partition", "0"), ("topic", topic))] == 0
    assert metrics["kafkasniff_end_to_end_latency_seconds_count", (("topic", topic),)] == 5
    assert metered.finish() == 0 and top.finish() == 0 and quiet.finish() == 0
    assert metered.summary()[3] == top.summary()[3] == quiet.summary()[3] == 0
    assert metered.summary()[1] == quiet.summary()[1]  # Kafka messages decoded, whether written or not
    assert (tmp_path / "quiet.txt").read_text() == ""
    screen = (tmp_path / "top.txt").read_text()
    assert "kafkasniff --top:" in screen and "rebalances" in screen
    assert [group, "│", topic, "│", "0", "│", "0"] in [line.split()[:7] for line in screen.splitlines()]


def sniffed_and_decoded(broker, tmp_path, view: list[str], jobs: str, traffic) -> tuple[str, str]:
    """What `sniff VIEW -j JOBS -w FILE` wrote while `traffic()` ran (nothing dropped), and what `decode VIEW -j 1`
    writes of the capture it wrote."""
    pcap_path, written = tmp_path / "sniffed.pcap", tmp_path / "written.txt"
    sniffer = Sniffer(["-i", "lo", "--port", str(broker.port), *view, "-w", str(pcap_path), "-j", jobs],
                      written).wait_ready()
    traffic()
    assert sniffer.finish() == 0
    assert sniffer.summary()[3] == 0
    decoded = subprocess.run([sys.executable, "-m", "kafkasniff", "decode", *view, "-j", "1", str(pcap_path)],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert decoded.returncode == 0, decoded.stderr
    return written.read_text(), decoded.stdout


def test_stats_on_workers_count_what_the_written_capture_counts(broker, unique_name, tmp_path):
    """`sniff --stats -j 3`: the workers count each message's API, client and bytes, this process its topics and the
    analyses in capture order; the tables are those of `decode --stats` of the capture it wrote, in one process."""
    topic, group = unique_name(), unique_name("stats-group")
    broker.create_topic(topic, partitions=2)

    def traffic():
        produce_kafka_python(broker.bootstrap, topic, [Message(b"k%d" % i, b"v%d" % i) for i in range(7)])
        assert len(group_session_kafka_python(broker.bootstrap, topic, group, 7).consumed) == 7
        time.sleep(0.5)  # the client's last requests after leaving

    tables, decoded = sniffed_and_decoded(broker, tmp_path, ["--stats"], "3", traffic)
    assert tables == decoded
    for api in ("Produce", "Fetch", "JoinGroup", "OffsetCommit"):
        assert re.search(rf"^ {api} +│ +[1-9]", decoded, re.MULTILINE), api
    # the 7 records produced, and fetched by the group
    assert re.search(rf"^ {topic} +│ +[0-9,]+ │ +[0-9,]+ │ +7 │ +7$", decoded, re.MULTILINE)


def test_trees_on_workers_are_those_of_the_written_capture(broker, unique_name, tmp_path):
    """`sniff -V -j 2` into a file: the workers write each message's tree, this process names the topics in capture
    order; what it wrote is `decode -V` of the capture it wrote, in one process."""
    topic = unique_name()
    broker.create_topic(topic, partitions=2)
    trees, decoded = sniffed_and_decoded(broker, tmp_path, ["-V"], "2", lambda: produce_kafka_python(
        broker.bootstrap, topic, [Message(b"k%d" % i, b"v%d" % i) for i in range(7)]))
    assert trees == decoded
    assert decoded.count(f"Name: '{topic}'") >= 2 and "value: 'v6'" in decoded


# -- the ring itself, read in this process -------------------------------------------------------------


def read_after_stop(capture: LiveCapture) -> list:
    """Every segment of a capture that was told to stop: what the kernel holds, all of it."""
    capture.stop()
    return [segment for batch in capture.segment_batches() if batch is not None for segment in batch]


def read_during(capture: LiveCapture, action) -> list:
    """Every segment of the capture while `action()` runs, read as it comes (as sniff reads), then what the kernel
    holds once told to stop: the ring need not hold the whole of a slow `action` (a loaded machine)."""
    segments = []
    reader = threading.Thread(target=lambda: segments.extend(
        segment for batch in capture.segment_batches() if batch is not None for segment in batch))
    reader.start()
    try:
        action()
    finally:
        capture.stop()
        reader.join()
    return segments


def stream_events(segments: list) -> list:
    reassembler = TcpReassembler()
    return reassembler.feed_all(segments) + reassembler.flush()


def test_ring_capture_holds_exactly_the_bytes_of_a_connection():
    """Both directions of a connection, frames of up to 64 KiB among them, come out of the ring whole and in
    order, each counted by the kernel and read once."""
    rng = random.Random(11)
    steps = [(True, rng.randbytes(100)), (False, rng.randbytes(3 << 20)), (True, rng.randbytes(300_000)),
             (False, rng.randbytes(7))]
    port = free_port()
    with LiveCapture("lo", f"tcp port {port}") as capture:
        segments = read_during(capture, lambda: converse(port, steps))
        assert capture.kernel_stats() == (capture.frames, 0)
    assert len(segments) == capture.frames and capture.skipped == {}
    assert max(len(s.payload) for s in segments) > 65_000  # loopback's big frames, whole
    assert [s.ts for s in segments] == sorted(s.ts for s in segments)
    events = stream_events(segments)
    assert not [e for e in events if type(e) is Gap]
    for direction, from_client in ((A_TO_B, True), (B_TO_A, False)):
        assert b"".join(e.data for e in events if type(e) is StreamData and e.direction == direction) == \
            b"".join(data for sender, data in steps if sender == from_client)


def test_a_full_ring_drops_and_the_kernel_counter_says_how_many():
    """Nothing reads a ring of the smallest size while 16 MiB go by: the kernel drops what does not fit and
    counts it; every frame it kept is read, and every byte delivered is the byte sent at that offset."""
    sent = random.Random(5).randbytes(16 << 20)
    port = free_port()
    with LiveCapture("lo", f"tcp port {port}", buffer_bytes=1) as capture:
        assert capture.buffer_bytes == live.RING_MIN_BLOCKS * (512 << 10)  # blocks hold a 256 KiB frame
        converse(port, [(True, sent[at:at + (2 << 20)]) for at in range(0, len(sent), 2 << 20)])
        segments = read_after_stop(capture)
        packets, drops = capture.kernel_stats()
    assert drops > 0 and packets - drops == capture.frames == len(segments)
    delivered = [e for e in stream_events(segments) if type(e) is StreamData and e.direction == A_TO_B]
    assert 0 < sum(len(e.data) for e in delivered) < len(sent)
    assert all(sent[e.offset:e.offset + len(e.data)] == e.data for e in delivered)


def test_a_sniffer_told_twice_to_stop_says_how_many_packets_it_left_unread(tmp_path):
    """Stopped (SIGSTOP) while a connection's bursts fill several blocks of the ring, then asked to stop twice
    (SIGINT, SIGTERM: a second request ends the capture at once): what the kernel received but the sniffer never
    read is counted in its summary, not lost silently."""
    port = free_port()
    sniffer = Sniffer(["-i", "lo", "--port", str(port)], tmp_path / "out.txt").wait_ready()
    sniffer.process.send_signal(signal.SIGSTOP)
    try:
        bursts = [(from_client, bytes(200)) for from_client in (True, False) * 4]
        converse(port, bursts, before={i: lambda: time.sleep(2.5 * live.RING_BLOCK_TIMEOUT_MS / 1000)
                                       for i in range(len(bursts))})  # a block handed over after each
        sniffer.process.send_signal(signal.SIGINT)
        sniffer.process.send_signal(signal.SIGTERM)
    finally:
        sniffer.process.send_signal(signal.SIGCONT)
    assert sniffer.finish(None) == 0
    summary = re.fullmatch(SUMMARY.pattern.rstrip("$") + r"; (\d+) received but not read before the capture ended",
                           sniffer.stderr[-1])
    assert summary, sniffer.stderr
    captured, _, received, drops, unread = (int(n) for n in summary.groups())
    assert drops == 0 and unread > 0 and captured + unread == received


def test_stop_from_a_signal_handler_wakes_a_blocked_read(monkeypatch):
    monkeypatch.setattr(live, "IDLE_WAKEUP_S", 60.0)  # a read that is not woken waits a minute
    with LiveCapture("lo", f"tcp port {free_port()}") as capture:
        previous = signal.signal(signal.SIGALRM, lambda *_: capture.stop())
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            began = time.monotonic()
            batches = list(capture.segment_batches())
            waited = time.monotonic() - began
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    assert batches == [] and 0.25 < waited < 5
