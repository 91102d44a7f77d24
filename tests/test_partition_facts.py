"""The partitions builder (partitions.c), which the analyses read lag and end-to-end latency from, against the
Field tree of the same bytes: on every frame of every capture, whole, cut short and with bytes overwritten, on
legacy message sets, and on random bytes at every API version. Mutations use a fixed seed, so a failure repeats.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kafkasniff.protocol.fields import TAGGED_FIELDS
from kafkasniff.protocol.messages import (all_versions, decode_request, decode_response_for_request,
                                          partition_facts)
from kafkasniff.protocol.program import snake_case
from kafkasniff.protocol.records import records_of
from tests.test_walker import FRAMES, _cuts, _legacy_produce

FIXED_WIDTH = {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64"}
NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"
MUTATIONS_PER_FRAME = 12


def _batch(item) -> tuple | None:
    if item.type == "RecordBatch":
        return (item["base_offset"].value, item["last_offset_delta"].value, item["record_count"].value,
                item.value["is_control"], item["max_timestamp"].value)
    if item.type == "Message":
        v = item.value
        return (v["base_offset"], v["offset"] - v["base_offset"], len(records_of(item)), False,
                -1 if v["timestamp"] is None else v["timestamp"])
    return None


class Oracle:
    """partition_facts' result made from a Field tree by the rules of partitions.c."""

    def __init__(self) -> None:
        self.root: dict = {}
        self.partitions: list[tuple] = []

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
                facts[prefix + snake_case(c.name)] = c.value
            elif c.type == "string":
                if c.role == "topicName" and c.value is not None:
                    topic = c.value
            elif c.children is None or c.type == "bytes":
                continue
            elif c.type == "records":
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
WANTED = frozenset({"replica_id", "replica_state.replica_id", "isolation_level", "fetch_offset", "error_code",
                    "high_watermark", "records_bytes", "base_offset", "offset", "current_leader.leader_id",
                    "no_such_fact"})


def _only(facts: dict, wanted: frozenset) -> dict:
    return {name: value for name, value in facts.items() if name in wanted}


def assert_facts_match_the_field_tree(data: bytes, request) -> None:
    """All facts, and only those WANTED (the walk is the same; facts not asked for are never made)."""
    msg = _decode(data, request)
    got = partition_facts(msg, data)
    got_wanted = partition_facts(msg, data, WANTED)
    if msg.body is None:
        assert got == got_wanted == ({}, [])
        return
    root, partitions = Oracle().of(msg.body)
    assert got == (root, partitions)
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
    root, partitions = partition_facts(decode_request(payload), payload)
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


def test_a_real_fetch_response_in_plain_numbers():
    """The consumer_group capture's first Fetch response (kafka-python, v12): what the lag analysis reads."""
    payload, request = next((p, r) for p, r in FRAMES if r == (1, 12) and len(p) == 1120)
    root, partitions = partition_facts(_decode(payload, request), payload)
    assert root == {"throttle_time_ms": 0, "error_code": 0, "session_id": 0}
    assert sorted(partitions) == [
        ("group-topic", None, p, {"error_code": 0, "high_watermark": 2, "last_stable_offset": 2,
                                  "log_start_offset": 0, "preferred_read_replica": -1, "records_bytes": size},
         [(0, 1, 2, False, 1795421628057)]) for p, size in ((0, 633), (1, 145), (2, 197))]


def test_wanted_facts_of_a_real_fetch_response_and_a_wrong_kind_of_names():
    payload, request = next((p, r) for p, r in FRAMES if r == (1, 12) and len(p) == 1120)
    msg = _decode(payload, request)
    root, partitions = partition_facts(msg, payload, frozenset({"high_watermark", "records_bytes", "session_id"}))
    assert root == {"session_id": 0}
    assert sorted(partitions) == [("group-topic", None, p, {"high_watermark": 2, "records_bytes": size},
                                   [(0, 1, 2, False, 1795421628057)]) for p, size in ((0, 633), (1, 145), (2, 197))]
    assert partition_facts(msg, payload, frozenset()) == ({}, [(t, i, p, {}, b) for t, i, p, _, b in partitions])
    # The program remembers which names a frozenset keeps (per set: asked anew for another); a set may change
    # between calls, so it is asked every time.
    assert partition_facts(msg, payload, frozenset({"high_watermark", "records_bytes", "session_id"})) == \
        (root, partitions)
    changing = {"session_id"}
    assert partition_facts(msg, payload, changing)[0] == {"session_id": 0}
    changing.discard("session_id")
    changing.add("throttle_time_ms")
    assert partition_facts(msg, payload, changing)[0] == {"throttle_time_ms": 0}
    with pytest.raises(TypeError, match="wanted must be a set"):
        partition_facts(msg, payload, ["records_bytes"])


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
    assert partition_facts(decode_request(request), request) == (
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
    _, partitions = partition_facts(decode_response_for_request(response, 1, 16), response)
    assert partitions == [(None, TOPIC_ID, 4, {
        "error_code": 0, "high_watermark": 50, "last_stable_offset": -1, "log_start_offset": -1,
        "preferred_read_replica": -1, "diverging_epoch.epoch": 2, "diverging_epoch.end_offset": 99,
        "current_leader.leader_id": 3, "current_leader.leader_epoch": 7}, None)]
