"""Events as JSON objects: the stable `--json` schema documented in the README."""

from __future__ import annotations

from typing import Iterable

import orjson

from kafkasniff.protocol.embedded import SASL_AUTHENTICATE
from kafkasniff.protocol.fields import Malformed
from kafkasniff.protocol.messages import Message, json_body
from kafkasniff.protocol.sasl import SECRET, TokenReader
from kafkasniff.render.values import FRAME_PREFIX, error_names
from kafkasniff.stream.session import MessageEvent, NoticeEvent, SaslTokenEvent, endpoint_text

MASK = "********"


def topics(msg: Message) -> list[str]:
    """Topic names the message mentions, each once, in order (topic ids not resolved)."""
    return list(dict.fromkeys(name for name, _, _, _ in msg.mentions if name is not None))


def _malformed_json(m: Malformed, shift: int) -> dict:
    return {"offset": m.offset + shift, "reason": m.reason}


def token_reader(msg: Message, show_secrets: bool) -> TokenReader | None:
    """What reads a SaslAuthenticate message's token (with its session's mechanism); None for other APIs."""
    if msg.api_key != SASL_AUTHENTICATE:
        return None
    return TokenReader(msg.sasl_mechanism, msg.kind == "request", MASK, show_secrets)


def token_json(fields, show_secrets: bool) -> dict:
    return {f.name: f.value if show_secrets or f.type != SECRET else MASK for f in fields}


def message_event_json(ev: MessageEvent, topic_names: Iterable[str] | None = None) -> dict:
    """The JSON object of a message event without its body (see `message_event_line`).
    `topic_names`: the topics as Output resolves them (ids included); by default the names in the body."""
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
    if ev.conn.tls is not None:
        out["tls"] = ev.conn.tls
    if m.kind == "response":
        out["latency_ms"] = round(ev.latency_ms, 3) if ev.latency_ms is not None else None
        out["inferred"] = ev.inferred
        if ev.screened is not None:  # an inferred response: the other readings of its bytes, when there are
            others = ev.screened.others(m.api_key, m.api_version)
            if others:
                out["alternatives"] = readings_json(others)
            if ev.screened.untried:
                out["schemas_not_tried"] = ev.screened.untried
        if request is not None and not request.expects_response:
            out["unexpected"] = True
    else:
        out["expects_response"] = ev.expects_response
    return out


def readings_json(readings: list[tuple[str, int]]) -> list[dict]:
    """Other readings of some bytes ((API name, version)s), as `decode --json` and `explain --json` list them."""
    return [{"api_name": name, "api_version": version} for name, version in readings]


def message_event_line(ev: MessageEvent, show_secrets: bool = False, topic_names: Iterable[str] | None = None,
                       write=None) -> bytes:
    """The event's JSON line, body last, written from the bytes in one pass. With `write`, the line goes to it
    in pieces (a long body between whole record batches) and only its end is returned."""
    head = orjson.dumps(message_event_json(ev, topic_names))
    m = ev.message
    if write is None:
        body = json_body(m, ev.payload, token_reader(m, show_secrets))
        return b"".join((head[:-1], b',"body":', b"null" if body is None else body, b"}\n"))
    write(head[:-1])
    write(b',"body":')
    body = json_body(m, ev.payload, token_reader(m, show_secrets), write)
    write(b"null" if body is None else body)
    return b"}\n"


def sasl_token_json(ev: SaslTokenEvent, show_secrets: bool = False) -> dict:
    return {
        "kind": "sasl_token", "ts": round(ev.ts, 6), "stream": ev.conn.stream,
        "src": endpoint_text(ev.conn.client if ev.direction == "c2s" else ev.conn.server),
        "dst": endpoint_text(ev.conn.server if ev.direction == "c2s" else ev.conn.client),
        "mechanism": ev.mechanism, "size": len(ev.token),
        "fields": token_json(ev.fields, show_secrets) if ev.fields else None,
    }


def notice_json(ev: NoticeEvent) -> dict:
    out = {"kind": "notice", "ts": round(ev.ts, 6), "notice": ev.kind, "text": ev.text}
    if ev.conn is not None:
        out["stream"] = ev.conn.stream
        out["src"], out["dst"] = endpoint_text(ev.conn.client), endpoint_text(ev.conn.server)
    if ev.size:
        out["direction"], out["stream_offset"], out["size"] = ev.direction, ev.stream_offset, ev.size
    return out


def event_line(ev, show_secrets: bool = False, topic_names: Iterable[str] | None = None, write=None) -> bytes:
    """One event as a JSON line (with its newline); `write`: see message_event_line."""
    if type(ev) is MessageEvent:
        return message_event_line(ev, show_secrets, topic_names, write)
    if type(ev) is SaslTokenEvent:
        return orjson.dumps(sasl_token_json(ev, show_secrets), option=orjson.OPT_APPEND_NEWLINE)
    return orjson.dumps(notice_json(ev), option=orjson.OPT_APPEND_NEWLINE)
