"""Events as JSON objects: the stable `--json` schema documented in the README."""

from __future__ import annotations

from functools import cache
from typing import Iterable

from kafkasniff.protocol.entities import error_codes, topics
from kafkasniff.protocol.errors import error_name
from kafkasniff.protocol.fields import Field, Malformed
from kafkasniff.protocol.interpreter import TAGGED_FIELDS
from kafkasniff.protocol.messages import Message
from kafkasniff.protocol.sasl import SECRET, TOKEN
from kafkasniff.render.bytemap import DETACHED_TYPES
from kafkasniff.render.values import json_bytes, json_value, snake_case
from kafkasniff.stream.session import MessageEvent, NoticeEvent, SaslTokenEvent, endpoint_text

MASK = "********"
FRAME_PREFIX = 4  # offsets shown to people count from the start of the frame's size prefix
_RECORD_ITEM_TYPES = frozenset({"RecordBatch", "Message", "PartialBatch", "Malformed"})
json_key = cache(snake_case)  # field names come from the schemas: a bounded set


def error_names(msg: Message) -> list[str]:
    """Names of the non-zero error codes in the body, each once."""
    codes = error_codes(msg)
    return list(dict.fromkeys(error_name(code) for code in codes)) if codes else []


def _malformed_json(m: Malformed, shift: int) -> dict:
    return {"offset": m.offset + shift, "reason": m.reason}


def _record_json(item: Field) -> dict:
    """One record batch or legacy message; offsets of what is malformed count from the frame's start."""
    if item.type == "Malformed":
        return {"malformed": _malformed_json(item.value, FRAME_PREFIX)}
    out = json_value(dict(item.value or {}))
    if item.type == "PartialBatch":
        out["partial"] = True
        return out
    inner = item.child("records") or item.child("messages")
    # Records of a compressed batch are decoded from the decompressed bytes: offsets count within those.
    shift = 0 if inner is not None and inner.type in DETACHED_TYPES else FRAME_PREFIX
    if item.type == "Message":
        out.pop("key", None), out.pop("value", None), out.pop("headers", None)
        if inner is not None:
            out["records"] = [_legacy_record(m, shift) for m in inner.children if m.type in ("Message", "Malformed")]
        else:
            out["records"] = [_legacy_record(item, shift)]
    else:
        out["records"] = [_batch_record(r, shift) for r in (inner.children if inner else ())
                          if r.type in ("Record", "Malformed")]
    if inner is not None and inner.note and inner.note.startswith(("decompress", "decompressed size")):
        out["note"] = inner.note
    return out


def _batch_record(r: Field, shift: int) -> dict:
    if r.type == "Malformed":
        return {"malformed": _malformed_json(r.value, shift)}
    out = json_value(r.value)
    key = r.child("key")
    if key is not None and key.type == "ControlRecordKey":
        out["control_type"] = key["Type"].note
    return out


def _legacy_record(m: Field, shift: int) -> dict:
    if m.type == "Malformed":
        return {"malformed": _malformed_json(m.value, shift)}
    v = m.value
    return {"offset": v["offset"], "timestamp": v["timestamp"], "key": json_bytes(v["key"]),
            "value": json_bytes(v["value"]), "headers": []}


_SCALARS = frozenset({int, str, float, bool, type(None)})


def field_json(f: Field, show_secrets: bool):
    kids, t = f.children, f.type
    if kids is None:
        v = f.value
        if v.__class__ in _SCALARS and t != SECRET:
            return v  # the common case, first
        if t == SECRET:
            return v if show_secrets else MASK
        if t == "records":
            # Not expanded (no records decoder given), or no records at all.
            return json_bytes(v) if v else []
        return json_value(v)
    if t == "records":
        return [_record_json(item) for item in kids if item.type in _RECORD_ITEM_TYPES]
    if t[:2] == "[]":
        return [c.value if c.children is None and c.value.__class__ in _SCALARS else field_json(c, show_secrets)
                for c in kids]
    if t == TOKEN:
        return {c.name: field_json(c, show_secrets) for c in kids}
    out = {}
    for c in kids:
        if c.children is None and c.value.__class__ in _SCALARS and c.type != SECRET:
            out[json_key(c.name)] = c.value  # most members: no call for them
        elif c.name == TAGGED_FIELDS:
            for tag in c.children:
                if tag.type == "unknown_tag":
                    out.setdefault("_unknown_tags", {})[tag.name.removeprefix("tag_")] = json_bytes(tag.value)
                else:
                    out[json_key(tag.name)] = field_json(tag, show_secrets)
        else:
            out[json_key(c.name)] = field_json(c, show_secrets)
    return out


def message_event_json(ev: MessageEvent, show_secrets: bool = False, with_body: bool = True,
                       topic_names: Iterable[str] | None = None) -> dict:
    """`topic_names`: the topics as Output resolves them (ids included); by default the names in the body."""
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
        "topics": list(topic_names) if topic_names is not None else topics(m),
        "errors": error_names(m),
        "malformed": _malformed_json(m.malformed, FRAME_PREFIX) if m.malformed else None,
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


def event_json(ev, show_secrets: bool = False, topic_names: Iterable[str] | None = None) -> dict:
    if type(ev) is MessageEvent:
        return message_event_json(ev, show_secrets, topic_names=topic_names)
    if type(ev) is SaslTokenEvent:
        return sasl_token_json(ev, show_secrets)
    return notice_json(ev)
