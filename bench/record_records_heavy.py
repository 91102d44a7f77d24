"""Record a records-heavy capture: real clients, big batches of small records, every codec, big fetches.

Starts a Tansu broker (in-memory storage) on a free loopback port, creates one topic of 3
partitions per (client, codec), starts tcpdump on that port and, --rounds times:

1. produces --records records to each topic with that topic's client and codec: kafka-python,
   confluent-kafka (librdkafka) and aiokafka producers, each kept open for the whole recording,
   with linger and batch sizes large enough that one batch holds thousands of records;
2. right after each client's turn, reads back what it produced with consumers of the other
   clients (`--fetchers 1`: client i's topics are read by client i+1; 2: also by client i+2),
   each a fresh consumer assigning the partitions at the offsets where the turn began and
   fetching with 1 MB+ limits, so Fetch responses carry megabytes of batches.

Record contents are seeded (--seed, the client, the codec and the round), so every recording
carries the same keys, values and headers; timestamps, client ports and how records fall into
batches vary. Values are 20-200 bytes (--value-bytes): JSON-like events, words, and about 15% random bytes; 70%
of records have a key, about 40% one or two headers. The capture is a sequence of turns (round 1:
kafka-python produces to its 5 topics, confluent-kafka and aiokafka fetch them; then
confluent-kafka produces, ...), so its first few MB hold every codec, Produce and Fetch
(bench/instructions.py --cut-mb).

    python bench/record_records_heavy.py /tmp/records_heavy.pcap [--rounds 3] [--records 6000] [--fetchers 2]

--tls OUT records the same workload (kafka-python and aiokafka only: librdkafka writes no key log)
through `socat openssl-listen` (TLS 1.3, AES-256-GCM, OpenSSL's default) in front of the broker, the
clients logging their keys to OUT.keys, and captures both legs at once: OUT holds the TLS side and
OUT.plain.pcap socat's plaintext side to the broker, the same Kafka bytes. `decode OUT --tls-keylog OUT.keys`
against `decode OUT.plain.pcap` is the cost of decrypting (bench/tls_bench.py).

Needs root (tcpdump). Writes OUT and OUT.json: broker port, packets, bytes, tcpdump's drop count,
records produced per client and codec, records fetched per consumer and topic. Fails if the
kernel dropped any packet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

from broker import TansuBroker, Tcpdump, TlsTerminator, free_port, make_certificate
from clients import CODECS, tls_context
from record_captures import CLOSE_SETTLE_S

CLIENTS = ("kafka-python", "confluent-kafka", "aiokafka")
PARTITIONS = 3
BATCH_BYTES = 1_000_000  # per partition batch: ~7,000 of these records uncompressed
REQUEST_BYTES = 8 * 1024 * 1024
VALUE_BYTES = (20, 200)  # smallest and largest record value, by default
LINGER_MS = 1000  # every round ends with flush(), so batches fill up or are flushed whole
PARTITION_FETCH_BYTES = 4 * 1024 * 1024
FETCH_BYTES = 16 * 1024 * 1024
FETCH_WAIT_MS = 100  # Tansu holds a fetch of an empty partition for the whole wait
CONSUME_TIMEOUT_S = 120.0

EVENTS = ("view", "click", "add_to_cart", "checkout", "search", "login", "logout", "rate")
SECTIONS = ("products", "cart", "search", "account", "help", "blog")
WORDS = ("kafka", "record", "batch", "offset", "partition", "broker", "topic", "leader", "replica",
         "consumer", "producer", "fetch", "commit", "segment", "index", "stream", "latency", "bytes")

Record = tuple[bytes | None, bytes, list[tuple[str, bytes]]]
# Python clients' options for a TLS recording (--tls): {"security_protocol": "SSL", "ssl_context": ...}
tls_options: dict = {}


def topic_name(client: str, codec: str) -> str:
    return f"rh-{client}-{codec}"


def make_records(seed: str, count: int, value_bytes: tuple[int, int] = VALUE_BYTES) -> list[Record]:
    """`count` records, the same for the same seed: (key or None, value of value_bytes[0]-value_bytes[1] bytes,
    headers)."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        size = rng.randint(*value_bytes)
        kind = rng.random()
        if kind < 0.6:
            text = (f'{{"user":"u{rng.randrange(100_000):05d}","event":"{rng.choice(EVENTS)}",'
                    f'"page":"/{rng.choice(SECTIONS)}/{rng.randrange(10_000)}","seq":{i},'
                    f'"ms":{rng.randrange(1_000)},"ok":{"true" if rng.random() < 0.9 else "false"}')
            while len(text) < size:
                text += f',"{rng.choice(WORDS)}":"{rng.choice(WORDS)}"'
            value = (text[:size - 1] + "}").encode()
        elif kind < 0.85:
            text = " ".join(rng.choice(WORDS) for _ in range(size // 4 + 1))
            value = text[:size].encode()
        else:
            value = rng.randbytes(size)
        key = f"user-{rng.randrange(100_000):05d}".encode() if rng.random() < 0.7 else None
        headers = []
        roll = rng.random()
        if roll < 0.4:
            headers.append(("trace-id", rng.randbytes(8).hex().encode()))
        if roll < 0.1:
            headers.append(("source", rng.choice(SECTIONS).encode()))
        records.append((key, value, headers))
    return records


# --- producers: one per (client, codec), open for the whole recording ----------------------

class KafkaPythonProducer:
    def __init__(self, bootstrap: str, codec: str):
        from kafka import KafkaProducer

        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
            linger_ms=LINGER_MS, batch_size=BATCH_BYTES, max_request_size=REQUEST_BYTES,
            acks=1, **tls_options)

    def produce(self, topic: str, records: list[Record]) -> dict[int, int]:
        futures = [self.producer.send(topic, value=value, key=key, headers=headers)
                   for key, value, headers in records]
        self.producer.flush()
        return _count_partitions(future.get(timeout=60).partition for future in futures)

    def close(self) -> None:
        self.producer.close()


class ConfluentProducer:
    def __init__(self, bootstrap: str, codec: str):
        from confluent_kafka import Producer

        self.producer = Producer({
            "bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": LINGER_MS,
            "batch.size": BATCH_BYTES, "batch.num.messages": 100_000, "message.max.bytes": REQUEST_BYTES,
            "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576, "acks": 1})

    def produce(self, topic: str, records: list[Record]) -> dict[int, int]:
        partitions: list[int] = []
        errors = []

        def delivered(error, report) -> None:
            if error is not None:
                errors.append(error)
            else:
                partitions.append(report.partition())

        for key, value, headers in records:
            self.producer.produce(topic, value=value, key=key, headers=headers, on_delivery=delivered)
            self.producer.poll(0)
        self.producer.flush(60)
        if errors or len(partitions) != len(records):
            raise RuntimeError(f"confluent-kafka delivered {len(partitions)} of {len(records)}: {errors[:3]}")
        return _count_partitions(partitions)

    def close(self) -> None:
        self.producer.flush(10)


class AiokafkaProducer:
    def __init__(self, bootstrap: str, codec: str, loop: asyncio.AbstractEventLoop):
        from aiokafka import AIOKafkaProducer

        async def start() -> AIOKafkaProducer:  # aiokafka objects are made inside their event loop
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
                linger_ms=LINGER_MS, max_batch_size=BATCH_BYTES, max_request_size=REQUEST_BYTES, acks=1,
                **tls_options)
            await producer.start()
            return producer

        self.loop = loop
        self.producer = loop.run_until_complete(start())

    def produce(self, topic: str, records: list[Record]) -> dict[int, int]:
        async def run() -> list[int]:
            futures = [await self.producer.send(topic, value=value, key=key, headers=headers)
                       for key, value, headers in records]
            await self.producer.flush()
            return [(await future).partition for future in futures]

        return _count_partitions(self.loop.run_until_complete(run()))

    def close(self) -> None:
        self.loop.run_until_complete(self.producer.stop())


def _count_partitions(partitions) -> dict[int, int]:
    counts = {p: 0 for p in range(PARTITIONS)}
    for p in partitions:
        counts[p] += 1
    return counts


# --- consumers: a fresh one per round, partitions assigned at the round's first offsets ------

Assignment = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> (first offset, records)


def consume_kafka_python(bootstrap: str, assignment: Assignment, _loop) -> dict[str, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_bytes=FETCH_BYTES, max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
                             fetch_max_wait_ms=FETCH_WAIT_MS, max_poll_records=1_000_000,
                             receive_buffer_bytes=4 * 1024 * 1024, **tls_options)
    try:
        partitions = [TopicPartition(topic, p) for topic, p in assignment]
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, assignment[tp.topic, tp.partition][0])
        counts = _expected_zero(assignment)
        wanted = sum(n for _first, n in assignment.values())
        got = 0
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while got < wanted and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                counts[tp.topic] += len(records)
                got += len(records)
        return counts
    finally:
        consumer.close()


def consume_confluent(bootstrap: str, assignment: Assignment, _loop) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "records-heavy-assign-only", "enable.auto.commit": False,
        "fetch.wait.max.ms": FETCH_WAIT_MS, "fetch.max.bytes": FETCH_BYTES,
        "max.partition.fetch.bytes": PARTITION_FETCH_BYTES, "receive.message.max.bytes": FETCH_BYTES + 1_000_000,
        "message.max.bytes": REQUEST_BYTES})
    try:
        consumer.assign([TopicPartition(topic, p, first) for (topic, p), (first, _n) in assignment.items()])
        counts = _expected_zero(assignment)
        wanted = sum(n for _first, n in assignment.values())
        got = 0
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while got < wanted and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=100_000, timeout=0.5):
                if message.error() is None:
                    counts[message.topic()] += 1
                    got += 1
        return counts
    finally:
        consumer.close()


