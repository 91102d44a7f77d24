"""Drivers that make real Kafka clients talk to a broker.

Used by tests (through the recording proxy) and by tools/record_captures.py
(under tcpdump). Every driver is synchronous, takes a bootstrap address and
returns plain records of what the client reported, so the caller can write
them into a manifest or compare them with decoded traffic.

Clients covered: kafka-python, confluent-kafka (librdkafka) and aiokafka.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Iterable

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
KAFKA_PYTHON_PINNED_VERSIONS = ((0, 11), (1, 0), (2, 0), (2, 5), (3, 0))
GROUP_SESSION_TIMEOUT_MS = 6000  # Tansu answers a first JoinGroup after ~half of it
CONSUME_TIMEOUT_S = 20.0
LARGE_MESSAGE_LIMIT = 4 * 1024 * 1024  # lets clients send and fetch the >= 1 MiB test value

Headers = tuple[tuple[str, "bytes | None"], ...]


@dataclass(frozen=True)
class Message:
    """What a producer is asked to send. `partition=None` lets the client choose."""

    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    partition: int | None = None


@dataclass(frozen=True)
class Delivered:
    """A produced message with the partition and offset the broker acknowledged."""

    topic: str
    partition: int
    offset: int
    message: Message


@dataclass(frozen=True)
class Consumed:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def _client_codec(codec: str) -> str | None:
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, not {codec!r}")
    return None if codec == "none" else codec


def _sorted(consumed: Iterable[Consumed]) -> list[Consumed]:
    return sorted(consumed, key=lambda c: (c.topic, c.partition, c.offset))


# --- kafka-python ---------------------------------------------------------

def _kafka_python_options(api_version: tuple[int, ...] | None) -> dict:
    return {"api_version": api_version} if api_version else {}


def _kafka_python_idempotence(api_version: tuple[int, ...] | None) -> bool:
    # Older pins send InitProducerId v0/v1, which Tansu rejects; they produce without a producer id.
    return api_version is None or api_version >= (2, 5)


def produce_kafka_python(bootstrap: str, topic: str, messages: Iterable[Message], codec: str = "none",
                         api_version: tuple[int, ...] | None = None, transactional_id: str | None = None,
                         commit: bool = True, linger_ms: int = 20) -> list[Delivered]:
    """Produce with kafka-python; with `transactional_id`, inside one transaction that commits or aborts."""
    from kafka import KafkaProducer

    options = _kafka_python_options(api_version)
    if transactional_id:
        options["transactional_id"] = transactional_id
    else:
        options["enable_idempotence"] = _kafka_python_idempotence(api_version)
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=_client_codec(codec),
                             linger_ms=linger_ms, max_request_size=LARGE_MESSAGE_LIMIT, **options)
    try:
        if transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
        pending = [(message, producer.send(topic, value=message.value, key=message.key,
                                           headers=list(message.headers), partition=message.partition))
                   for message in messages]
        producer.flush()
        delivered = []
        for message, future in pending:
            metadata = future.get(timeout=10)
            delivered.append(Delivered(topic, metadata.partition, metadata.offset, message))
        if transactional_id:
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
        return delivered
    finally:
        producer.close()


def consume_kafka_python(bootstrap: str, topic: str, count: int, api_version: tuple[int, ...] | None = None,
                         read_committed: bool = False) -> list[Consumed]:
    """Read `count` messages from the start of every partition of `topic`, without a group."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_bytes=LARGE_MESSAGE_LIMIT,
                             max_partition_fetch_bytes=LARGE_MESSAGE_LIMIT,
                             isolation_level="read_committed" if read_committed else "read_uncommitted",
                             **_kafka_python_options(api_version))
    try:
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        partitions = None
        while partitions is None and time.monotonic() < deadline:
            partitions = consumer.partitions_for_topic(topic)
            if partitions is None:
                time.sleep(0.05)
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions or ())])
        consumer.seek_to_beginning()
        return _poll_kafka_python(consumer, count, deadline)
    finally:
        consumer.close()


def _poll_kafka_python(consumer, count: int, deadline: float) -> list[Consumed]:
    consumed: list[Consumed] = []
    while len(consumed) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            consumed += [Consumed(r.topic, r.partition, r.offset, r.key, r.value,
                                  tuple((k, v) for k, v in r.headers)) for r in records]
    return _sorted(consumed)


