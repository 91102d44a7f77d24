# cython: language_level=3
"""Consumer lag from the wire, per (group or client id, topic, partition).

- Fetch position: each consumer Fetch request says from which offset it reads each partition; its response
  gives the partition's high watermark and last stable offset. The lag of that fetch is the end (the last
  stable offset for a read_committed consumer, else the high watermark) minus the fetch offset: records that
  were in the log and not yet fetched. Followers' fetches (replica id >= 0) are replication, not consumers.
  In an incremental fetch session a response may name a partition its request left out: it is read from
  the offset last asked on that connection.
- Traffic per partition: the records and bytes Produce requests wrote (those their responses acknowledged, at
  the offsets they give) and consumers' Fetch responses brought, the last high watermark, and the rate records
  were produced at.
- Committed offsets: OffsetCommit requests whose response has no error for the partition (and the offsets
  OffsetFetch responses read back), against the log end: the highest end offset seen for the partition in
  Fetch responses (high watermark), Produce responses (base offset plus the records of the request's batches)
  and ListOffsets answers for the latest offset.

A fetch counts towards the group whose latest generation gives the partition (or failing that, any) to a
member with the fetch's client id on the fetch's host (groups.Owners.owner); otherwise towards its
client id. Records are never decoded: everything comes from partition fields and batch headers
(messages.partition_facts, packed: read here without an object per partition, protocol/packed.pxd). The same
Produce and Fetch facts give the produce-to-fetch latency (latency.EndToEnd).
"""

from __future__ import annotations

from kafkasniff.analyses.groups cimport Owners
from kafkasniff.analyses.groups import GroupTracker
from kafkasniff.analyses.latency import EndToEnd
from kafkasniff.analyses.wire import (FACTS_READ, FETCH, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE, Seen,
                                      topic_of)
from kafkasniff.protocol.packed cimport (Packed, Part, batch_word, batches, fact, first_part, has, next_part,
                                         packed_of, value)
from kafkasniff.protocol.topicname cimport topic_name
from kafkasniff.protocol.topics import TopicNames

LATEST_OFFSET = -1  # the ListOffsets timestamp that asks for the end of the log
READ_COMMITTED = 1
# Connections whose fetch positions are remembered for incremental fetch sessions; the oldest go first.
MAX_SESSION_CONNECTIONS = 10_000
# The slots of the partition facts read here (wire.FACTS_READ's order).
cdef Py_ssize_t SLOTS = len(FACTS_READ)
cdef Py_ssize_t FETCH_OFFSET = FACTS_READ.index("fetch_offset")
cdef Py_ssize_t ERROR_CODE = FACTS_READ.index("error_code")
cdef Py_ssize_t HIGH_WATERMARK = FACTS_READ.index("high_watermark")
cdef Py_ssize_t LAST_STABLE_OFFSET = FACTS_READ.index("last_stable_offset")
cdef Py_ssize_t RECORDS_BYTES = FACTS_READ.index("records_bytes")
cdef Py_ssize_t BASE_OFFSET = FACTS_READ.index("base_offset")
cdef Py_ssize_t TIMESTAMP = FACTS_READ.index("timestamp")
cdef Py_ssize_t OFFSET = FACTS_READ.index("offset")
# A record batch's words (walker.BATCH_FACTS' order).
cdef enum:
    RECORD_COUNT = 2
    IS_CONTROL = 3


cdef inline object part_topic(tuple topics, const Part *part, dict by_id):
    """A packed partition's topic name: its (topic, topic id) pair in the message's topics, the id resolved."""
    topic, topic_id = topics[part.topic]
    return topic_name(topic, topic_id, by_id)


