"""Rows of the `messages` and `records` tables from decoded MessageEvents, as tuples in the
tables' raw column order (see `tables`).

Message columns are taken from `message_event_json`, the function behind `decode --json`, so
the table and the JSON agree by construction; record columns come from the compiled walker,
one tuple per record read straight from the message's bytes. Times are microseconds since
the epoch.
"""

from __future__ import annotations

from kafkasniff.pipeline.tables import MESSAGES, RECORDS
from kafkasniff.protocol import messages
from kafkasniff.protocol.walker import RECORD_ROW
from kafkasniff.render.jsonview import message_event_json
from kafkasniff.stream.session import MessageEvent

# A record row is the carrying message's columns, then the walker's RECORD_ROW as it comes.
_RECORD_MESSAGE_COLUMNS = ("ts", "connection_id", "direction", "api_name", "api_version", "correlation_id",
                           "client_id")
assert RECORDS.raw_names == _RECORD_MESSAGE_COLUMNS + RECORD_ROW, "records table and walker rows disagree"


def micros(ts: float) -> int:
    return round(ts * 1e6)


def message_row(ev: MessageEvent, connection_id: str, files: list[str], topics: list[str],
                record_count: int | None) -> tuple:
    """`topics` as `decode` resolves them for the event (see render.output.Output.event_topics)."""
    j = message_event_json(ev, topic_names=topics)
    m = ev.message
    malformed = j["malformed"]
    tls = j.get("tls") or {}
    response = m.kind == "response"
    return (micros(ev.ts), connection_id, files, j["src"], j["dst"], m.kind, j["api_key"], j["api_name"],
            j["api_version"], j["header_version"], j["correlation_id"], j["client_id"], j["size"],
            ev.latency_ms, m.throttle_time_ms if response else None, j["errors"], j["topics"], record_count,
            j["inferred"] if response else None, None if response else j["expects_response"],
            malformed["reason"] if malformed else None, malformed["offset"] if malformed else None,
            j["trailing_bytes"], tls.get("version"), tls.get("cipher"))


_MESSAGE_COLUMNS = ("ts", "connection_id", "capture_files", "src", "dst", "kind", "api_key", "api_name",
                    "api_version", "header_version", "correlation_id", "client_id", "size", "latency_ms",
                    "throttle_time_ms", "errors", "topics", "record_count", "inferred", "expects_response",
                    "malformed", "malformed_offset", "trailing_bytes", "tls_version", "tls_cipher")
assert MESSAGES.raw_names == _MESSAGE_COLUMNS, "messages table and message_row disagree"


def record_rows(ev: MessageEvent, connection_id: str, client_id: str | None) -> list[tuple] | None:
    """One row per record of the message, read from its bytes; None when it carries no record batches."""
    m = ev.message
    if not m.batches:
        return None
    common = (micros(ev.ts), connection_id, "produce" if m.kind == "request" else "fetch", m.api_name,
              m.api_version, m.correlation_id, client_id)
    return [common + found for found in messages.record_rows(m, ev.payload)]
