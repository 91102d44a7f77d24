"""One line per event: time, connection, direction, API and version, ids, size, latency, errors."""

from __future__ import annotations

import time
from functools import lru_cache

from kafkasniff.render.jsonview import FRAME_PREFIX, error_names
from kafkasniff.stream.session import MessageEvent, NoticeEvent, SaslTokenEvent, endpoint_text


@lru_cache(maxsize=64)
def _second(whole: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(whole))


def clock(ts: float) -> str:
    """UTC time of day with microseconds."""
    micros = round(ts * 1e6)
    return f"{_second(micros // 1000000)}.{micros % 1000000:06d}"


def message_line(ev: MessageEvent) -> str:
    m = ev.message
    conn = ev.conn
    arrow = "→" if m.kind == "request" else "←"
    api = f"{m.api_name} v{m.api_version}" if m.api_name else "?"
    parts = [clock(ev.ts), f"#{conn.stream}", f"{endpoint_text(conn.client)} {arrow} {endpoint_text(conn.server)}",
             api, m.kind, f"corr={m.correlation_id}"]
    if m.kind == "request":
        parts.append(f"client={m.client_id!r}" if m.client_id is not None else "client=null")
        if not ev.expects_response:
            parts.append("(no response expected)")
    parts.append(f"{m.size}B")
    if ev.latency_ms is not None:
        parts.append(f"{ev.latency_ms:.3f}ms")
    if ev.inferred:
        parts.append("(request not captured: inferred)")
    errors = error_names(m)
    if errors:
        parts.append("errors=" + ",".join(errors))
    if m.malformed:
        parts.append(f"MALFORMED at byte {m.malformed.offset + FRAME_PREFIX}: {m.malformed.reason}")
    elif m.trailing:
        parts.append(f"+{m.trailing.length} trailing bytes")
    return " ".join(parts)


def sasl_line(ev: SaslTokenEvent, show_secrets: bool) -> str:
    conn = ev.conn
    arrow = "→" if ev.direction == "c2s" else "←"
    shown = ""
    if ev.fields:
        shown = " " + " ".join(f"{f.name}={f.value if show_secrets or f.type != 'secret' else '********'}"
                               for f in ev.fields)
    return (f"{clock(ev.ts)} #{conn.stream} {endpoint_text(conn.client)} {arrow} {endpoint_text(conn.server)} "
            f"SASL {ev.mechanism or ''} token {len(ev.token)}B{shown}")


def notice_line(ev: NoticeEvent) -> str:
    where = f" #{ev.conn.stream} {endpoint_text(ev.conn.client)} ↔ {endpoint_text(ev.conn.server)}" if ev.conn else ""
    size = f" ({ev.size} bytes at stream offset {ev.stream_offset}, {ev.direction})" if ev.size else ""
    return f"{clock(ev.ts)}{where} ! {ev.text}{size}"


def event_line(ev, show_secrets: bool = False) -> str:
    if type(ev) is MessageEvent:
        return message_line(ev)
    if type(ev) is SaslTokenEvent:
        return sasl_line(ev, show_secrets)
    return notice_line(ev)