cdef class Position:
    """One consumer's fetching of one partition."""

    cdef public object group, client_id, topic, partition
    cdef public long long fetches
    cdef public list samples  # None: not kept
    cdef public tuple last     # (ts, fetch offset, high watermark, last stable offset, lag), None before a fetch
    cdef public tuple max_lag  # the sample with the largest lag

    def __init__(self, group: str | None, client: str | None, topic: str, partition: int, samples: bool):
        self.group, self.client_id, self.topic, self.partition = group, client, topic, partition
        self.fetches = 0
        self.samples = [] if samples else None
        self.last = self.max_lag = None

    cdef void add(self, tuple sample) except *:
        self.fetches += 1
        self.last = sample
        if self.max_lag is None or sample[4] > self.max_lag[4]:
            self.max_lag = sample
        if self.samples is not None:
            self.samples.append(sample)

    @property
    def consumer(self) -> str:
        return self.group if self.group is not None else self.client_id or "(no client id)"

    def to_json(self) -> dict:
        out = {"group": self.group, "client_id": self.client_id, "topic": self.topic, "partition": self.partition,
               "fetches": self.fetches, "last": _sample_json(self.last), "max_lag": _sample_json(self.max_lag)}
        if self.samples is not None:
            out["samples"] = [list(sample) for sample in self.samples]
        return out


SAMPLE_FIELDS = ("ts", "fetch_offset", "high_watermark", "last_stable_offset", "lag")


def _sample_json(sample: tuple | None) -> dict | None:
    return dict(zip(SAMPLE_FIELDS, sample)) if sample is not None else None


cdef class Traffic:
    """One partition's Produce and Fetch traffic."""

    # Counters of 32-bit wire fields (records_bytes, batch record counts): a 64-bit sum of them cannot overflow.
    cdef public long long produced_records, produced_bytes, fetch_responses, fetched_records, fetched_bytes
    cdef public object first_produced_offset, last_produced_offset, first_produced_at, last_produced_at
    cdef public object high_watermark, last_stable_offset, high_watermark_at

    def __init__(self) -> None:
        self.produced_records = self.produced_bytes = self.fetch_responses = 0
        self.fetched_records = self.fetched_bytes = 0
        self.first_produced_offset = self.last_produced_offset = None
        self.first_produced_at = self.last_produced_at = None
        self.high_watermark = self.last_stable_offset = self.high_watermark_at = None

    cdef void produced(self, first, last, long long records, long long size, ts) except *:
        """Records at offsets first..last, `size` bytes of batches, sent at `ts`."""
        self.produced_records += records
        self.produced_bytes += size
        if self.first_produced_offset is None or first < self.first_produced_offset:
            self.first_produced_offset = first
        if self.last_produced_offset is None or last > self.last_produced_offset:
            self.last_produced_offset = last
        if self.first_produced_at is None or ts < self.first_produced_at:
            self.first_produced_at = ts
        if self.last_produced_at is None or ts > self.last_produced_at:
            self.last_produced_at = ts

    def records_per_minute(self) -> float | None:
        """Records produced per minute from the first Produce request to the last; None before there are two."""
        if self.first_produced_at is None or self.last_produced_at == self.first_produced_at:
            return None
        return round(self.produced_records * 60 / (self.last_produced_at - self.first_produced_at), 3)


PARTITION_FIELDS = ("topic", "partition", "produced_records", "produced_bytes", "first_produced_offset",
                    "last_produced_offset", "first_produced_at", "last_produced_at", "records_per_minute",
                    "fetch_responses", "fetched_records", "fetched_bytes", "high_watermark", "last_stable_offset",
                    "high_watermark_at", "log_end_offset", "log_end_at")


class Commit:
    __slots__ = ("group", "topic", "partition", "offset", "ts", "commits", "source", "end_at_commit")

    def __init__(self, group: str, topic: str, partition: int):
        self.group, self.topic, self.partition = group, topic, partition
        self.offset = self.ts = self.end_at_commit = None
        self.commits = 0
        self.source = None


