"""One TCP connection's Kafka conversation: who is the client, frames, decoding, pairing.

Sans-I/O. The caller hands over each side's bytes in stream order (`data`),
holes (`gap`) and ends (`end`); the session returns events:

- `MessageEvent`: a decoded request or response (responses carry their request
  and latency, or `inferred=True` when the request was not captured, with the
  other readings that fit its bytes in `screened`);
- `SaslTokenEvent`: a raw SASL token exchanged after SaslHandshake v0;
- `NoticeEvent`: bytes not shown as messages (skipped, missing from the capture,
  TLS, not Kafka), so that every byte captured is accounted for.

Hints yield to evidence. A connection is decoded once its bytes prove it is
Kafka: a side's frame that decodes as a request makes that side the client; a
connection without a request (a capture starting mid-way, one holding only a
response) is Kafka when one side's frames decode as responses, and that side is
the broker; one that ends inside its first request (that side captured from its
start) is Kafka when the bytes are the start of a request (identify.cut_request). A captured TCP handshake decides which side is the client; a port
hint only orders the guesses where the bytes fit either way.
"""

import struct
from itertools import islice

from kafkasniff.protocol import sasl
from kafkasniff.protocol.embedded import SASL_AUTHENTICATE
from kafkasniff.protocol.fields import Malformed
from kafkasniff.protocol.identify import cut_request, infer_response
from kafkasniff.protocol.messages import decode_request, decode_response_for_request, with_fields

from kafkasniff.protocol.messages cimport skim_request, skim_response
from kafkasniff.protocol.quirks cimport _CONTROLLED_SHUTDOWN, _SASL_HANDSHAKE, expects_response, starts_raw_sasl
from kafkasniff.protocol.schema import apis, message_variant
from kafkasniff.stream.framing import DEFAULT_MAX_FRAME, MIN_FRAME, Frame, Skipped
from kafkasniff.stream.framing cimport Plausibility, int16_at, int32_at
from kafkasniff.stream.tcp import (END_CAPTURE, END_CROWDED, END_FIN, END_IDLE, END_PORT_REUSED, END_RST,
                                   Endpoint)
from kafkasniff.stream.tlsrecord import starts_tls

CLIENT_TO_SERVER, SERVER_TO_CLIENT = "c2s", "s2c"
# How much of an unidentified connection we look at before deciding it is not Kafka.
# A capture may start inside a large message (1 MiB Produce is common): look that far for a request.
IDENTIFY_LIMIT = 4 * 1024 * 1024
MAX_ORPHANS = 64
# Requests waiting for their response, per connection: beyond these, the oldest are given up (and counted in one
# `unanswered` notice when the connection ends), so that a stream of requests never answered keeps bounded
# memory. Clients keep requests in flight (the Java client 5; librdkafka up to max.in.flight, 1,000,000 by
# default: a confluent-kafka producer with linger.ms=0 was seen with 1,267 Produce requests waiting on one
# connection), and a broker answers within the request's timeout (30 s by default; a JoinGroup may wait a
# rebalance, 5 min).
MAX_PENDING = 16_384
MAX_PENDING_BYTES = 64 * 1024 * 1024
PENDING_SECONDS = 900.0
# Requests an `unanswered` notice names (the oldest first) before it only counts the rest: enough to find them.
NAMED_UNANSWERED = 5
# What ended while requests were without a response, by the end's reason (tcp.END_*): the capture ending while the
# connection was open is expected of a long poll (a Fetch waiting for records), the connection's own end is not.
_ENDED = {END_FIN: "when the connection ended", END_RST: "when the connection ended",
          END_PORT_REUSED: "when the connection ended", END_CAPTURE: "when the capture ended",
          END_IDLE: "when the connection was given up as idle",
          END_CROWDED: "when the connection was crowded out"}  # (one that carried no byte: it has none)
