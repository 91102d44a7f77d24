"""Drivers that make real Kafka clients talk to a broker.

Used by tests (through the recording proxy) and by tools/record_captures.py
(under tcpdump). Every driver is synchronous, takes a bootstrap address and
returns plain records of what the client reported, so the caller can write
them into a manifest or compare them with decoded traffic.

Clients covered: kafka-python, confluent-kafka (librdkafka) and aiokafka.
"""

from __future__ import annotations

import asyncio
import ssl
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
                         commit: bool = True, linger_ms: int = 20, tls: ssl.SSLContext | None = None
                         ) -> list[Delivered]:
    """Produce with kafka-python; with `transactional_id`, inside one transaction that commits or aborts."""
    from kafka import KafkaProducer

    options = {**_kafka_python_options(api_version), **_tls_options(tls)}
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
                         read_committed: bool = False, tls: ssl.SSLContext | None = None) -> list[Consumed]:
    """Read `count` messages from the start of every partition of `topic`, without a group."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_bytes=LARGE_MESSAGE_LIMIT,
                             max_partition_fetch_bytes=LARGE_MESSAGE_LIMIT,
                             isolation_level="read_committed" if read_committed else "read_uncommitted",
                             **_kafka_python_options(api_version), **_tls_options(tls))
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


# --- TLS ------------------------------------------------------------------

# OpenSSL's SSL_OP_NO_ENCRYPT_THEN_MAC (Python's ssl module has no name for it): CBC suites then MAC before
# encrypting, the older order.
OP_NO_ENCRYPT_THEN_MAC = 1 << 19


def tls_context(keylog: str, version: str, ciphers: str | None = None, encrypt_then_mac: bool = True) -> ssl.SSLContext:
    """A client context that trusts any certificate, speaks only TLS `version` ("1.2" or "1.3") and writes
    its secrets to the key log `keylog`; `ciphers` (OpenSSL names) picks TLS 1.2 suites."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    pinned = ssl.TLSVersion.TLSv1_2 if version == "1.2" else ssl.TLSVersion.TLSv1_3
    context.minimum_version = context.maximum_version = pinned
    if ciphers:
        context.set_ciphers(ciphers)
    if not encrypt_then_mac:
        context.options |= OP_NO_ENCRYPT_THEN_MAC
    context.keylog_filename = keylog
    return context


def _tls_options(tls: ssl.SSLContext | None) -> dict:
    return {"security_protocol": "SSL", "ssl_context": tls} if tls is not None else {}


# --- aiokafka -------------------------------------------------------------

def produce_aiokafka(bootstrap: str, topic: str, messages: Iterable[Message], codec: str = "none",
                     linger_ms: int = 20, tls: ssl.SSLContext | None = None) -> list[Delivered]:
    from aiokafka import AIOKafkaProducer

    async def run() -> list[Delivered]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=_client_codec(codec),
                                    linger_ms=linger_ms, max_request_size=LARGE_MESSAGE_LIMIT, **_tls_options(tls))
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


def consume_aiokafka(bootstrap: str, topic: str, count: int, tls: ssl.SSLContext | None = None) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[Consumed]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_bytes=LARGE_MESSAGE_LIMIT,
                                    max_partition_fetch_bytes=LARGE_MESSAGE_LIMIT, **_tls_options(tls))
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


# --- consumer groups whose membership changes -------------------------------

GROUP_POLL_S = 0.2
SETTLE_TIMEOUT_S = 60.0
TopicPartitionKey = tuple[str, int]


@dataclass
class MemberReport:
    """What one consumer of a group said about itself: every assignment its rebalance callback was given, in
    order; at the end, the committed offset and the position of each partition it held then; what it read."""

    client_id: str
    assignments: list[list[TopicPartitionKey]]
    committed: dict[TopicPartitionKey, int]
    positions: dict[TopicPartitionKey, int]
    consumed: list[Consumed]


class GroupMember:
    """A consumer of a group in a thread of its own (client libraries are not thread-safe): it subscribes,
    polls, commits what each poll returned before the next, and leaves the group when stopped (close() sends
    LeaveGroup). Subclasses drive one client library."""

    def __init__(self, bootstrap: str, topic: str, group_id: str, client_id: str):
        import threading

        self.bootstrap, self.topic, self.group_id = bootstrap, topic, group_id
        self.report = MemberReport(client_id, [], {}, {}, [])
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name=f"member-{client_id}", daemon=True)

    def start(self) -> GroupMember:
        self._thread.start()
        return self

    def stop(self) -> MemberReport:
        self._stop.set()
        self._thread.join(SETTLE_TIMEOUT_S)
        if self._failure:
            raise self._failure[0]
        return self.report

    @property
    def assignment(self) -> list[TopicPartitionKey] | None:
        """The latest assignment, or None before the first."""
        with self._lock:
            return list(self.report.assignments[-1]) if self.report.assignments else None

    @property
    def consumed(self) -> int:
        with self._lock:
            return len(self.report.consumed)

    def assigned(self, partitions) -> None:
        with self._lock:
            self.report.assignments.append(sorted((tp[0], tp[1]) for tp in partitions))

    def read(self, records: list[Consumed]) -> None:
        with self._lock:
            self.report.consumed += records

    def _run(self) -> None:
        try:
            self.run(self._stop)
        except BaseException as error:  # for stop() to raise in the thread that waits
            self._failure.append(error)

    def run(self, stop) -> None:
        raise NotImplementedError


