"""The partitions builder (partitions.c), which the analyses read lag and end-to-end latency from, against the
Field tree of the same bytes: on every frame of every capture, whole, cut short and with bytes overwritten, on
legacy message sets, and on random bytes at every API version. Mutations use a fixed seed, so a failure repeats.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kafkasniff.protocol.fields import TAGGED_FIELDS
from kafkasniff.protocol import _walk, messages
from kafkasniff.protocol.messages import all_versions, decode_request, decode_response_for_request
from kafkasniff.protocol.program import snake_case
from kafkasniff.protocol.records import records_of
from tests.test_walker import FRAMES, _cuts, _legacy_produce

FIXED_WIDTH = {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64"}
NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"
MUTATIONS_PER_FRAME = 12
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def unpack_partitions(topics: tuple, packed: bytes, wanted: tuple[str, ...]) -> list[tuple]:
    """partition_facts' packed partitions read in Python, as partitions.c's comment says, apart from packed.pxd:
    (topic, topic id, partition, facts, batches) tuples, facts a dict of those found, batches a list of
    walker.BATCH_FACTS tuples (is_control a bool) or None."""
    words = memoryview(packed).cast("q")
    masks = (len(wanted) + 63) // 64
    out, at = [], 0
    while at < len(words):
        topic, partition = words[at], words[at + 1]
        at += _walk.PACKED_HEAD_WORDS
        mask = words[at:at + masks]
        facts = {name: words[at + masks + slot] for slot, name in enumerate(wanted)
                 if mask[slot // 64] >> (slot % 64) & 1}
        at += masks + len(wanted)
        count = words[at]
        at += 1
        batches = [(words[b], words[b + 1], words[b + 2], bool(words[b + 3]), words[b + 4])
                   for b in range(at, at + count * _walk.PACKED_BATCH_WORDS, _walk.PACKED_BATCH_WORDS)]
        at += count * _walk.PACKED_BATCH_WORDS
        out.append((*topics[topic], partition, facts, batches or None))
    return out


def partition_facts(msg, data: bytes, wanted: tuple) -> tuple[dict, list[tuple]]:
    """messages.partition_facts with its packed partitions unpacked."""
    root, topics, packed = messages.partition_facts(msg, data, wanted)
    assert len(packed) % 8 == 0
    return root, unpack_partitions(topics, packed, wanted)


def _batch(item) -> tuple | None:
    if item.type == "RecordBatch":
        return (item["base_offset"].value, item["last_offset_delta"].value, item["record_count"].value,
                item.value["is_control"], item["max_timestamp"].value)
    if item.type == "Message":
        v = item.value  # (a spread wider than an int64, on hostile bytes, is held at its range)
        return (v["base_offset"], min(max(v["offset"] - v["base_offset"], INT64_MIN), INT64_MAX),
                len(records_of(item)), False, -1 if v["timestamp"] is None else v["timestamp"])
    return None


class Oracle:
    """partition_facts' result made from a Field tree by the rules of partitions.c, with every fact; and the names
    of every fact the walk could make of the tree (`names`: those of array items that are not partitions too),
    to ask it for all of them."""

    def __init__(self) -> None:
        self.root: dict = {}
        self.partitions: list[tuple] = []
        self.names: set[str] = set()

    def of(self, body) -> tuple[dict, list]:
        self.close(body, None, None, "", None)
        return self.root, self.partitions

    def close(self, f, topic, topic_id, prefix: str, owner: list | None) -> None:
        """Reads struct `f` (a nested one's facts go to its `owner` [facts, batches]; None: the root or an
        array item), then does what its end does."""
        facts, batches, partition = {}, [], None
        members = []
        for c in f.children or ():  # known tagged fields are read in line with the others
            members += [t for t in c.children or () if t.type != "bytes"] if c.name == TAGGED_FIELDS else [c]
        for c in members:
            if c.type == "uuid":
                if c.role == "topicId" and c.value != NO_TOPIC_ID:
                    topic_id = c.value
            elif c.role == "partition" and c.type == "int32":
                partition = c.value
            elif c.type in FIXED_WIDTH:
                facts[prefix + snake_case(c.name)] = int(c.value)  # (bools are 1 and 0)
                self.names.add(prefix + snake_case(c.name))
            elif c.type == "string":
                if c.role == "topicName" and c.value is not None:
                    topic = c.value
            elif c.children is None or c.type == "bytes":
                continue
            elif c.type == "records":
                self.names.add(prefix + snake_case(c.name) + "_bytes")
                batches += [b for b in map(_batch, c.children) if b is not None]
                if c.children:  # the record set's bytes: from where its first item starts to its end
                    facts[prefix + snake_case(c.name) + "_bytes"] = c.end - c.children[0].offset
            elif c.type.startswith("[]"):
                for item in c.children:
                    if item.children is not None and item.type not in FIXED_WIDTH:
                        self.close(item, topic, topic_id, "", None)
            else:
                self.close(c, topic, topic_id, f"{prefix}{snake_case(c.name)}.", [facts, batches])
        if partition is not None:
            self.partitions.append((topic, topic_id, partition, facts, batches or None))
        elif f.name == "body":
            self.root = facts
        elif owner is not None:
            owner[0].update(facts)
            owner[1] += batches


def _decode(data: bytes, request):
    if request is None:
        return decode_request(data)
    return decode_response_for_request(data, *request)


# Facts asked for by name: root and partition facts, a nested struct's path, a records size, a name no schema has.
WANTED = ("replica_id", "replica_state.replica_id", "isolation_level", "fetch_offset", "error_code",
          "high_watermark", "records_bytes", "base_offset", "offset", "current_leader.leader_id", "no_such_fact")


def _only(facts: dict, wanted: tuple) -> dict:
    return {name: value for name, value in facts.items() if name in wanted}


def assert_facts_match_the_field_tree(data: bytes, request) -> None:
    """Every fact the tree has (asked for by all the names it could have, in an order of their own), and only
    those WANTED (the walk is the same; facts not asked for are never made)."""
    msg = _decode(data, request)
    got_wanted = partition_facts(msg, data, WANTED)
    if msg.body is None:
        assert partition_facts(msg, data, ("error_code",)) == got_wanted == ({}, [])
        return
    oracle = Oracle()
    root, partitions = oracle.of(msg.body)
    every = tuple(sorted(oracle.names, key=lambda name: (len(name), name)))
    assert partition_facts(msg, data, every) == (root, partitions)
    assert got_wanted == (_only(root, WANTED), [(topic, topic_id, partition, _only(facts, WANTED), batches)
                                                for topic, topic_id, partition, facts, batches in partitions])


@pytest.mark.parametrize("index", range(len(FRAMES)))
def test_every_real_frame_whole_cut_and_mutated(index):
    payload, request = FRAMES[index]
    assert_facts_match_the_field_tree(payload, request)
    for cut in _cuts(len(payload)):
        assert_facts_match_the_field_tree(payload[:cut], request)
    rng = random.Random(index)
    for _ in range(MUTATIONS_PER_FRAME):
        data = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        assert_facts_match_the_field_tree(bytes(data), request)


_LAYOUTS = [(kind, key, version) for kind in ("request", "response") for key, version in all_versions(kind)]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_LAYOUTS), st.binary(max_size=200))
def test_random_bytes_at_every_layout(layout, body):
    kind, key, version = layout
    if kind == "request":
        assert_facts_match_the_field_tree(key.to_bytes(2, "big") + version.to_bytes(2, "big") + body, None)
    else:
        assert_facts_match_the_field_tree(body, (key, version))


@pytest.mark.parametrize("magic, codec", [(0, "none"), (1, "none"), (0, "gzip"), (1, "gzip"), (1, "snappy")])
def test_legacy_message_sets(magic, codec):
    payload = _legacy_produce(magic, codec)
    assert_facts_match_the_field_tree(payload, None)
    root, partitions = partition_facts(decode_request(payload), payload, ("acks", "timeout_ms", "records_bytes"))
    assert root == {"acks": 1, "timeout_ms": 1000}
    timestamp = 1_700_000_000_000 if magic == 1 else -1
    if codec == "none":  # each message its own item
        expected = [(40, 0, 1, False, timestamp), (41, 0, 1, False, timestamp)]
    else:  # one wrapper: its first and last inner offsets, two messages
        expected = [(40, 1, 2, False, timestamp)]
    # the record set is the end of the request, after its 4-byte size: that size is the partition's records_bytes
    ((topic, topic_id, partition, facts, batches),) = partitions
    size = facts["records_bytes"]
    assert (topic, topic_id, partition, facts, batches) == ("old", None, 3, {"records_bytes": size}, expected)
    assert payload[-size - 4:-size] == size.to_bytes(4, "big") and size >= 65


FETCH_FACTS = ("throttle_time_ms", "error_code", "session_id", "high_watermark", "last_stable_offset",
               "log_start_offset", "preferred_read_replica", "records_bytes")


def test_a_real_fetch_response_in_plain_numbers():
    """The consumer_group capture's first Fetch response (kafka-python, v12): what the lag analysis reads."""
    payload, request = next((p, r) for p, r in FRAMES if r == (1, 12) and len(p) == 1120)
    root, partitions = partition_facts(_decode(payload, request), payload, FETCH_FACTS)
    assert root == {"throttle_time_ms": 0, "error_code": 0, "session_id": 0}
    assert sorted(partitions) == [
        ("group-topic", None, p, {"error_code": 0, "high_watermark": 2, "last_stable_offset": 2,
                                  "log_start_offset": 0, "preferred_read_replica": -1, "records_bytes": size},
         [(0, 1, 2, False, 1795421628057)]) for p, size in ((0, 633), (1, 145), (2, 197))]