@dataclass(frozen=True)
class GroupSession:
    group_id: str
    consumed: list[Consumed]
    committed: dict[int, int]  # partition -> committed offset
    heartbeats_waited_s: float


def group_session_kafka_python(bootstrap: str, topic: str, group_id: str, count: int,
                               heartbeat_wait_s: float = 2.5) -> GroupSession:
    """Join `group_id`, read `count` messages, stay long enough to heartbeat, commit, leave.

    The wire carries FindCoordinator, JoinGroup, SyncGroup, OffsetFetch,
    Fetch, Heartbeat, OffsetCommit and LeaveGroup.
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group_id,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=GROUP_SESSION_TIMEOUT_MS, heartbeat_interval_ms=1000)
    try:
        consumed = _poll_kafka_python(consumer, count, time.monotonic() + CONSUME_TIMEOUT_S)
        waited_from = time.monotonic()
        while time.monotonic() - waited_from < heartbeat_wait_s:
            consumer.poll(timeout_ms=200)
        consumer.commit()
        committed = {tp.partition: consumer.committed(tp)
                     for tp in (TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic)))}
        return GroupSession(group_id, consumed, committed, time.monotonic() - waited_from)
    finally:
        consumer.close()  # sends LeaveGroup


def admin_kafka_python(bootstrap: str, topics: list[str], group_id: str | None = None,
                       partitions: int = 2) -> dict[str, object]:
    """Create `topics`, describe them, the cluster and `group_id` (if given), then delete the topics.

    Returns, per admin call in wire order, a short result or the error the client raised.
    """
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)

    def create_topics() -> list[str]:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs={"retention.ms": "3600000"})
                             for name in topics])
        return sorted(topics)

    def delete_topics() -> list[str]:
        admin.delete_topics(topics)
        return sorted(topics)

    calls = [
        ("create_topics", create_topics),
        ("list_topics", lambda: sorted(set(admin.list_topics()) & set(topics))),
        ("describe_topics", lambda: sorted((t["name"], len(t["partitions"])) for t in admin.describe_topics(topics))),
        ("describe_configs", lambda: {name: sorted(configs) for name, configs in admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in topics], config_filter="all")["topic"].items()}),
        ("describe_cluster", lambda: admin.describe_cluster()["cluster_id"]),
    ]
    if group_id is not None:
        calls += [
            ("list_groups", lambda: group_id in {g["group_id"] for g in admin.list_groups()}),
            ("describe_groups", lambda: [(g["group_id"], g["group_state"]) for g in admin.describe_groups([group_id])]),
            ("list_group_offsets", lambda: sorted((tp.topic, tp.partition, committed.offset)
                                                  for tp, committed in admin.list_group_offsets(group_id)[group_id].items())),
        ]
    calls.append(("delete_topics", delete_topics))
    try:
        return {name: _outcome(call) for name, call in calls}
    finally:
        admin.close()


def _outcome(call) -> object:
    """The call's result, or the error it raised: some admin APIs are missing from some brokers."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - the error itself is the result being recorded
        return f"error: {type(error).__name__}: {error}"


# --- confluent-kafka (librdkafka) -----------------------------------------

def _confluent_base(bootstrap: str) -> dict:
    return {"bootstrap.servers": bootstrap, "message.max.bytes": LARGE_MESSAGE_LIMIT}


def produce_confluent(bootstrap: str, topic: str, messages: Iterable[Message], codec: str = "none",
                      transactional_id: str | None = None, commit: bool = True,
                      linger_ms: int = 20) -> list[Delivered]:
    """Produce with librdkafka; with `transactional_id`, inside one transaction that commits or aborts."""
    from confluent_kafka import Producer

    config = _confluent_base(bootstrap) | {"compression.type": codec, "linger.ms": linger_ms}
    if transactional_id:
        config["transactional.id"] = transactional_id
    producer = Producer(config)
    reports: dict[int, object] = {}
    errors = []

    def on_delivery(index: int, error, report) -> None:
        if error is not None:
            errors.append(error)
        else:
            reports[index] = report

    if transactional_id:
        producer.init_transactions(30)
        producer.begin_transaction()
    messages = list(messages)
    for index, message in enumerate(messages):
        options = {"partition": message.partition} if message.partition is not None else {}
        producer.produce(topic, value=message.value, key=message.key, headers=list(message.headers),
                         on_delivery=lambda error, report, i=index: on_delivery(i, error, report), **options)
    producer.flush(30)
    if transactional_id:
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    if errors or len(reports) != len(messages):
        raise RuntimeError(f"confluent-kafka delivered {len(reports)} of {len(messages)}: {errors}")
    return [Delivered(topic, reports[i].partition(), reports[i].offset(), message)
            for i, message in enumerate(messages)]