class KafkaPythonMember(GroupMember):
    def run(self, stop) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer

        member = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                pass

            def on_partitions_assigned(self, assigned):
                member.assigned((tp.topic, tp.partition) for tp in assigned)

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group_id,
                                 client_id=self.report.client_id, enable_auto_commit=False,
                                 auto_offset_reset="earliest", session_timeout_ms=GROUP_SESSION_TIMEOUT_MS,
                                 heartbeat_interval_ms=1000)
        try:
            consumer.subscribe([self.topic], listener=Listener())
            while not stop.is_set():
                polled = consumer.poll(timeout_ms=int(GROUP_POLL_S * 1000))
                records = [Consumed(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers))
                           for batch in polled.values() for r in batch]
                if records:
                    consumer.commit()
                    self.read(records)
            held = sorted(consumer.assignment())
            self.report.committed = {(tp.topic, tp.partition): consumer.committed(tp) for tp in held}
            self.report.positions = {(tp.topic, tp.partition): consumer.position(tp) for tp in held}
        finally:
            consumer.close()


class ConfluentMember(GroupMember):
    def run(self, stop) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(_confluent_base(self.bootstrap) | {
            "group.id": self.group_id, "client.id": self.report.client_id, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 1000, "fetch.wait.max.ms": 100})
        try:
            consumer.subscribe([self.topic], on_assign=lambda _, partitions: self.assigned(
                (tp.topic, tp.partition) for tp in partitions))
            while not stop.is_set():
                records = [Consumed(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                    tuple(m.headers() or ()))
                           for m in consumer.consume(100, GROUP_POLL_S) if not m.error()]
                if records:
                    consumer.commit(asynchronous=False)
                    self.read(records)
            held = consumer.assignment()
            self.report.committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(held, 10)}
            self.report.positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(held)}
        finally:
            consumer.close()


class AiokafkaMember(GroupMember):
    def run(self, stop) -> None:
        asyncio.run(self._run_async(stop))

    async def _run_async(self, stop) -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

        member = self

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                pass

            async def on_partitions_assigned(self, assigned):
                member.assigned((tp.topic, tp.partition) for tp in assigned)

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group_id,
                                    client_id=self.report.client_id, enable_auto_commit=False,
                                    auto_offset_reset="earliest", session_timeout_ms=GROUP_SESSION_TIMEOUT_MS,
                                    heartbeat_interval_ms=1000)
        await consumer.start()
        try:
            consumer.subscribe([self.topic], listener=Listener())
            while not stop.is_set():
                polled = await consumer.getmany(timeout_ms=int(GROUP_POLL_S * 1000))
                records = [Consumed(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers))
                           for batch in polled.values() for r in batch]
                if records:
                    await consumer.commit()
                    self.read(records)
            held = sorted(consumer.assignment())
            self.report.committed = {(tp.topic, tp.partition): await consumer.committed(tp) for tp in held}
            self.report.positions = {(tp.topic, tp.partition): await consumer.position(tp) for tp in held}
        finally:
            await consumer.stop()


GROUP_MEMBERS = {"kafka-python": KafkaPythonMember, "confluent-kafka": ConfluentMember, "aiokafka": AiokafkaMember}


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _settled(members: list[GroupMember], partitions: set[TopicPartitionKey]) -> bool:
    """Every member holds an assignment of its own and together they hold every partition once."""
    held = [member.assignment for member in members]
    if any(not assignment for assignment in held):
        return False
    flat = [tp for assignment in held for tp in assignment]
    return len(flat) == len(set(flat)) and set(flat) == partitions


@dataclass(frozen=True)
class RebalanceSession:
    produced: list[Delivered]
    members: list[MemberReport]  # in the order they joined
    phases: list[dict]           # what each phase did and the assignment the clients settled on


