"""Rows of the `messages` and `records` tables from decoded MessageEvents.

Message columns are taken from `message_event_json`, the function behind `decode --json`, so
the table and the JSON agree by construction. Times are microseconds since the epoch (see
`tables`).
"""

from __future__ import annotations

from collections.abc import Iterator

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.messages import field_trees
from kafkasniff.protocol.records import records_of
from kafkasniff.render.jsonview import message_event_json
from kafkasniff.stream.session import MessageEvent

_RECORD_ITEMS = frozenset({"RecordBatch", "Message"})


def micros(ts: float) -> int:
    return round(ts * 1e6)


def message_row(ev: MessageEvent, connection_id: str, files: list[str], topics: list[str],
                record_count: int | None) -> dict:
    """`topics` as `decode` resolves them for the event (see render.output.Output.event_topics)."""
    row = message_event_json(ev, topic_names=topics)
    m = ev.message
    malformed = row["malformed"] or {}
    row.update(
        ts=micros(ev.ts), connection_id=connection_id, capture_files=files,
        latency_ms=ev.latency_ms, throttle_time_ms=m.throttle_time_ms if m.kind == "response" else None,
        record_count=record_count, malformed=malformed.get("reason"), malformed_offset=malformed.get("offset"),
        inferred=row.get("inferred"), expects_response=row.get("expects_response"))
    return row


def record_rows(ev: MessageEvent, connection_id: str, client_id: str | None) -> list[dict] | None:
    """One row per decoded record of the message; None when it carries no record batches."""
    m = ev.message
    if not m.batches:
        return None
    _, body = field_trees(m, ev.payload)
    sources = list(_records_fields(body, None, None, None)) if body is not None else []
    if not sources:
        return None
    common = {"ts": micros(ev.ts), "connection_id": connection_id,
              "direction": "produce" if m.kind == "request" else "fetch",
              "api_name": m.api_name, "api_version": m.api_version, "correlation_id": m.correlation_id,
              "client_id": client_id}
    rows = []
    for topic, topic_id, partition, records in sources:
        for item in records.children:
            if item.type not in _RECORD_ITEMS:
                continue  # partial batches (a Fetch filled to its limit) and malformed items hold no records
            batch = item.value
            for record in records_of(item):
                r = record.value
                timestamp = r.get("timestamp")
                rows.append({
                    **common, "topic": topic, "topic_id": topic_id, "partition": partition,
                    "offset": r["offset"],
                    "timestamp": timestamp * 1000 if timestamp is not None and timestamp >= 0 else None,
                    "key_size": _size(r["key"]), "value_size": _size(r["value"]),
                    "header_count": len(r["headers"]), "codec": batch["codec"], "magic": batch["magic"],
                    "producer_id": batch["producer_id"], "is_transactional": batch["is_transactional"],
                    "is_control": batch["is_control"], "crc_valid": batch["crc_valid"] and r.get("crc_valid", True),
                })
    return rows


def _size(value: bytes | None) -> int | None:
    return len(value) if value is not None else None


def _records_fields(f: Field, topic, topic_id, partition) -> Iterator[tuple]:
    """(topic, topic id, partition, records field) for each expanded `records` field under f."""
    children = f.children or ()
    if not f.type.startswith("[]"):
        for c in children:
            if c.role == "topicName" and c.type == "string":
                topic = c.value
            elif c.role == "topicId":
                topic_id = c.value
            elif c.role == "partition" and c.type == "int32":
                partition = c.value
    for c in children:
        if c.type == "records":
            if c.children is not None:
                yield topic, topic_id, partition, c
        elif c.children:
            yield from _records_fields(c, topic, topic_id, partition)