cdef class LagTracker:
    """Feed it every MessageEvent in capture order (`observe`), after the GroupTracker it asks about groups."""

    cdef public object groups, topic_names, latency
    cdef public bint samples
    cdef public dict positions  # (group, client id outside groups, topic, partition) -> Position
    cdef public dict commits    # (group, topic, partition) -> Commit
    cdef public dict ends       # (topic, partition) -> (end offset, when)
    cdef public dict traffic    # (topic, partition) -> Traffic
    cdef dict _sessions         # connection -> partition -> fetch offset

    def __init__(self, groups: GroupTracker, topic_names: TopicNames, samples: bool = True):
        self.groups = groups
        self.topic_names = topic_names
        self.samples = samples
        self.latency = EndToEnd()
        self.positions = {}
        self.commits = {}
        self.ends = {}
        self.traffic = {}
        self._sessions = {}

    def observe(self, s: Seen) -> None:
        if s.kind != "response" or s.request is None or s.malformed:
            return
        api_key = s.api_key
        if api_key == FETCH:
            self._fetch(s)
        elif api_key == PRODUCE:
            self._produce(s)
        elif api_key == LIST_OFFSETS:
            self._list_offsets(s)
        elif api_key == OFFSET_COMMIT:
            self._offset_commit(s)
        elif api_key == OFFSET_FETCH:
            self._offset_fetch(s)

    cdef void end_offset(self, topic, partition, offset, ts) except *:
        known = self.ends.get((topic, partition))
        if known is None or offset > known[0]:
            self.ends[topic, partition] = (offset, ts)

    cdef Traffic _traffic(self, topic, partition):
        found = self.traffic.get((topic, partition))
        if found is None:
            found = self.traffic[topic, partition] = Traffic()
        return found

    cdef void _fetch(self, s) except *:
        # Once per Fetch response (most of a consumer's traffic, in --top and --metrics-port too): compiled, the
        # partitions read packed (no object per partition), names looked up inline.
        cdef dict by_id = self.topic_names.by_id
        cdef dict session, traffics, positions
        cdef Traffic traffic
        cdef Position position
        cdef Owners owners = None
        cdef long long replica, fetched
        cdef Py_ssize_t i
        cdef bint read_committed
        cdef Part part
        cdef tuple topics
        asked = s.request
        request_root = asked.root
        replica = max(request_root.get("replica_id", -1), request_root.get("replica_state.replica_id", -1))
        session = self._session(s.connection, request_root)
        topics, data = asked.partitions
        cdef Packed packed = packed_of(data, SLOTS)
        part = first_part()
        while next_part(&packed, &part):
            session[part_topic(topics, &part, by_id), part.partition] = fact(&packed, &part, FETCH_OFFSET, None)
        read_committed = request_root.get("isolation_level") == READ_COMMITTED
        client = s.client_id
        host_ip = s.client[0]
        ts = s.ts
        traffics, positions = self.traffic, self.positions
        topics, data = s.partitions
        packed = packed_of(data, SLOTS)
        part = first_part()
        while next_part(&packed, &part):
            if value(&packed, &part, ERROR_CODE):
                continue
            topic = part_topic(topics, &part, by_id)
            partition = part.partition
            key = (topic, partition)
            high_watermark = fact(&packed, &part, HIGH_WATERMARK, -1)
            if high_watermark >= 0:
                self.end_offset(topic, partition, high_watermark, ts)
            last_stable = fact(&packed, &part, LAST_STABLE_OFFSET, -1)
            if replica < 0:
                traffic = traffics.get(key)
                if traffic is None:
                    traffic = self._traffic(topic, partition)
                traffic.fetch_responses += 1
                traffic.fetched_bytes += value(&packed, &part, RECORDS_BYTES)
                fetched = 0
                for i in range(part.batch_count):
                    if not batch_word(&packed, &part, i, IS_CONTROL):  # (control records: transaction markers)
                        fetched += batch_word(&packed, &part, i, RECORD_COUNT)
                traffic.fetched_records += fetched
                if high_watermark >= 0:
                    traffic.high_watermark, traffic.last_stable_offset = high_watermark, last_stable
                    traffic.high_watermark_at = ts
            fetch_offset = session.get(key)
            if replica >= 0 or fetch_offset is None or high_watermark < 0:
                continue
            end = last_stable if read_committed and last_stable >= 0 else high_watermark
            if owners is None:  # (asked once a response: nothing between its partitions changes the groups)
                owners = self.groups.owners()
            group = owners.owner(topic, partition, client, host_ip)
            position_key = (group, None if group is not None else client, topic, partition)
            position = positions.get(position_key)
            if position is None:
                position = positions[position_key] = Position(group, client, topic, partition, self.samples)
            position.client_id = client
            position.add((ts, fetch_offset, high_watermark, last_stable, max(end - fetch_offset, 0)))
            if part.batch_count:
                self.latency.fetch(position.consumer, topic, partition, batches(&packed, &part), ts)

    cdef dict _session(self, connection, dict request_root):
        """The fetch offsets a connection last asked, per partition; a fetch that is not incremental (session
        epoch 0 or -1, or a version without sessions) asks afresh."""
        incremental = request_root.get("session_epoch", 0) > 0
        session = self._sessions.pop(connection, None) if incremental else None
        if session is None:
            self._sessions.pop(connection, None)
            session = {}
        self._sessions[connection] = session  # the most recently used last
        if len(self._sessions) > MAX_SESSION_CONNECTIONS:
            del self._sessions[next(iter(self._sessions))]
        return session

    cdef void _produce(self, s) except *:
        # Once per Produce response: compiled over the packed partitions, as _fetch is.
        cdef dict by_id = self.topic_names.by_id
        cdef dict sent = {}  # (topic, partition) -> (records bytes, batches) of the request's partitions with batches
        cdef Part part
        cdef tuple topics
        asked = s.request
        topics, data = asked.partitions
        cdef Packed packed = packed_of(data, SLOTS)
        part = first_part()
        while next_part(&packed, &part):
            if part.batch_count:
                sent[part_topic(topics, &part, by_id), part.partition] = (value(&packed, &part, RECORDS_BYTES),
                                                                          batches(&packed, &part))
        topics, data = s.partitions
        packed = packed_of(data, SLOTS)
        part = first_part()
        while next_part(&packed, &part):
            topic = part_topic(topics, &part, by_id)
            partition = part.partition
            base_offset = fact(&packed, &part, BASE_OFFSET, -1)
            request_partition = sent.get((topic, partition))
            if value(&packed, &part, ERROR_CODE) or base_offset < 0 or request_partition is None:
                continue
            sent_bytes, sent_batches = request_partition
            offsets = records = 0
            for batch in sent_batches:
                offsets += batch[1] + 1
                records += batch[2]
            self.end_offset(topic, partition, base_offset + offsets, s.ts)
            self.latency.produce(topic, partition, base_offset, sent_batches, asked.ts)
            self._traffic(topic, partition).produced(base_offset, base_offset + offsets - 1, records, sent_bytes,
                                                     asked.ts)

    cdef void _list_offsets(self, s) except *:
        cdef dict by_id = self.topic_names.by_id
        cdef set latest = set()  # (topic, partition) asked for its latest offset
        cdef Part part
        cdef tuple topics
        topics, data = s.request.partitions
        cdef Packed packed = packed_of(data, SLOTS)
        part = first_part()
        while next_part(&packed, &part):
            if has(&packed, &part, TIMESTAMP) and value(&packed, &part, TIMESTAMP) == LATEST_OFFSET:
                latest.add((part_topic(topics, &part, by_id), part.partition))
        topics, data = s.partitions
        packed = packed_of(data, SLOTS)
        part = first_part()
        while next_part(&packed, &part):
            offset = fact(&packed, &part, OFFSET, -1)
            if value(&packed, &part, ERROR_CODE) or offset < 0:
                continue
            key = (part_topic(topics, &part, by_id), part.partition)
            if key in latest:
                self.end_offset(key[0], key[1], offset, s.ts)

    cdef void _offset_commit(self, s) except *:
        request, response = s.request.body, s.body
        if request is None or response is None or not request.get("group_id"):
            return
        asked = {(topic_of(t, self.topic_names), p["partition_index"]): p["committed_offset"]
                 for t in request.get("topics") or () for p in t.get("partitions") or ()}
        for t in response.get("topics") or ():
            topic = topic_of(t, self.topic_names)
            for p in t.get("partitions") or ():
                offset = asked.get((topic, p["partition_index"]))
                if not p.get("error_code") and offset is not None and offset >= 0:
                    self._committed(request["group_id"], topic, p["partition_index"], offset, s.ts, "OffsetCommit")

    cdef void _offset_fetch(self, s) except *:
        request, response = s.request.body, s.body
        if request is None or response is None:
            return
        groups = response.get("groups")
        if groups is None:  # before v8: one group, named by the request
            groups = [{"group_id": request.get("group_id"), "topics": response.get("topics") or ()}]
        for group in groups:
            if not group.get("group_id") or group.get("error_code"):
                continue
            for t in group.get("topics") or ():
                topic = topic_of(t, self.topic_names)
                for p in t.get("partitions") or ():
                    offset = p.get("committed_offset", -1)
                    if not p.get("error_code") and offset >= 0:
                        self._committed(group["group_id"], topic, p["partition_index"], offset, s.ts, "OffsetFetch")

    cdef void _committed(self, group, topic, partition, offset, ts, str source) except *:
        commit = self.commits.get((group, topic, partition))
        if commit is None:
            commit = self.commits[group, topic, partition] = Commit(group, topic, partition)
        commit.offset, commit.ts, commit.source = offset, ts, source
        commit.commits += source == "OffsetCommit"
        end = self.ends.get((topic, partition))
        commit.end_at_commit = end[0] if end is not None else None

    # --- results -----------------------------------------------------------------------------------

    def consumer_rows(self) -> list[Position]:
        return sorted(self.positions.values(), key=lambda p: (p.consumer, p.topic, p.partition))

    def delivered_to(self, position: Position) -> int | None:
        """The offset after the last record the consumer's fetches brought it (its position once it has read
        them), from the record batches of its Fetch responses; None when they carried none."""
        return self.latency.delivered.get((position.consumer, position.topic, position.partition))

    def commit_json(self, commit: Commit) -> dict:
        end = self.ends.get((commit.topic, commit.partition))
        return {"group": commit.group, "topic": commit.topic, "partition": commit.partition,
                "committed_offset": commit.offset, "committed_at": commit.ts, "commits": commit.commits,
                "source": commit.source, "log_end_at_commit": commit.end_at_commit,
                "lag_at_commit": None if commit.end_at_commit is None else commit.end_at_commit - commit.offset,
                "log_end_offset": end[0] if end is not None else None,
                "lag": None if end is None else max(end[0] - commit.offset, 0)}

    def partitions_json(self) -> list[dict]:
        """Per topic and partition (every one the capture shows produced, fetched, ended or committed): its
        traffic and log end (PARTITION_FIELDS)."""
        keys = set(self.traffic) | set(self.ends) | {(p.topic, p.partition) for p in self.positions.values()} \
            | {(topic, partition) for _, topic, partition in self.commits}
        empty = Traffic()
        out = []
        for topic, partition in sorted(keys, key=lambda key: (key[0] or "", key[1])):
            t = self.traffic.get((topic, partition), empty)
            end = self.ends.get((topic, partition))
            out.append(dict(zip(PARTITION_FIELDS, (
                topic, partition, t.produced_records, t.produced_bytes, t.first_produced_offset,
                t.last_produced_offset, t.first_produced_at, t.last_produced_at, t.records_per_minute(),
                t.fetch_responses, t.fetched_records, t.fetched_bytes, t.high_watermark, t.last_stable_offset,
                t.high_watermark_at, end[0] if end is not None else None, end[1] if end is not None else None))))
        return out

    def to_json(self) -> dict:
        return {"consumers": [p.to_json() | {"delivered_to": self.delivered_to(p)} for p in self.consumer_rows()],
                "committed": [self.commit_json(c) for _, c in sorted(self.commits.items())],
                "log_end": [{"topic": topic, "partition": partition, "offset": offset, "ts": ts}
                            for (topic, partition), (offset, ts) in sorted(self.ends.items(), key=_by_name)]}


def _by_name(item) -> tuple:
    (topic, partition), _ = item
    return topic or "", partition
