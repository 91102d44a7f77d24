"""One TCP connection's Kafka conversation: who is the client, frames, decoding, pairing.

Sans-I/O. The caller hands over each side's bytes in stream order (`data`),
holes (`gap`) and ends (`end`); the session returns events:

- `MessageEvent`: a decoded request or response (responses carry their request
  and latency, or `inferred=True` when the request was not captured);
- `SaslTokenEvent`: a raw SASL token exchanged after SaslHandshake v0;
- `NoticeEvent`: skipped bytes, TLS, a connection that is not Kafka.

The client is recognised from content: the side whose first frame is a valid
Kafka request. A port hint or the TCP handshake settles it when available.
"""

from __future__ import annotations

import struct
from kafkasniff.protocol import quirks, sasl
from kafkasniff.protocol.embedded import SASL_AUTHENTICATE
from kafkasniff.protocol.fields import Malformed
from kafkasniff.protocol.identify import infer_response
from kafkasniff.protocol.messages import Message, decode_request, decode_response_for_request, with_fields
from kafkasniff.protocol.schema import apis, message_variant
from kafkasniff.stream.framing import DEFAULT_MAX_FRAME, MIN_FRAME, Frame, Framer, Skipped
from kafkasniff.stream.tcp import Endpoint

CLIENT_TO_SERVER, SERVER_TO_CLIENT = "c2s", "s2c"
# How much of an unidentified connection we look at before deciding it is not Kafka.
# A capture may start inside a large message (1 MiB Produce is common): look that far for a request.
IDENTIFY_LIMIT = 4 * 1024 * 1024
MAX_ORPHANS = 64
_HEAD = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def endpoint_text(endpoint: Endpoint) -> str:
    ip, port = endpoint
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class Connection:
    __slots__ = ("stream", "client", "server", "tls")

    def __init__(self, stream: int, client: Endpoint, server: Endpoint):
        self.stream = stream
        self.client = client
        self.server = server
        self.tls = False


class MessageEvent:
    __slots__ = ("conn", "direction", "ts", "first_ts", "stream_offset", "payload", "message", "request",
                 "latency_ms", "inferred", "expects_response")

    def __init__(self, conn: Connection, direction: str, frame: Frame, message: Message):
        self.conn = conn
        self.direction = direction
        self.ts = frame.ts
        self.first_ts = frame.first_ts
        self.stream_offset = frame.stream_offset
        self.payload = frame.payload  # the frame after its size prefix: the buffer message offsets point into
        self.message = message
        self.request: MessageEvent | None = None
        self.latency_ms: float | None = None
        self.inferred = False
        self.expects_response = True

    @property
    def src(self) -> Endpoint:
        return self.conn.client if self.direction == CLIENT_TO_SERVER else self.conn.server

    @property
    def dst(self) -> Endpoint:
        return self.conn.server if self.direction == CLIENT_TO_SERVER else self.conn.client


class SaslTokenEvent:
    __slots__ = ("conn", "direction", "ts", "stream_offset", "token", "mechanism", "fields")

    def __init__(self, conn: Connection, direction: str, frame: Frame, mechanism: str | None):
        self.conn = conn
        self.direction = direction
        self.ts = frame.ts
        self.stream_offset = frame.stream_offset
        self.token = frame.payload
        self.mechanism = mechanism
        self.fields = sasl.parse_token(mechanism, frame.payload, direction == CLIENT_TO_SERVER)


class NoticeEvent:
    __slots__ = ("conn", "direction", "ts", "kind", "text", "stream_offset", "size")

    def __init__(self, conn: Connection | None, direction: str | None, ts: float, kind: str, text: str,
                 stream_offset: int = 0, size: int = 0):
        self.conn = conn
        self.direction = direction
        self.ts = ts
        self.kind = kind
        self.text = text
        self.stream_offset = stream_offset
        self.size = size


def request_header_plausible(buf, pos: int, end: int) -> bool | None:
    """Cheap check that a Kafka request header starts at pos."""
    if end - pos < 10:
        return None
    key, version, correlation_id = _HEAD.unpack_from(buf, pos)
    if key not in apis() or message_variant(key, "request", version) is None or correlation_id < 0:
        return False
    if key == quirks.CONTROLLED_SHUTDOWN and version == 0:
        return True
    return -1 <= _I16.unpack_from(buf, pos + 8)[0] <= 4096  # client id length


def is_tls_record(buf) -> bool:
    """A TLS handshake record header: content type 22, version 3.x."""
    return len(buf) >= 3 and buf[0] == 0x16 and buf[1] == 0x03 and buf[2] <= 0x04