INFERENCE_BUDGET = 64  # see ResponseFrames
# Distinct (API key, version)s of requests remembered per connection (Session.requests_sent), to infer a response
# whose request was lost: a client sends a few dozen kinds at most (one version per API once it has negotiated), so
# the first 64 hold them all, while bytes naming every kind Kafka defines cannot grow the set, part of the ranking's
# cache key, past 64.
MAX_REQUEST_KINDS = 64
_I32 = struct.Struct(">i")


def endpoint_text(endpoint: Endpoint) -> str:
    ip, port = endpoint
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


cdef class KafkaConnection:
    """A connection as Kafka sees it: which side is the client, which the broker."""

    def __init__(self, stream: int, client: Endpoint, server: Endpoint):
        self.stream = stream
        self.client = client
        self.server = server
        self.tls = None


cdef class MessageEvent:
    """A decoded request or response (a response carries its request and latency, or is inferred)."""

    def __init__(self, KafkaConnection conn, str direction, frame: Frame, message: Message):
        _fill(self, conn, direction, <tuple?>frame, message)

    @property
    def src(self) -> Endpoint:
        return self.conn.client if self.direction == CLIENT_TO_SERVER else self.conn.server

    @property
    def dst(self) -> Endpoint:
        return self.conn.server if self.direction == CLIENT_TO_SERVER else self.conn.client


cdef inline MessageEvent _fill(MessageEvent event, KafkaConnection conn, str direction, tuple frame, Message message):
    event.conn = conn
    event.direction = direction
    event.payload, event.stream_offset, event.ts, event.first_ts = frame  # a Frame
    event.message = message
    event.expects_response = True
    return event


cdef inline MessageEvent _message_event(KafkaConnection conn, str direction, tuple frame, Message message):
    """MessageEvent(...) without a Python call: one per message."""
    return _fill(MessageEvent.__new__(MessageEvent), conn, direction, frame, message)


cdef class SaslTokenEvent:
    """A raw SASL token, exchanged after SaslHandshake v0 without a Kafka header."""

    def __init__(self, KafkaConnection conn, str direction, frame: Frame, mechanism: str | None):
        self.conn = conn
        self.direction = direction
        self.ts = frame.ts
        self.stream_offset = frame.stream_offset
        self.token = frame.payload
        self.mechanism = mechanism
        self.fields = sasl.parse_token(mechanism, frame.payload, direction == CLIENT_TO_SERVER)


# What a notice of kind "tls" says, in its text, of bytes it could not decrypt (and only of those): `lag` and
# `groups` count the connections they miss by it.
NOT_DECODED = "not decoded"


cdef class NoticeEvent:
    """Bytes not shown as messages (skipped, missing from the capture, TLS, not Kafka), said once."""

    def __init__(self, KafkaConnection conn, str direction, ts: float, str kind, str text,
                 stream_offset: int = 0, size: int = 0):
        self.conn = conn
        self.direction = direction
        self.ts = ts
        self.kind = kind
        self.text = text
        self.stream_offset = stream_offset
        self.size = size


cpdef object request_header_plausible(buf, Py_ssize_t pos, Py_ssize_t end):
    """Cheap check that a Kafka request header starts at buf[pos] (bytes or a bytearray): True, False, or None
    when buf[pos:end] is too little to tell."""
    cdef const unsigned char* p = buf
    cdef int key, version, client_id_length
    if end - pos < 10 or pos < 0 or end > len(buf):
        return None
    key, version = int16_at(p + pos), int16_at(p + pos + 2)
    if int32_at(p + pos + 4) < 0:
        return False
    shutdown_v0 = key == _CONTROLLED_SHUTDOWN and version == 0  # no client id
    client_id_length = int16_at(p + pos + 8)
    if not shutdown_v0 and not -1 <= client_id_length <= 4096:
        return False
    return key in apis() and message_variant(key, "request", version) is not None


