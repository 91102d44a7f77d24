"""What the analyses read of a message: the bodies of the group APIs as plain values (they are small and rare),
and the per-partition numbers of Produce, Fetch and ListOffsets without their records (messages.partition_facts:
batch headers only, so a Fetch response of thousands of records costs no more than a few small ones)."""

from __future__ import annotations

from typing import NamedTuple

import orjson

from kafkasniff.protocol.messages import json_body, partition_facts
from kafkasniff.protocol.topics import TopicNames
from kafkasniff.stream.session import MessageEvent, endpoint_text


class Partition(NamedTuple):
    topic: str | None       # the name; an id the capture never named stays the id
    partition: int
    facts: dict             # the partition's fixed-width fields by snake_case name (walker.partition_facts)
    batches: list | None    # walker.BATCH_FACTS tuples of its record batches: (base offset, last offset
                            # delta, record count, is control, max timestamp)


def body(ev: MessageEvent) -> dict | None:
    """The message's body as plain values (the --json body), or None when it is malformed or has none."""
    m = ev.message
    if m.malformed is not None:
        return None
    text = json_body(m, ev.payload)
    return orjson.loads(text) if text is not None else None


def request_body(ev: MessageEvent) -> dict | None:
    """A response's request body; None when the request was not captured."""
    return body(ev.request) if ev.request is not None else None


def partitions(ev: MessageEvent, names: TopicNames) -> tuple[dict, list[Partition]]:
    """The body's root fields and its partitions, topic ids named; nothing for a malformed message."""
    m = ev.message
    if m.malformed is not None:
        return {}, []
    root, found = partition_facts(m, ev.payload)
    by_id = names.by_id
    return root, [Partition(topic if topic is not None else by_id.get(topic_id, topic_id), partition, facts, batches)
                  for topic, topic_id, partition, facts, batches in found]


def client_id(ev: MessageEvent) -> str | None:
    if ev.message.kind == "request":
        return ev.message.client_id
    return ev.request.message.client_id if ev.request is not None else None


def client_address(ev: MessageEvent) -> str:
    """The client end of the event's connection, ip:port."""
    return endpoint_text(ev.conn.client)


def topic_of(entry: dict, names: TopicNames) -> str | None:
    """The topic a JSON struct names: by name, else by its id (named when the capture said which)."""
    for key in ("name", "topic"):
        if entry.get(key):
            return entry[key]
    topic_id = entry.get("topic_id")
    return names.by_id.get(topic_id, topic_id) if topic_id else None
