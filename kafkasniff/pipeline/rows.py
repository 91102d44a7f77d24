"""Rows of the `messages` and `records` tables from decoded MessageEvents.

Message columns are taken from `message_event_json`, the function behind `decode --json`, so
the table and the JSON agree by construction. Times are microseconds since the epoch (see
`tables`).
"""

from __future__ import annotations

from kafkasniff.protocol import messages
from kafkasniff.protocol.walker import RECORD_ROW
from kafkasniff.render.jsonview import message_event_json
from kafkasniff.stream.session import MessageEvent


def micros(ts: float) -> int:
    return round(ts * 1e6)


def message_row(ev: MessageEvent, connection_id: str, files: list[str], topics: list[str],
                record_count: int | None) -> dict:
    """`topics` as `decode` resolves them for the event (see render.output.Output.event_topics)."""
    row = message_event_json(ev, topic_names=topics)
    m = ev.message
    malformed = row["malformed"] or {}
    tls = row.pop("tls", None) or {}
    row.update(
        tls_version=tls.get("version"), tls_cipher=tls.get("cipher"), ts=micros(ev.ts), connection_id=connection_id, capture_files=files,
        latency_ms=ev.latency_ms, throttle_time_ms=m.throttle_time_ms if m.kind == "response" else None,
        record_count=record_count, malformed=malformed.get("reason"), malformed_offset=malformed.get("offset"),
        inferred=row.get("inferred"), expects_response=row.get("expects_response"))
    return row


def record_rows(ev: MessageEvent, connection_id: str, client_id: str | None) -> list[dict] | None:
    """One row per record of the message, read from its bytes; None when it carries no record batches."""
    m = ev.message
    if not m.batches:
        return None
    common = {"ts": micros(ev.ts), "connection_id": connection_id,
              "direction": "produce" if m.kind == "request" else "fetch",
              "api_name": m.api_name, "api_version": m.api_version, "correlation_id": m.correlation_id,
              "client_id": client_id}
    return [{**common, **dict(zip(RECORD_ROW, found))} for found in messages.record_rows(m, ev.payload)]