cdef class RequestFrames(Plausibility):
    """What a request frame looks like, for resynchronising the client's direction."""

    def __init__(self):
        Plausibility.__init__(self, 10, 4)  # API key, version, correlation id, client id length; the id's place

    cpdef object header(self, buf, Py_ssize_t pos, Py_ssize_t end):
        return request_header_plausible(buf, pos, end)

    cpdef bint frame(self, buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        return decode_request(bytes(buf[pos:end]), skim=True).complete


cdef RequestFrames _REQUEST_FRAMES = RequestFrames()  # it keeps nothing: every framer of requests shares it


cdef class ResponseFrames(Plausibility):
    """What a response frame looks like, for resynchronising the broker's direction: its correlation id
    fits the requests seen, and it decodes as the response to its request (or, when that request was not
    captured, as some response).

    Trying every response schema costs milliseconds; cheap checks spare real captures from all but the
    frames that fit, so a direction may spend only INFERENCE_BUDGET tries on candidates that do not
    (bytes crafted to pass the cheap checks), then it finds only responses to requests it saw."""

    cdef Session session
    cdef int inference_budget
    cdef object oldest  # min(session.pending) for the search under way, worked out when first needed

    def __init__(self, Session session):
        Plausibility.__init__(self, 4, 0)  # the correlation id
        self.session = session
        self.inference_budget = INFERENCE_BUDGET

    cpdef new_search(self):
        self.oldest = None  # the requests waiting may have changed since the last search

    cpdef object header(self, buf, Py_ssize_t pos, Py_ssize_t end):
        """Whether the correlation id fits the requests seen. Brokers answer in order, so a response whose
        request was not captured is older than every request still waiting."""
        cdef const unsigned char* p = buf
        if end - pos < 4 or pos < 0 or end > len(buf):
            return None
        correlation_id = int32_at(p + pos)
        pending = self.session.pending
        if correlation_id in pending or correlation_id in self.session.unanswered:
            return True
        if correlation_id < 0:
            return False
        if not pending:
            return True
        if self.oldest is None:  # once a search, not once a candidate: up to MAX_PENDING requests wait
            self.oldest = min(pending)
        return correlation_id < self.oldest

    cpdef bint frame(self, buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        payload = bytes(buf[pos:end])
        request = self.session.request_answered_by(_I32.unpack_from(payload, 0)[0])
        if request is None:
            if not self.inference_budget:
                return False
            reading, screened = inferred = self.session._infer(payload)
            if reading is not None and reading.api_key in NOT_INFERRED_IN_A_SEARCH and \
                    not _has_sent(self.session, reading.api_key):
                reading = None  # refused: it counts against the budget as a reading that does not fit
            if reading is None:
                self.inference_budget -= 1
                return False
            self.session.just_inferred = (payload, inferred)  # the frame is decoded next: its reading is known
            return True
        m = request.message
        return decode_response_for_request(payload, m.api_key, m.api_version, skim=True).malformed is None


# Responses a search for a frame boundary does not infer unless the connection was seen sending their requests. The
# SASL exchange opens a connection (and re-authenticates it): its responses follow requests that were captured, while
# their loose layouts (an error code, a string or a list of them, bytes) fit the tail of many another message, where
# a length-prefixed last field claims the bytes to the message's end (a consumer's assignment ending a SyncGroup
# response reads as SaslAuthenticate v0).
NOT_INFERRED_IN_A_SEARCH = frozenset({_SASL_HANDSHAKE, SASL_AUTHENTICATE})


cdef str _request_name(Message msg):
    """A request as an `unanswered` notice names it, as the one-line view shows it: API, version, correlation id."""
    return f"{msg.api_name} v{msg.api_version} corr={msg.correlation_id}"


cdef str _requests(long long count):
    return f"{count:,} request{'s' if count != 1 else ''}"


cdef str _named(long long count, list named):
    """`A, B and M more`: the first of `count` requests by name, then how many more."""
    more = f" and {count - len(named):,} more" if count > len(named) else ""
    return ", ".join(named) + more


cdef bint _has_sent(Session session, api_key):
    """Whether the connection was seen sending a request of this API (any version)."""
    for kind in session.requests_sent:
        if (<tuple>kind)[0] == api_key:
            return True
    return False


cdef int NO_SIDE = -1


cdef class Session:
    """Decode one connection. Sides are 0 and 1 (the caller's numbering)."""

    def __init__(self, stream: int, tuple endpoints, *, client_side: int | None = None,
                 handshake_client: int | None = None, port_hint_client: int | None = None,
                 tuple from_start=(False, False), long long max_frame=DEFAULT_MAX_FRAME):
        """client_side: the roles are known, decode at once; handshake_client: the side that sent the
        captured SYN; port_hint_client: the side a broker port hint makes the client."""
        self.stream = stream
        self.endpoints = endpoints
        self.from_start = from_start
        self.handshake_client = handshake_client
        self.port_hint_client = port_hint_client
        self.max_frame = max_frame
        self.conn = None
        self.client_side = NO_SIDE
        self.framers = [None, None]
        self.held = [[], []]
        self.held_bytes = [0, 0]
        self.probes = [
            Framer(_REQUEST_FRAMES, max_frame, from_start[s], requests=True)
            if handshake_client is None or handshake_client == s else None for s in (0, 1)]
        self.probed_request = None
        self.pending = {}
        self.pending_bytes = 0
        self.given_up = 0
        self.given_up_named = []
        self.unanswered = {}
        self.requests_sent = frozenset()
        self.orphans = {}
        self.latest_request_id = None
        self.sasl_raw = False
        self.sasl_mechanism = None
        self.ignored = None
        self.ignored_bytes = [0, 0]
        self.just_inferred = None
        self.events = []
        if client_side is not None:
            self._set_roles(client_side)

    # -- input ------------------------------------------------------------------------------

    cpdef list data(self, int side, bytes data, double ts):
        cdef Framer framer
        if self.ignored is not None:
            self.ignored_bytes[side] += len(data)
        elif self.client_side != NO_SIDE:
            framer = self.framers[side]
            self._frames(side, framer.feed(data, ts))
        else:
            first = not self.held_bytes[side]
            self.held[side].append((data, ts, 0))
            self.held_bytes[side] += len(data)
            if first and starts_tls(data, self.from_start[side]):
                self._ignore(ts, "tls")
                # The analyzer decrypts TLS found in a connection's first bytes; this one showed it later.
                self.events.append(NoticeEvent(self.conn, None, ts, "tls",
                                               f"TLS: {NOT_DECODED}: the connection's first bytes captured "
                                               "were not at a TLS record"))
                return self._take()
            probe = self.probes[side]
            if probe is not None:
                self._identify(side, probe.feed(data, ts))
            if self.client_side == NO_SIDE:
                self._identify_within_limits(ts)
        return self._take()

    cpdef list gap(self, int side, long long size, double ts):
        cdef Framer framer
        if self.ignored is not None:
            return []
        if self.client_side == NO_SIDE:
            self.held[side].append((None, ts, size))
            probe = self.probes[side]
            if probe is not None:
                self._identify(side, probe.gap(size, ts))
        else:
            framer = self.framers[side]
            self._frames(side, framer.gap(size, ts))
        return self._take()

    cpdef list end(self, double ts, str reason):
        """The connection is over (or the capture ended): flush what is left. reason: why (tcp.END_*)."""
        cdef Framer framer
        cdef int side
        if self.ignored is None and self.client_side == NO_SIDE:
            # Last chances: a request proven by the end of its stream, then responses.
            for side in range(2):
                probe = self.probes[side]
                if probe is not None and self.client_side == NO_SIDE:
                    self._identify(side, probe.close())
            if self.client_side == NO_SIDE and not self._identify_by_cut_request() and \
                    not self._identify_by_responses():
                self._ignore(ts, "not-kafka")
        if self.ignored is not None:
            self._report_ignored(ts)
        else:
            for side in range(2):
                framer = self.framers[side]
                self._frames(side, framer.close())
            self._release_orphans(None)
            self._report_unanswered(ts, reason)
        # The broker side's framer refers back to this session (ResponseFrames): without it, reference counting
        # frees an ended connection at once, instead of the cycle collector in passes that grow with the
        # connections ended since the last (0.5 s, in a live capture of 100,000 packets/s).
        self.framers = [None, None]
        return self._take()

    cpdef NoticeEvent late(self, int side, long long stream_offset, long long size, double ts):
        """Bytes of `side` beyond where its stream ended, captured after the connection ended: not decoded."""
        cdef int client = self.client_side if self.client_side != NO_SIDE else self._likely_client_side()
        return NoticeEvent(self.conn, CLIENT_TO_SERVER if side == client else SERVER_TO_CLIENT, ts, "late",
                           "bytes beyond the end of the stream, captured after it ended: not decoded",
                           stream_offset, size)

    cdef list _take(self):
        out = self.events
        self.events = []
        return out

    # -- roles -------------------------------------------------------------------------------

    cdef void _set_roles(self, int client_side):
        self.client_side = client_side
        cdef int server_side = 1 - client_side
        self.conn = KafkaConnection(self.stream, self.endpoints[client_side], self.endpoints[server_side])
        self.framers[client_side] = Framer(_REQUEST_FRAMES, self.max_frame, self.from_start[client_side],
                                           requests=True)
        self.framers[server_side] = Framer(ResponseFrames(self), self.max_frame, self.from_start[server_side])
        self.probes = [None, None]

    cdef void _identify(self, int side, list probed):
        """The client is the side whose first frame is a Kafka request (trailing bytes allowed)."""
        for item in probed:
            if not isinstance(item, Frame):
                continue
            msg = decode_request(item.payload, skim=True)
            if msg.malformed is None:
                self.probed_request = (item.stream_offset, msg)
                self._set_roles(side)
                self._replay(side)
                return
            if self.from_start[side]:
                self.probes[side] = None  # this side's first frame is not a request: not the client
                return

    cdef void _identify_within_limits(self, double ts):
        """When requests can no longer tell (no side may be the client any more, or too many bytes
        without one), responses decide, or the connection is not Kafka."""
        held = self.held_bytes
        if any(self.probes) and min(held) <= IDENTIFY_LIMIT and max(held) <= 4 * IDENTIFY_LIMIT:
            return
        if not self._identify_by_responses():
            self._ignore(ts, "not-kafka")

    cdef bint _identify_by_cut_request(self) except -1:
        """The client is a side captured from its start whose bytes end inside its first frame, a request by its
        header (identify.cut_request): the capture ended before a frame could prove it. True if found."""
        for side in self._guessed_order(True):
            if self.probes[side] is None or not self.from_start[side] or not self.held_bytes[side]:
                continue
            held = self.held[side]
            if any(data is None for data, _, _ in held):
                continue  # a hole: the bytes are not one run from the frame's start
            data = b"".join(data for data, _, _ in held)
            if cut_request(data) and int32_at(data) <= self.max_frame:
                self._set_roles(side)
                self._replay(side)
                return True
        return False

    cdef tuple _guessed_order(self, bint clients):
        """The sides in the order the handshake, then the port hint, make likely clients (or brokers)."""
        if self.handshake_client is not None:
            client = self.handshake_client
            return (client,) if clients else (1 - client,)
        if self.port_hint_client is not None:
            client = self.port_hint_client
            return (client, 1 - client) if clients else (1 - client, client)
        return (0, 1)

    cdef bint _identify_by_responses(self) except -1:
        """The broker is a side whose bytes frame as responses (requests not captured). True if found."""
        cdef Framer framer
        for server_side in self._guessed_order(False):
            if not self.held_bytes[server_side]:
                continue
            framer = Framer(ResponseFrames(self), self.max_frame, self.from_start[server_side])
            framed = []
            for data, ts, gap in self.held[server_side]:
                framed += framer.feed(data, ts) if data is not None else framer.gap(gap, ts)
            framed += framer.close()
            first = next((item for item in framed if isinstance(item, Frame)), None)
            # Frames found by resynchronising fit a response already; a side captured from its
            # start is framed without looking.
            if first is not None and (not self.from_start[server_side] or infer_response(first.payload)[0] is not None):
                self._set_roles(1 - server_side)
                self._replay(1 - server_side)
                return True
        return False

    cdef void _replay(self, int client_side):
        cdef Framer framer
        held, self.held = self.held, [[], []]
        # The client's bytes first: responses are matched against its requests.
        for side in (client_side, 1 - client_side):
            framer = self.framers[side]
            for data, ts, gap in held[side]:
                self._frames(side, framer.feed(data, ts) if data is not None else framer.gap(gap, ts))

    cdef void _ignore(self, double ts, str why):
        """Not decoded from here on: the bytes held are counted, and reported when the connection ends."""
        self.ignored = why
        self.ignored_bytes = [sum(len(data) for data, _, _ in held if data is not None) for held in self.held]
        self.held = [[], []]
        self.probes = [None, None]
        self.conn = self._unidentified_connection()

    cdef int _likely_client_side(self):
        """Before the bytes tell: the handshake's client, the port hint's, or the caller's first side."""
        return self.handshake_client if self.handshake_client is not None else self.port_hint_client or 0

    cdef KafkaConnection _unidentified_connection(self):
        cdef int client = self._likely_client_side()
        return KafkaConnection(self.stream, self.endpoints[client], self.endpoints[1 - client])

    cdef void _report_ignored(self, double ts):
        """Each side's bytes that were not decoded, so that every byte captured shows up."""
        text = (f"TLS: encrypted bytes, {NOT_DECODED}" if self.ignored == "tls" else
                "not Kafka: no Kafka request or response found; not decoded")
        cdef int client = self._likely_client_side()
        for side in (client, 1 - client):
            if self.ignored_bytes[side]:
                direction = CLIENT_TO_SERVER if side == client else SERVER_TO_CLIENT
                self.events.append(NoticeEvent(self.conn, direction, ts, self.ignored, text, 0,
                                               self.ignored_bytes[side]))

    # -- what the broker's frames may be (for resynchronising) ---------------------------------

    def request_answered_by(self, correlation_id: int) -> MessageEvent | None:
        return self.pending.get(correlation_id) or self.unanswered.get(correlation_id)

    # -- frames -> events -----------------------------------------------------------------------

    cdef void _frames(self, int side, list items):
        cdef str direction = CLIENT_TO_SERVER if side == self.client_side else SERVER_TO_CLIENT
        for item in items:
            if type(item) is Skipped:
                self.events.append(NoticeEvent(self.conn, direction, item.ts,
                                               "skipped" if item.captured else "missing", item.reason,
                                               item.stream_offset, item.size))
            elif direction is CLIENT_TO_SERVER:
                self._request(item)
            else:
                self._response(item, False)

    cdef void _request(self, frame):
        cdef bytes payload = (<tuple>frame)[0]  # a Frame: (payload, stream offset, ts, first ts)
        cdef Message msg
        if self.sasl_raw:
            if request_header_plausible(payload, 0, len(payload)) and \
                    decode_request(payload, skim=True).complete:
                self._raw_sasl(False)
            else:
                self.events.append(SaslTokenEvent(self.conn, CLIENT_TO_SERVER, frame, self.sasl_mechanism))
                return
        probed = self.probed_request
        if probed is not None and probed[0] == (<tuple>frame)[1]:
            msg = probed[1]
            self.probed_request = None
        else:
            msg = skim_request(payload)
        cdef MessageEvent event = _message_event(self.conn, CLIENT_TO_SERVER, <tuple>frame, msg)
        correlation_id = msg.correlation_id
        if msg.api_key is not None:
            self._remember_sent(msg)
            event.expects_response = expects_response(msg.api_key, msg.api_version, msg.acks)
            if correlation_id is not None:
                if event.expects_response:
                    self._await_response(correlation_id, event)
                else:
                    self._expect_no_response(correlation_id, event)
            if msg.api_key == _SASL_HANDSHAKE:
                # The session reads the mechanism itself: later tokens are read by it.
                mech = with_fields(msg, payload).body.child("Mechanism") if msg.body_offset is not None else None
                self.sasl_mechanism = mech.value if mech else None
                msg.header = msg.body = None
            elif msg.api_key == SASL_AUTHENTICATE:
                msg.sasl_mechanism = self.sasl_mechanism
        if correlation_id is not None:
            self.latest_request_id = correlation_id
        if self.orphans and correlation_id is not None:
            self._release_orphans(correlation_id)  # older than this request: theirs is not coming
            self.events.append(event)
            late = self.orphans.pop(correlation_id, None)
            if late is not None:
                self._response(late, False)
        else:
            self.events.append(event)

    cdef void _await_response(self, correlation_id, MessageEvent event):
        """Keep the request until its response comes, giving up the oldest ones past the limits."""
        cdef MessageEvent oldest
        replaced = self.pending.pop(correlation_id, None)  # a correlation id used again: the response pairs with the later
        if replaced is not None:
            self.pending_bytes -= len(replaced.payload)
        self.pending[correlation_id] = event
        self.pending_bytes += len(event.payload)
        while len(self.pending) > MAX_PENDING or (self.pending_bytes > MAX_PENDING_BYTES and len(self.pending) > 1):
            self._give_up(self.pending.pop(next(iter(self.pending))))
        while len(self.pending) > 1:
            oldest = self.pending[next(iter(self.pending))]
            if event.ts - oldest.ts <= PENDING_SECONDS:
                break
            self._give_up(self.pending.pop(oldest.message.correlation_id))

    cdef void _give_up(self, MessageEvent request):
        self.pending_bytes -= len(request.payload)
        self.given_up += 1
        if len(self.given_up_named) < NAMED_UNANSWERED:
            self.given_up_named.append(_request_name(request.message))

    cdef void _report_unanswered(self, double ts, str reason):
        """One notice for the requests the connection leaves without a response: those given up waiting, and those
        waiting at its end (requests that expect none are not waiting). Those are said to be without a response, not
        waiting for one: a response lost in a hole, or cut short, leaves its request waiting too."""
        parts = []
        if self.given_up:
            parts.append(
                f"{_requests(self.given_up)} given up waiting for a response (more than {MAX_PENDING:,} requests or "
                f"{MAX_PENDING_BYTES >> 20} MiB waiting, or {PENDING_SECONDS:.0f} s of capture time without one): "
                f"{_named(self.given_up, self.given_up_named)}; a response that comes later is shown as one whose "
                f"request was not captured")
        if self.pending:
            named = [_request_name((<MessageEvent>e).message) for e in islice(self.pending.values(), NAMED_UNANSWERED)]
            parts.append(f"{_requests(len(self.pending))} without a response {_ENDED[reason]}: "
                         f"{_named(len(self.pending), named)}")
        if parts:
            self.events.append(NoticeEvent(self.conn, CLIENT_TO_SERVER, ts, "unanswered", "; ".join(parts)))
        self.given_up, self.given_up_named = 0, []
        self.pending, self.pending_bytes = {}, 0  # said: an ended session kept (for late bytes) holds none of them

    cdef void _expect_no_response(self, correlation_id, MessageEvent event):
        """Remember the latest requests that expect no response, in case the broker answers all the same."""
        self.unanswered[correlation_id] = event
        if len(self.unanswered) > MAX_ORPHANS:
            del self.unanswered[next(iter(self.unanswered))]

    cdef void _remember_sent(self, Message msg):
        """Remember the request's API and version among those sent on the connection (the first
        MAX_REQUEST_KINDS that Kafka defines): each stays likely for a response whose request was lost."""
        kind = (msg.api_key, msg.api_version)
        if kind not in self.requests_sent and len(self.requests_sent) < MAX_REQUEST_KINDS and \
                message_variant(msg.api_key, "request", msg.api_version) is not None:
            # A new frozenset (part of the ranking's cache key) only for a kind not seen yet: a few times a connection.
            self.requests_sent = self.requests_sent | {kind}

    def requests_at_hand(self) -> frozenset[tuple[int, int]]:
        """(API key, version) of the latest requests at hand (MAX_ORPHANS of each kind, so that the work stays
        small with many waiting): what a response whose request is missing likely answers."""
        return frozenset((e.message.api_key, e.message.api_version) for requests in (self.pending, self.unanswered)
                         for e in islice(reversed(requests.values()), MAX_ORPHANS))

    cdef tuple _infer(self, bytes payload):
        """infer_response on a response whose request is not at hand, given what the connection's requests say."""
        return infer_response(payload, at_hand=self.requests_at_hand(), sent=self.requests_sent)

    cdef void _release_orphans(self, below):
        """Decode held responses whose request will not come (all of them when below is None)."""
        for correlation_id in [c for c in self.orphans if below is None or c < below]:
            self._response(self.orphans.pop(correlation_id), True)

    cdef void _raw_sasl(self, bint on):
        cdef Framer framer
        self.sasl_raw = on
        for framer in self.framers:
            framer.min_frame = 0 if on else MIN_FRAME

    cdef void _response(self, frame, bint orphan):
        cdef bytes payload = (<tuple>frame)[0]  # a Frame
        cdef MessageEvent event, request
        cdef Message msg, req
        if self.sasl_raw:
            self.events.append(SaslTokenEvent(self.conn, SERVER_TO_CLIENT, frame, self.sasl_mechanism))
            return
        correlation_id = int32_at(payload) if len(payload) >= 4 else None
        request = self.pending.pop(correlation_id, None)
        if request is not None:
            self.pending_bytes -= len(request.payload)
        if self.unanswered:
            if request is None:
                request = self.unanswered.pop(correlation_id, None)
            if request is not None:
                # Answers come in order: older requests that expect no response will not get one.
                for older in [c for c in self.unanswered if c < correlation_id]:
                    del self.unanswered[older]
        if request is None and not orphan and correlation_id is not None and \
                (self.latest_request_id is None or correlation_id > self.latest_request_id):
            # Its request may still come (from behind a hole): hold it until a later request shows up. One older
            # than the latest request seen is not coming (requests come in order, and a hole before that one was
            # given up or filled): decoded at once, in its place, not at the connection's end.
            self.orphans[correlation_id] = frame
            if len(self.orphans) > MAX_ORPHANS:
                self._release_orphans(min(self.orphans) + 1)
            return
        if request is not None:
            req = request.message
            msg = skim_response(payload, req.api_key, req.api_version)
            event = _message_event(self.conn, SERVER_TO_CLIENT, <tuple>frame, msg)
            event.request = request
            event.latency_ms = (<double>(<tuple>frame)[2] - <double>request.ts) * 1000.0
            if starts_raw_sasl(req.api_key, req.api_version) and msg.complete:
                self._raw_sasl(not msg.errors)  # its ErrorCode is 0
        else:
            known, self.just_inferred = self.just_inferred, None
            reading, screened = known[1] if known is not None and known[0] == payload else self._infer(payload)
            if reading is not None:
                msg = reading
            else:
                msg = Message("response", None, None, 0, len(payload))
                msg.correlation_id = correlation_id
                msg.malformed = Malformed(0, f"request not captured, and {screened.nothing_fits()}")
            event = _message_event(self.conn, SERVER_TO_CLIENT, <tuple>frame, msg)
            event.inferred = reading is not None
            if event.inferred:
                event.screened = screened
        if msg.api_key == SASL_AUTHENTICATE:
            msg.sasl_mechanism = self.sasl_mechanism
        self.events.append(event)
