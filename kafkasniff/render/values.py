"""How decoded values look to people (text) and to programs (JSON)."""

from __future__ import annotations

import base64
import re

from kafkasniff.protocol.fields import Field

DEFAULT_MAX_VALUE = 64
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(name: str) -> str:
    """Kafka schema names to JSON keys: ThrottleTimeMs -> throttle_time_ms, TopicID -> topic_id."""
    return _CAMEL.sub("_", name).lower()


def printable_text(raw: bytes) -> str | None:
    """The bytes as text when they are valid UTF-8 that a person can read, else None."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(c.isprintable() or c in "\t\n\r" for c in text):
        return text
    return None


def show_bytes(raw: bytes, limit: int | None = DEFAULT_MAX_VALUE) -> str:
    text = printable_text(raw)
    if text is not None:
        shown = text if limit is None or len(text) <= limit else text[:limit] + "…"
        out = repr(shown)
    else:
        hexed = raw.hex(" ")
        out = "0x" + (hexed if limit is None or len(raw) <= limit // 2 else raw[:limit // 2].hex(" ") + " …")
    if limit is not None and len(raw) > limit // 2:
        out += f" ({len(raw):,} bytes)"
    return out


def show_value(f: Field, limit: int | None = DEFAULT_MAX_VALUE) -> str:
    v = f.value
    if f.children is not None and f.type.startswith("[]"):
        text = f"{len(f.children)} items"
    elif v is None:
        text = "null"
    elif isinstance(v, (bytes, bytearray)):
        text = show_bytes(bytes(v), limit)
    elif isinstance(v, str):
        text = repr(v if limit is None or len(v) <= limit else v[:limit] + "…")
    elif isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, dict):
        text = ""
    else:
        text = str(v)
    if f.note:
        text = f"{text} ({f.note})" if text else f.note
    return text


def json_bytes(raw: bytes | None):
    """Lossless JSON for bytes: base64, plus the text form when it is valid UTF-8."""
    if raw is None:
        return None
    out = {"base64": base64.b64encode(raw).decode("ascii")}
    try:
        out["text"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    return out


def json_value(v):
    if isinstance(v, (bytes, bytearray)):
        return json_bytes(bytes(v))
    if isinstance(v, dict):
        return {k: json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    return v