def test_the_packed_layout_word_for_word():
    """What packed.pxd reads, as partitions.c's comment says: per partition its topic's index and its index, the
    mask of the facts found, a value per wanted fact (0 when not found), then the batches' count and words."""
    payload, request = next((p, r) for p, r in FRAMES if r == (1, 12) and len(p) == 1120)
    msg = _decode(payload, request)
    root, topics, packed = messages.partition_facts(msg, payload, ("records_bytes", "no_such_fact", "high_watermark"))
    assert (root, topics) == ({}, (("group-topic", None),))
    words = list(memoryview(packed).cast("q"))
    one_batch = [1, 0, 1, 2, 0, 1795421628057]  # count; base offset, last offset delta, records, control, max ts
    assert sorted(words[i:i + 12] for i in range(0, len(words), 12)) == [
        [0, p, 0b101, size, 0, 2, *one_batch] for p, size in ((0, 633), (1, 145), (2, 197))]


def test_wanted_facts_are_slots_in_the_order_asked_and_a_wrong_kind_of_names():
    payload, request = next((p, r) for p, r in FRAMES if r == (1, 12) and len(p) == 1120)
    msg = _decode(payload, request)
    root, partitions = partition_facts(msg, payload, ("high_watermark", "records_bytes", "session_id"))
    assert root == {"session_id": 0}
    assert sorted(partitions) == [("group-topic", None, p, {"high_watermark": 2, "records_bytes": size},
                                   [(0, 1, 2, False, 1795421628057)]) for p, size in ((0, 633), (1, 145), (2, 197))]
    assert partition_facts(msg, payload, ()) == ({}, [(t, i, p, {}, b) for t, i, p, _, b in partitions])
    # The program remembers each name's slot in a tuple (asked anew for another): another order, the same facts;
    # past 64 slots, a second mask word.
    assert partition_facts(msg, payload, ("session_id", "records_bytes", "high_watermark")) == (root, partitions)
    decoys = tuple(f"decoy_{i}" for i in range(70))
    assert partition_facts(msg, payload, decoys + ("session_id", "records_bytes", "high_watermark")) == \
        (root, partitions)
    assert partition_facts(msg, payload, (*decoys[:60], "records_bytes", *decoys[60:], "high_watermark")) == \
        ({}, [(t, i, p, {"high_watermark": 2, "records_bytes": facts["records_bytes"]}, b)
              for t, i, p, facts, b in partitions])
    with pytest.raises(TypeError, match="expected tuple"):
        messages.partition_facts(msg, payload, ["records_bytes"])
    with pytest.raises(TypeError, match="wanted must be a tuple of names"):
        messages.partition_facts(msg, payload, ("records_bytes", 3))