def admin_confluent(bootstrap: str, topics: list[str], group_id: str | None = None,
                    partitions: int = 2) -> dict[str, object]:
    """librdkafka's view of the same admin round as `admin_kafka_python`."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def each(futures: dict) -> dict:
        return {str(key): future.result(30) for key, future in futures.items()}

    calls = [
        ("create_topics", lambda: sorted(each(admin.create_topics(
            [NewTopic(name, partitions, 1, config={"retention.ms": "3600000"}) for name in topics])))),
        ("describe_configs", lambda: {resource.name: len(future.result(30)) for resource, future in
                                      admin.describe_configs([ConfigResource("topic", name) for name in topics]).items()}),
    ]
    if group_id is not None:
        calls += [
            ("list_consumer_groups", lambda: group_id in {g.group_id for g in
                                                          admin.list_consumer_groups().result(30).valid}),
            ("describe_consumer_groups", lambda: [(g.group_id, str(g.state)) for g in
                                                  each(admin.describe_consumer_groups([group_id])).values()]),
            ("list_consumer_group_offsets", lambda: sorted(
                (tp.topic, tp.partition, tp.offset) for result in each(admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group_id)])).values() for tp in result.topic_partitions)),
        ]
    calls.append(("delete_topics", lambda: sorted(each(admin.delete_topics(topics)))))
    return {name: _outcome(call) for name, call in calls}


def consume_confluent(bootstrap: str, topic: str, count: int, partitions: int = 3,
                      read_committed: bool = True) -> list[Consumed]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(_confluent_base(bootstrap) | {
        "group.id": "kafkasniff-assign-only",  # required by the client even though partitions are assigned
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,  # Tansu holds a fetch of an empty partition for the whole wait
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
        "fetch.max.bytes": LARGE_MESSAGE_LIMIT,
    })
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        consumed: list[Consumed] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(consumed) < count and time.monotonic() < deadline:
            record = consumer.poll(0.2)
            if record is None or record.error():
                continue
            consumed.append(Consumed(record.topic(), record.partition(), record.offset(), record.key(),
                                     record.value(), tuple(record.headers() or ())))
        return _sorted(consumed)
    finally:
        consumer.close()


# --- aiokafka -------------------------------------------------------------

def produce_aiokafka(bootstrap: str, topic: str, messages: Iterable[Message], codec: str = "none",
                     linger_ms: int = 20) -> list[Delivered]:
    from aiokafka import AIOKafkaProducer

    async def run() -> list[Delivered]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=_client_codec(codec),
                                    linger_ms=linger_ms, max_request_size=LARGE_MESSAGE_LIMIT)
        await producer.start()
        try:
            pending = [(message, await producer.send(topic, value=message.value, key=message.key,
                                                     partition=message.partition,
                                                     headers=list(message.headers)))
                       for message in messages]
            await producer.flush()
            delivered = []
            for message, future in pending:
                metadata = await future
                delivered.append(Delivered(topic, metadata.partition, metadata.offset, message))
            return delivered
        finally:
            await producer.stop()

    return asyncio.run(run())


def consume_aiokafka(bootstrap: str, topic: str, count: int) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[Consumed]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_bytes=LARGE_MESSAGE_LIMIT,
                                    max_partition_fetch_bytes=LARGE_MESSAGE_LIMIT)
        await consumer.start()
        try:
            await consumer.topics()  # partitions_for_topic only reads the metadata cache
            partitions = consumer.partitions_for_topic(topic)
            consumer.assign([TopicPartition(topic, p) for p in sorted(partitions or ())])
            await consumer.seek_to_beginning()
            consumed: list[Consumed] = []
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while len(consumed) < count and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    consumed += [Consumed(r.topic, r.partition, r.offset, r.key, r.value,
                                          tuple(r.headers)) for r in records]
            return _sorted(consumed)
        finally:
            await consumer.stop()

    return asyncio.run(run())