class Session:
    """Decode one connection. Sides are 0 and 1 (the caller's numbering)."""

    __slots__ = ("stream", "endpoints", "from_start", "max_frame", "conn", "client_side",
                 "framers", "held", "held_bytes", "probes", "probe_failed", "probed_request", "pending", "orphans",
                 "sasl_raw", "sasl_mechanism", "ignored", "events")

    def __init__(self, stream: int, endpoints: tuple[Endpoint, Endpoint], *, client_side: int | None = None,
                 from_start: tuple[bool, bool] = (False, False), max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.endpoints = endpoints
        self.from_start = from_start
        self.max_frame = max_frame
        self.conn: Connection | None = None
        self.client_side: int | None = None
        self.framers: list[Framer | None] = [None, None]
        # Before the roles are known: each side's bytes (data, ts, gap size) and a probe looking for requests.
        self.held: list[list[tuple[bytes | None, float, int]]] = [[], []]
        self.held_bytes = [0, 0]
        self.probes: list[Framer | None] = [Framer(self._request_plausible, max_frame, from_start[s], requests=True)
                                                for s in (0, 1)]
        self.probe_failed = [False, False]
        # (stream offset, message) of the request that told the client: decoded already, not decoded again.
        self.probed_request: tuple[int, Message] | None = None
        self.pending: dict[int, MessageEvent] = {}
        # Responses whose request has not been seen (yet): a request stuck behind a hole in the
        # client's stream is delivered after its response. Kafka clients number requests in
        # increasing order, so a later request proves an older orphan's request is not coming.
        self.orphans: dict[int, Frame] = {}
        self.sasl_raw = False
        self.sasl_mechanism: str | None = None
        self.ignored = False      # not Kafka, or TLS: drop everything further
        self.events: list = []
        if client_side is not None:
            self._set_roles(client_side)

    # -- input ------------------------------------------------------------------------------

    def data(self, side: int, data: bytes, ts: float) -> list:
        if self.ignored:
            return []
        if self.client_side is None:
            if not self.held_bytes[side] and self.from_start[side] and is_tls_record(data):
                self._ignore(ts, "tls", "TLS: cannot decode without keys")
                return self._take()
            self.held[side].append((data, ts, 0))
            self.held_bytes[side] += len(data)
            self._identify(side, self.probes[side].feed(data, ts), ts)
        else:
            self._frames(side, self.framers[side].feed(data, ts))
        return self._take()

    def gap(self, side: int, size: int, ts: float) -> list:
        if self.ignored:
            return []
        if self.client_side is None:
            self.held[side].append((None, ts, size))
            self._identify(side, self.probes[side].gap(size, ts), ts)
        else:
            self._frames(side, self.framers[side].gap(size, ts))
        return self._take()

    def end(self, ts: float) -> list:
        """The connection is over (or the capture ended): flush what is left."""
        if self.client_side is None and not self.ignored:
            self._ignore(ts, "not-kafka", "no Kafka request found; connection skipped")
        if self.client_side is not None and not self.ignored:
            for side in (0, 1):
                self._frames(side, self.framers[side].close())
            self._release_orphans(None)
        return self._take()

    def _take(self) -> list:
        out, self.events = self.events, []
        return out

    # -- roles -------------------------------------------------------------------------------

    def _set_roles(self, client_side: int) -> None:
        self.client_side = client_side
        server_side = 1 - client_side
        self.conn = Connection(self.stream, self.endpoints[client_side], self.endpoints[server_side])
        self.framers[client_side] = Framer(self._request_plausible, self.max_frame, self.from_start[client_side],
                                           requests=True)
        self.framers[server_side] = Framer(self._response_plausible, self.max_frame, self.from_start[server_side])
        self.probes = [None, None]

    def _identify(self, side: int, probed: list, ts: float) -> None:
        """The client is the side whose first frame is a complete Kafka request."""
        for item in probed:
            if not isinstance(item, Frame) or self.probe_failed[side]:
                continue
            msg = decode_request(item.payload, skim=True)
            if msg.complete:
                self.probed_request = (item.stream_offset, msg)
                self._set_roles(side)
                self._replay(side)
                return
            if self.from_start[side]:
                self.probe_failed[side] = True  # this side's first frame is not a request
        if all(self.probe_failed) or min(self.held_bytes) > IDENTIFY_LIMIT or \
                max(self.held_bytes) > 4 * IDENTIFY_LIMIT:
            self._ignore(ts, "not-kafka", "no Kafka request found; connection skipped")

    def _replay(self, client_side: int) -> None:
        held, self.held = self.held, [[], []]
        # The client's bytes first: responses are matched against its requests.
        for side in (client_side, 1 - client_side):
            framer = self.framers[side]
            for data, ts, gap in held[side]:
                self._frames(side, framer.feed(data, ts) if data is not None else framer.gap(gap, ts))

    def _ignore(self, ts: float, kind: str, text: str) -> None:
        self.ignored = True
        self.held = [[], []]
        self.probes = [None, None]
        a, b = self.endpoints
        conn = self.conn or Connection(self.stream, a, b)
        conn.tls = kind == "tls"
        if kind == "tls":
            self.events.append(NoticeEvent(conn, None, ts, kind, text))

    # -- plausibility (for resynchronisation) --------------------------------------------------

    def _request_plausible(self, buf, pos: int, end: int, complete: bool):
        verdict = request_header_plausible(buf, pos, end)
        if verdict and complete:
            return decode_request(bytes(buf[pos:end]), skim=True).complete
        return verdict

    def _response_plausible(self, buf, pos: int, end: int, complete: bool):
        if end - pos < 4:
            return None
        request = self.pending.get(_I32.unpack_from(buf, pos)[0])
        if request is None:
            return False
        if not complete:
            return True
        m = request.message
        return decode_response_for_request(bytes(buf[pos:end]), m.api_key, m.api_version, skim=True).complete

    # -- frames -> events -----------------------------------------------------------------------

    def _frames(self, side: int, items: list) -> None:
        direction = CLIENT_TO_SERVER if side == self.client_side else SERVER_TO_CLIENT
        for item in items:
            if isinstance(item, Skipped):
                self.events.append(NoticeEvent(self.conn, direction, item.ts, "skipped", item.reason,
                                               item.stream_offset, item.size))
            elif direction == CLIENT_TO_SERVER:
                self._request(item)
            else:
                self._response(item)

    def _request(self, frame: Frame) -> None:
        if self.sasl_raw:
            if request_header_plausible(frame.payload, 0, len(frame.payload)) and \
                    decode_request(frame.payload, skim=True).complete:
                self._raw_sasl(False)
            else:
                self.events.append(SaslTokenEvent(self.conn, CLIENT_TO_SERVER, frame, self.sasl_mechanism))
                return
        payload = frame.payload
        probed = self.probed_request
        if probed is not None and probed[0] == frame.stream_offset:
            msg = probed[1]
            self.probed_request = None
        else:
            msg = decode_request(payload, skim=True)
        event = MessageEvent(self.conn, CLIENT_TO_SERVER, frame, msg)
        if msg.api_key is not None:
            event.expects_response = quirks.expects_response(msg.api_key, msg.api_version, msg.acks)
            if msg.correlation_id is not None and event.expects_response:
                self.pending[msg.correlation_id] = event
            if msg.api_key == quirks.SASL_HANDSHAKE:
                # The session reads the mechanism itself: later tokens are read by it.
                mech = with_fields(msg, payload).body.child("Mechanism") if msg.body_offset is not None else None
                self.sasl_mechanism = mech.value if mech else None
                msg.header = msg.body = None
            elif msg.api_key == SASL_AUTHENTICATE:
                msg.sasl_mechanism = self.sasl_mechanism
        if self.orphans and msg.correlation_id is not None:
            self._release_orphans(msg.correlation_id)  # older than this request: theirs is not coming
            self.events.append(event)
            late = self.orphans.pop(msg.correlation_id, None)
            if late is not None:
                self._response(late)
        else:
            self.events.append(event)

    def _release_orphans(self, below: int | None) -> None:
        """Decode held responses whose request will not come (all of them when below is None)."""
        for correlation_id in [c for c in self.orphans if below is None or c < below]:
            self._response(self.orphans.pop(correlation_id), orphan=True)

    def _raw_sasl(self, on: bool) -> None:
        self.sasl_raw = on
        for framer in self.framers:
            framer.min_frame = 0 if on else MIN_FRAME

    def _response(self, frame: Frame, orphan: bool = False) -> None:
        payload = frame.payload
        if self.sasl_raw:
            self.events.append(SaslTokenEvent(self.conn, SERVER_TO_CLIENT, frame, self.sasl_mechanism))
            return
        correlation_id = _I32.unpack_from(payload, 0)[0] if len(payload) >= 4 else None
        request = self.pending.pop(correlation_id, None)
        if request is None and not orphan and correlation_id is not None:
            self.orphans[correlation_id] = frame
            if len(self.orphans) > MAX_ORPHANS:
                self._release_orphans(min(self.orphans) + 1)
            return
        if request is not None:
            req = request.message
            msg = decode_response_for_request(payload, req.api_key, req.api_version, skim=True)
            event = MessageEvent(self.conn, SERVER_TO_CLIENT, frame, msg)
            event.request = request
            event.latency_ms = (frame.ts - request.ts) * 1000.0
            if quirks.starts_raw_sasl(req.api_key, req.api_version) and msg.complete:
                self._raw_sasl(not msg.errors)  # its ErrorCode is 0
        else:
            fits = infer_response(payload)
            if fits:
                msg = fits[0]
            else:
                msg = Message("response", None, None, 0, len(payload))
                msg.correlation_id = correlation_id
                msg.malformed = Malformed(0, "request not captured, and no response schema fits these bytes")
            event = MessageEvent(self.conn, SERVER_TO_CLIENT, frame, msg)
            event.inferred = bool(fits)
        if msg.api_key == SASL_AUTHENTICATE:
            msg.sasl_mechanism = self.sasl_mechanism
        self.events.append(event)

