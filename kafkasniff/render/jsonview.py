"""Events as JSON objects: the stable `--json` schema documented in the README."""

from __future__ import annotations

from kafkasniff.protocol.entities import topics
from kafkasniff.protocol.errors import error_name
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.interpreter import TAGGED_FIELDS, is_error_code_field
from kafkasniff.protocol.messages import Message
from kafkasniff.protocol.sasl import SECRET, TOKEN
from kafkasniff.render.values import json_bytes, json_value, snake_case
from kafkasniff.stream.session import MessageEvent, NoticeEvent, SaslTokenEvent, endpoint_text

MASK = "********"
_RECORD_ITEM_TYPES = frozenset({"RecordBatch", "Message", "PartialBatch", "Malformed"})


def error_names(msg: Message) -> list[str]:
    """Names of the non-zero error codes anywhere in the body, in order, each once."""
    found: list[str] = []
    stack = [msg.body] if msg.body is not None else []
    while stack:
        f = stack.pop()
        if f.children is not None:
            stack.extend(reversed(f.children))
        elif f.value and is_error_code_field(f.name, f.type):
            found.append(error_name(f.value))
    return list(dict.fromkeys(found))


def _record_json(item: Field) -> dict:
    if item.type == "Malformed":
        m: Malformed = item.value
        return {"malformed": m.to_json()}
    out = json_value(dict(item.value or {}))
    if item.type == "PartialBatch":
        out["partial"] = True
        return out
    inner = item.child("records") or item.child("messages")
    if item.type == "Message":
        out.pop("key", None), out.pop("value", None), out.pop("headers", None)
        if inner is not None:
            out["records"] = [_legacy_record(m) for m in inner.children if m.type == "Message"]
        else:
            out["records"] = [_legacy_record(item)]
    else:
        out["records"] = [json_value(r.value) for r in (inner.children if inner else ()) if r.type == "Record"]
    if inner is not None and inner.note and inner.note.startswith(("decompress", "decompressed size")):
        out["note"] = inner.note
    return out


def _legacy_record(m: Field) -> dict:
    v = m.value
    return {"offset": v["offset"], "timestamp": v["timestamp"], "key": json_bytes(v["key"]),
            "value": json_bytes(v["value"]), "headers": []}


def field_json(f: Field, show_secrets: bool):
    if f.type == SECRET:
        return f.value if show_secrets else MASK
    if f.type == TOKEN:
        return {c.name: field_json(c, show_secrets) for c in f.children}
    if f.type == "records":
        if f.children is None:
            return json_bytes(f.value)
        return [_record_json(item) for item in f.children if item.type in _RECORD_ITEM_TYPES]
    if f.children is None:
        return json_value(f.value)
    if f.type.startswith("[]"):
        return [field_json(c, show_secrets) for c in f.children]
    out = {}
    for c in f.children:
        if c.name == TAGGED_FIELDS:
            for t in c.children:
                if t.type == "unknown_tag":
                    out.setdefault("_unknown_tags", {})[t.name.removeprefix("tag_")] = json_bytes(t.value)
                else:
                    out[snake_case(t.name)] = field_json(t, show_secrets)
        else:
            out[snake_case(c.name)] = field_json(c, show_secrets)
    return out


def message_event_json(ev: MessageEvent, show_secrets: bool = False, with_body: bool = True) -> dict:
    m = ev.message
    request = ev.request
    out = {
        "kind": m.kind,
        "ts": round(ev.ts, 6),
        "stream": ev.conn.stream,
        "src": endpoint_text(ev.src),
        "dst": endpoint_text(ev.dst),
        "api_key": m.api_key,
        "api_name": m.api_name,
        "api_version": m.api_version,
        "header_version": m.header_version,
        "correlation_id": m.correlation_id,
        "client_id": m.client_id if m.kind == "request" else (request.message.client_id if request else None),
        "size": m.size,
        "topics": topics(m),
        "errors": error_names(m),
        "malformed": m.malformed.to_json() if m.malformed else None,
        "trailing_bytes": m.trailing.length if m.trailing else 0,
    }
    if m.kind == "response":
        out["latency_ms"] = round(ev.latency_ms, 3) if ev.latency_ms is not None else None
        out["inferred"] = ev.inferred
    else:
        out["expects_response"] = ev.expects_response
    if with_body:
        out["body"] = field_json(m.body, show_secrets) if m.body is not None else None
    return out


def sasl_token_json(ev: SaslTokenEvent, show_secrets: bool = False) -> dict:
    return {
        "kind": "sasl_token", "ts": round(ev.ts, 6), "stream": ev.conn.stream,
        "src": endpoint_text(ev.conn.client if ev.direction == "c2s" else ev.conn.server),
        "dst": endpoint_text(ev.conn.server if ev.direction == "c2s" else ev.conn.client),
        "mechanism": ev.mechanism, "size": len(ev.token),
        "fields": {f.name: field_json(f, show_secrets) for f in ev.fields} if ev.fields else None,
    }


def notice_json(ev: NoticeEvent) -> dict:
    out = {"kind": "notice", "ts": round(ev.ts, 6), "notice": ev.kind, "text": ev.text}
    if ev.conn is not None:
        out["stream"] = ev.conn.stream
        out["src"], out["dst"] = endpoint_text(ev.conn.client), endpoint_text(ev.conn.server)
    if ev.size:
        out["stream_offset"], out["size"] = ev.stream_offset, ev.size
    return out


def event_json(ev, show_secrets: bool = False) -> dict:
    if type(ev) is MessageEvent:
        return message_event_json(ev, show_secrets)
    if type(ev) is SaslTokenEvent:
        return sasl_token_json(ev, show_secrets)
    return notice_json(ev)