def group_rebalance_session(client: str, bootstrap: str, topic: str, group_id: str, produce,
                            messages_per_phase: list[list[Message]], partitions: int = 3) -> RebalanceSession:
    """A group of `client` consumers whose membership changes: the first joins, a second and a third join,
    then the second leaves. After each change the group settles (every member holds partitions, together all
    of them, once), then `produce` sends that phase's messages and the members read them all, committing as
    they go, so no record is unread or uncommitted when membership changes next. Consumers are named
    `{client}-c1`, `-c2`, `-c3` (their client ids)."""
    make = GROUP_MEMBERS[client]
    all_partitions = {(topic, p) for p in range(partitions)}
    live: list[GroupMember] = []
    everyone: list[GroupMember] = []
    produced: list[Delivered] = []
    phases = []
    steps = [("join", 1), ("join", 2), ("join", 3), ("leave", 2)]
    try:
        for (action, number), messages in zip(steps, messages_per_phase, strict=True):
            client_id = f"{client}-c{number}"
            if action == "join":
                member = make(bootstrap, topic, group_id, client_id).start()
                live.append(member)
                everyone.append(member)
            else:
                leaving = next(m for m in live if m.report.client_id == client_id)
                live.remove(leaving)
                leaving.stop()
            _wait_until(lambda: _settled(live, all_partitions), f"the group to settle after {client_id} {action}s")
            produced += produce(bootstrap, topic, messages)
            _wait_until(lambda: sum(m.consumed for m in everyone) == len(produced),
                        f"every record of phase {len(phases) + 1} to be read")
            phases.append({"action": action, "member": client_id,
                           "assignment": {m.report.client_id: m.assignment for m in live}})
    finally:
        for member in live:
            member.stop()
    return RebalanceSession(produced, [m.report for m in everyone], phases)


# --- a consumer falling behind a producer -----------------------------------

@dataclass
class LagSession:
    produced: list[Delivered]
    slow: MemberReport
    slow_polls: list[dict[TopicPartitionKey, tuple[int, int | None]]]  # after each poll: (position, highwater)
    end_offsets: dict[TopicPartitionKey, int]  # the slow consumer's end_offsets() once everything was read
    fast: MemberReport


def lag_session(bootstrap: str, topic: str, slow_group: str, fast_group: str, rounds: list[list[Message]],
                round_gap_s: float = 0.2, slow_poll_gap_s: float = 0.25) -> LagSession:
    """A kafka-python producer sends `rounds` of messages `round_gap_s` apart (one flush, so one batch per
    partition, per round) once two groups reading the topic hold its partitions. `slow_group`'s kafka-python
    consumer returns at most 5 records per poll and waits `slow_poll_gap_s` between polls, and fetches a
    partition again only once it has returned what it fetched of it: it falls behind. `fast_group`'s
    confluent-kafka consumer keeps up. Both commit after each poll and read to the end; then the slow one
    asks for the end offsets (ListOffsets)."""
    import threading

    from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer

    fast = ConfluentMember(bootstrap, topic, fast_group, "lag-fast").start()
    slow_report = MemberReport("lag-slow", [], {}, {}, [])
    polls: list[dict] = []
    ends: dict = {}
    everything_sent = threading.Event()
    produced: list[Delivered] = []
    failure: list[BaseException] = []

    slow_assigned = threading.Event()

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            slow_report.assignments.append(sorted((tp.topic, tp.partition) for tp in assigned))
            slow_assigned.set()

    def read_slowly() -> None:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=slow_group, client_id="lag-slow",
                                 enable_auto_commit=False, auto_offset_reset="earliest",
                                 session_timeout_ms=GROUP_SESSION_TIMEOUT_MS, heartbeat_interval_ms=1000,
                                 max_poll_records=5)
        try:
            consumer.subscribe([topic], listener=Listener())
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while time.monotonic() < deadline and not (
                    everything_sent.is_set() and len(slow_report.consumed) == len(produced)):
                polled = consumer.poll(timeout_ms=int(GROUP_POLL_S * 1000))
                records = [Consumed(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers))
                           for batch in polled.values() for r in batch]
                if records:
                    consumer.commit()
                    slow_report.consumed.extend(records)
                    held = sorted(consumer.assignment())
                    polls.append({(tp.topic, tp.partition): (consumer.position(tp), consumer.highwater(tp))
                                  for tp in held})
                    time.sleep(slow_poll_gap_s)
            held = sorted(consumer.assignment())
            slow_report.committed = {(tp.topic, tp.partition): consumer.committed(tp) for tp in held}
            slow_report.positions = {(tp.topic, tp.partition): consumer.position(tp) for tp in held}
            ends.update({(tp.topic, tp.partition): offset for tp, offset in consumer.end_offsets(held).items()})
        except BaseException as error:
            failure.append(error)
        finally:
            consumer.close()

    slow = threading.Thread(target=read_slowly, name="lag-slow", daemon=True)
    slow.start()
    _wait_until(lambda: slow_assigned.is_set() and fast.assignment, "both consumers to be assigned partitions")
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="lag-producer", linger_ms=round_gap_s * 1000)
    try:
        for messages in rounds:
            futures = [(m, producer.send(topic, value=m.value, key=m.key, headers=list(m.headers),
                                         partition=m.partition)) for m in messages]
            producer.flush()
            for message, future in futures:
                metadata = future.get(timeout=10)
                produced.append(Delivered(topic, metadata.partition, metadata.offset, message))
            time.sleep(round_gap_s)
    finally:
        producer.close()
        everything_sent.set()
    slow.join(SETTLE_TIMEOUT_S + 10)
    _wait_until(lambda: fast.consumed == len(produced), "the fast consumer to read everything")
    fast_report = fast.stop()
    if failure:
        raise failure[0]
    return LagSession(produced, slow_report, polls, ends, fast_report)