TOPIC_ID = "01a20777-d575-7993-9479-7a4c78371a47"


def test_nested_structs_and_tagged_fields_are_facts_by_path_and_array_items_are_not():
    from kafkasniff.protocol.encoder import encode_request, encode_response

    # A follower's Fetch v15 says who it is in a tagged struct; consumers leave it out.
    request = encode_request(1, 15, 7, "c", {
        "ReplicaState": {"ReplicaId": 2, "ReplicaEpoch": 5}, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 100,
        "IsolationLevel": 1, "SessionEpoch": -1,
        "Topics": [{"TopicId": TOPIC_ID,
                    "Partitions": [{"Partition": 4, "FetchOffset": 10, "PartitionMaxBytes": 99}]}]},
        size_prefix=False)
    assert_facts_match_the_field_tree(request, None)
    asked = ("max_wait_ms", "min_bytes", "max_bytes", "isolation_level", "session_id", "session_epoch",
             "replica_state.replica_id", "replica_state.replica_epoch", "current_leader_epoch", "fetch_offset",
             "last_fetched_epoch", "log_start_offset", "partition_max_bytes")
    assert partition_facts(decode_request(request), request, asked) == (
        {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 100, "isolation_level": 1, "session_id": 0,
         "session_epoch": -1, "replica_state.replica_id": 2, "replica_state.replica_epoch": 5},
        [(None, TOPIC_ID, 4, {"current_leader_epoch": -1, "fetch_offset": 10, "last_fetched_epoch": -1,
                              "log_start_offset": -1, "partition_max_bytes": 99}, None)])
    response = encode_response(1, 16, 7, {"Responses": [{"TopicId": TOPIC_ID, "Partitions": [{
        "PartitionIndex": 4, "HighWatermark": 50, "CurrentLeader": {"LeaderId": 3, "LeaderEpoch": 7},
        "DivergingEpoch": {"Epoch": 2, "EndOffset": 99},
        "AbortedTransactions": [{"ProducerId": 5, "FirstOffset": 6}]}]}]},
        size_prefix=False)
    assert_facts_match_the_field_tree(response, (1, 16))
    asked = ("error_code", "high_watermark", "last_stable_offset", "log_start_offset", "preferred_read_replica",
             "diverging_epoch.epoch", "diverging_epoch.end_offset", "current_leader.leader_id",
             "current_leader.leader_epoch", "producer_id", "first_offset")  # (the last two: an array item's)
    _, partitions = partition_facts(decode_response_for_request(response, 1, 16), response, asked)
    assert partitions == [(None, TOPIC_ID, 4, {
        "error_code": 0, "high_watermark": 50, "last_stable_offset": -1, "log_start_offset": -1,
        "preferred_read_replica": -1, "diverging_epoch.epoch": 2, "diverging_epoch.end_offset": 99,
        "current_leader.leader_id": 3, "current_leader.leader_epoch": 7}, None)]
