"""One line per event: time, connection, direction, API and version, ids, size, latency, errors."""

from __future__ import annotations

import time
from functools import lru_cache

from kafkasniff.protocol.schema import carries_records
from kafkasniff.render.values import FRAME_PREFIX, error_names
from kafkasniff.stream.session import MessageEvent, NoticeEvent, SaslTokenEvent, endpoint_text


@lru_cache(maxsize=64)
def _second(whole: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(whole))


def clock(ts: float) -> str:
    """UTC time of day with microseconds."""
    micros = round(ts * 1e6)
    return f"{_second(micros // 1000000)}.{micros % 1000000:06d}"


@lru_cache(maxsize=4096)
def _connection_text(conn, arrow: str) -> str:
    return f"#{conn.stream} {endpoint_text(conn.client)} {arrow} {endpoint_text(conn.server)}"


@lru_cache(maxsize=1024)
def _api_text(api_name: str | None, api_version: int | None, kind: str) -> str:
    return f"{api_name} v{api_version} {kind}" if api_name else f"? {kind}"


# Stands for the topics text in a line rendered by a parallel worker (a topic cannot be named so: NUL).
TOPICS_SLOT = "\x00topics\x00"
PARTITIONS_SHOWN = 12


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def topics_text(topics: dict[str, list]) -> str:
    """ topic[partitions] for each topic a message names (as Output resolves them), with a leading space."""
    parts = []
    for name, (_, partitions) in topics.items():
        shown = list(dict.fromkeys(partitions))
        more = f",…+{len(shown) - PARTITIONS_SHOWN}" if len(shown) > PARTITIONS_SHOWN else ""
        parts.append(f" {name}[{','.join(map(str, shown[:PARTITIONS_SHOWN]))}{more}]" if shown else f" {name}")
    return "".join(parts)


def message_line(ev: MessageEvent, topics: dict[str, list] | str | None = None) -> str:
    """`topics`: the message's topics as Output resolves them (shown for APIs that carry records), or
    TOPICS_SLOT where a parallel worker leaves them to the parent."""
    m = ev.message
    request = m.kind == "request"
    line = (f"{clock(ev.ts)} {_connection_text(ev.conn, '→' if request else '←')} "
            f"{_api_text(m.api_name, m.api_version, m.kind)} corr={m.correlation_id}")
    if request:
        line += f" client={m.client_id!r}" if m.client_id is not None else " client=null"
        if not ev.expects_response:
            line += " (no response expected)"
    line += f" {m.end - m.offset}B"
    if ev.latency_ms is not None:
        line += f" {ev.latency_ms:.3f}ms"
        if not ev.request.expects_response:
            line += " (unexpected: its request expected no response)"
    if ev.inferred:
        line += " (request not captured: inferred)"
    if topics is not None and carries_records(m.api_key):
        line += topics if type(topics) is str else topics_text(topics)
    if m.batches:
        line += f" {_plural(m.batches, 'batch', 'batches')} {_plural(m.records, 'record', 'records')}"
    errors = error_names(m)
    if errors:
        line += " errors=" + ",".join(errors)
    if m.malformed:
        line += f" MALFORMED at byte {m.malformed.offset + FRAME_PREFIX}: {m.malformed.reason}"
    elif m.trailing:
        line += f" +{m.trailing.length} trailing bytes"
    return line


def sasl_line(ev: SaslTokenEvent, show_secrets: bool) -> str:
    conn = ev.conn
    arrow = "→" if ev.direction == "c2s" else "←"
    shown = ""
    if ev.fields:
        shown = " " + " ".join(f"{f.name}={f.value if show_secrets or f.type != 'secret' else '********'}"
                               for f in ev.fields)
    return (f"{clock(ev.ts)} {_connection_text(conn, arrow)} "
            f"SASL {ev.mechanism or ''} token {len(ev.token)}B{shown}")


def notice_line(ev: NoticeEvent) -> str:
    where = f" {_connection_text(ev.conn, '↔')}" if ev.conn else ""
    size = f" ({ev.size} bytes at stream offset {ev.stream_offset}, {ev.direction})" if ev.size else ""
    return f"{clock(ev.ts)}{where} ! {ev.text}{size}"


def event_line(ev, show_secrets: bool = False, topics: dict[str, list] | str | None = None) -> str:
    if type(ev) is MessageEvent:
        return message_line(ev, topics)
    if type(ev) is SaslTokenEvent:
        return sasl_line(ev, show_secrets)
    return notice_line(ev)
