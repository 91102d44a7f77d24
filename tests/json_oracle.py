"""A second, independent way to the `--json` body: from the Field tree, the way the project wrote it in Python
before JSON was written straight from the bytes (json.c). Tests compare the two on real and broken frames, so
the Field builder and the JSON builder keep telling the same story."""

from __future__ import annotations

from kafkasniff.protocol.fields import DECOMPRESSED_MESSAGES, DECOMPRESSED_RECORDS, TAGGED_FIELDS, Field
from kafkasniff.protocol.program import snake_case
from kafkasniff.protocol.sasl import SECRET, TOKEN
from kafkasniff.render.values import json_bytes, json_value

FRAME_PREFIX = 4
MASK = "********"
_DETACHED = (DECOMPRESSED_RECORDS, DECOMPRESSED_MESSAGES)


def _malformed(m, shift: int) -> dict:
    return {"malformed": {"offset": m.offset + shift, "reason": m.reason}}


def _item(item: Field) -> dict:
    if item.type == "Malformed":
        return _malformed(item.value, FRAME_PREFIX)
    out = json_value(dict(item.value or {}))
    if item.type == "PartialBatch":
        out["partial"] = True
        return out
    inner = item.child("records") or item.child("messages")
    shift = 0 if inner is not None and inner.type in _DETACHED else FRAME_PREFIX
    if item.type == "Message":
        for key in ("key", "value", "headers"):
            out.pop(key, None)
        if inner is not None:
            out["records"] = [_legacy(m, shift) for m in inner.children if m.type in ("Message", "Malformed")]
        else:
            out["records"] = [_legacy(item, shift)]
    else:
        out["records"] = [_record(r, shift) for r in (inner.children if inner else ())
                          if r.type in ("Record", "Malformed")]
    if inner is not None and inner.note and inner.note.startswith(("decompress", "decompressed size")):
        out["note"] = inner.note
    return out


def _record(r: Field, shift: int) -> dict:
    if r.type == "Malformed":
        return _malformed(r.value, shift)
    out = json_value(r.value)
    key = r.child("key")
    if key is not None and key.type == "ControlRecordKey":
        out["control_type"] = key["Type"].note
    return out


def _legacy(m: Field, shift: int) -> dict:
    if m.type == "Malformed":
        return _malformed(m.value, shift)
    v = m.value
    return {"offset": v["offset"], "timestamp": v["timestamp"], "key": json_bytes(v["key"]),
            "value": json_bytes(v["value"]), "headers": []}


def field_json(f: Field, show_secrets: bool = False):
    kids, t = f.children, f.type
    if kids is None:
        if t == SECRET:
            return f.value if show_secrets else MASK
        if t == "records":
            return json_bytes(f.value) if f.value else f.value if f.value is None else []
        return json_value(f.value)
    if t == "records":
        return [_item(item) for item in kids]
    if t.startswith("[]"):
        return [field_json(c, show_secrets) for c in kids]
    if t == TOKEN:
        return {c.name: field_json(c, show_secrets) for c in kids}
    out = {}
    for c in kids:
        if c.name == TAGGED_FIELDS:
            for tag in c.children:
                if tag.type == "unknown_tag":
                    out.setdefault("_unknown_tags", {})[tag.name.removeprefix("tag_")] = json_bytes(tag.value)
                else:
                    out[snake_case(tag.name)] = field_json(tag, show_secrets)
        else:
            out[snake_case(c.name)] = field_json(c, show_secrets)
    return out