def consume_aiokafka(bootstrap: str, assignment: Assignment, loop: asyncio.AbstractEventLoop) -> dict[str, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> dict[str, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    fetch_max_bytes=FETCH_BYTES, max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
                                    fetch_max_wait_ms=FETCH_WAIT_MS, **tls_options)
        await consumer.start()
        try:
            partitions = [TopicPartition(topic, p) for topic, p in assignment]
            consumer.assign(partitions)
            for tp in partitions:
                consumer.seek(tp, assignment[tp.topic, tp.partition][0])
            counts = _expected_zero(assignment)
            wanted = sum(n for _first, n in assignment.values())
            got = 0
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while got < wanted and time.monotonic() < deadline:
                for tp, records in (await consumer.getmany(timeout_ms=500, max_records=1_000_000)).items():
                    counts[tp.topic] += len(records)
                    got += len(records)
            return counts
        finally:
            await consumer.stop()

    return loop.run_until_complete(run())


CONSUMERS = {"kafka-python": consume_kafka_python, "confluent-kafka": consume_confluent,
             "aiokafka": consume_aiokafka}


def _expected_zero(assignment: Assignment) -> dict[str, int]:
    return {topic: 0 for topic, _p in assignment}


# --- the recording ------------------------------------------------------------------------

PRODUCERS = {"kafka-python": lambda bootstrap, codec, _loop: KafkaPythonProducer(bootstrap, codec),
             "confluent-kafka": lambda bootstrap, codec, _loop: ConfluentProducer(bootstrap, codec),
             "aiokafka": AiokafkaProducer}


def open_producers(bootstrap: str, loop: asyncio.AbstractEventLoop, clients) -> dict[tuple[str, str], object]:
    return {(client, codec): PRODUCERS[client](bootstrap, codec, loop) for codec in CODECS for client in clients}


def record(bootstrap: str, rounds: int, per_topic: int, fetchers: int, seed: int, log, clients=CLIENTS,
           value_bytes: tuple[int, int] = VALUE_BYTES) -> dict:
    loop = asyncio.new_event_loop()
    produced = {client: {codec: 0 for codec in CODECS} for client in clients}
    fetched = {client: {} for client in clients}
    next_offset = {(topic_name(c, k), p): 0 for c in clients for k in CODECS for p in range(PARTITIONS)}
    producers = open_producers(bootstrap, loop, clients)
    try:
        for round_no in range(rounds):
            for i, client in enumerate(clients):
                began = time.monotonic()
                step_first = dict(next_offset)
                for codec in CODECS:
                    topic = topic_name(client, codec)
                    records = make_records(f"{seed}/{client}/{codec}/{round_no}", per_topic, value_bytes)
                    for partition, n in producers[client, codec].produce(topic, records).items():
                        next_offset[topic, partition] += n
                    produced[client][codec] += per_topic
                produce_s = time.monotonic() - began
                assignment = {(topic_name(client, codec), p): (step_first[topic_name(client, codec), p],
                                                                next_offset[topic_name(client, codec), p]
                                                                - step_first[topic_name(client, codec), p])
                              for codec in CODECS for p in range(PARTITIONS)}
                assignment = {key: span for key, span in assignment.items() if span[1]}
                wanted = sum(n for _first, n in assignment.values())
                readers = [clients[(i + step) % len(clients)] for step in range(1, fetchers + 1)]
                for consumer in readers:
                    counts = CONSUMERS[consumer](bootstrap, assignment, loop)
                    if sum(counts.values()) < wanted:
                        raise RuntimeError(f"round {round_no + 1}: {consumer} read {sum(counts.values())} "
                                           f"of {wanted} records of {client}")
                    for topic, n in counts.items():
                        fetched[consumer][topic] = fetched[consumer].get(topic, 0) + n
                log(f"round {round_no + 1}/{rounds}, {client}: produced {per_topic * len(CODECS):,} records "
                    f"in {produce_s:.1f} s; {' and '.join(readers)} read them back in "
                    f"{time.monotonic() - began - produce_s:.1f} s")
    finally:
        for producer in producers.values():
            producer.close()
        loop.close()
    return {"produced": produced, "fetched": fetched}


def client_versions(clients) -> dict[str, str]:
    import confluent_kafka

    versions = {name: importlib.metadata.version(name) for name in clients}
    if "confluent-kafka" in versions:
        versions["confluent-kafka"] += f" (librdkafka {confluent_kafka.libversion()[0]})"
    return versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="produce-then-fetch rounds")
    parser.add_argument("--records", type=int, default=6000, help="records per topic (client and codec) per round")
    parser.add_argument("--fetchers", type=int, choices=(1, 2), default=2,
                        help="consumers reading each round's records (of the other clients)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--value-bytes", type=int, nargs=2, default=VALUE_BYTES, metavar=("MIN", "MAX"),
                        help="sizes of the record values (default 20 200)")
    parser.add_argument("--tls", action="store_true",
                        help="through TLS, Python clients only; also writes OUT.keys and OUT.plain.pcap")
    args = parser.parse_args()
    clients = ("kafka-python", "aiokafka") if args.tls else CLIENTS

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    began = time.monotonic()
    tls_port = free_port() if args.tls else None
    with TansuBroker(advertised_port=tls_port) as broker, contextlib.ExitStack() as stack:
        software = subprocess.run([str(broker.binary), "--version"], capture_output=True, text=True,
                                  check=False).stdout.strip()
        for client in clients:
            for codec in CODECS:
                broker.create_topic(topic_name(client, codec), partitions=PARTITIONS)
        port = broker.port
        dumps = []
        if args.tls:
            keylog = Path(f"{args.output}.keys")
            keylog.unlink(missing_ok=True)
            certificate = make_certificate(Path(stack.enter_context(tempfile.TemporaryDirectory())))
            stack.enter_context(TlsTerminator(tls_port, broker.port, certificate))
            tls_options.update(security_protocol="SSL", ssl_context=tls_context(str(keylog), "1.3"))
            dumps.append(stack.enter_context(Tcpdump(Path(f"{args.output}.plain.pcap"), broker.port)))
            port = tls_port
        log(f"{software} on port {broker.port}; tcpdump to {args.output}")
        with Tcpdump(args.output, port) as dump:
            counts = record(broker.bootstrap, args.rounds, args.records, args.fetchers, args.seed, log, clients,
                            tuple(args.value_bytes))
            time.sleep(CLOSE_SETTLE_S)
    for recorded in [dump, *dumps]:
        if recorded.dropped:
            raise SystemExit(f"tcpdump: kernel dropped {recorded.dropped} packets; record again")

    produced_total = sum(n for per_codec in counts["produced"].values() for n in per_codec.values())
    fetched_total = sum(n for per_topic in counts["fetched"].values() for n in per_topic.values())
    summary = {
        "capture": str(args.output),
        "bytes": args.output.stat().st_size,
        "packets": dump.captured,
        "dropped_by_kernel": dump.dropped,
        "broker_ports": [port],
        "broker": software,
        "clients": client_versions(clients),
        "tls": {"keylog": f"{args.output}.keys", "plaintext_twin": f"{args.output}.plain.pcap",
                "version": "1.3"} if args.tls else None,
        "tcpdump": " ".join(dump.command),
        "rounds": args.rounds,
        "records_per_topic_per_round": args.records,
        "fetchers_per_topic": args.fetchers,
        "seed": args.seed,
        "topics": {topic_name(c, k): {"client": c, "codec": k, "partitions": PARTITIONS}
                   for c in clients for k in CODECS},
        "settings": {"batch_bytes": BATCH_BYTES, "linger_ms": LINGER_MS, "max_request_bytes": REQUEST_BYTES,
                     "fetch_max_bytes": FETCH_BYTES, "max_partition_fetch_bytes": PARTITION_FETCH_BYTES,
                     "fetch_max_wait_ms": FETCH_WAIT_MS, "acks": 1},
        "records_produced": counts["produced"],
        "records_fetched": counts["fetched"],
        "records_produced_total": produced_total,
        "records_fetched_total": fetched_total,
        "records_total": produced_total + fetched_total,
        "note": "counts are what the clients acknowledged and returned; the wire can carry more fetched records "
                "(a client may fetch a batch again or discard a prefetch)",
        "built_from": "real clients against Tansu on loopback (bench/record_records_heavy.py)",
        "seconds": round(time.monotonic() - began, 1),
    }
    Path(f"{args.output}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("capture", "bytes", "packets", "dropped_by_kernel", "broker_ports",
                                              "records_produced_total", "records_fetched_total", "seconds")},
                     indent=1))


if __name__ == "__main__":
    main()
