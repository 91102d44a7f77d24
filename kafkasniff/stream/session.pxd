"""The session's C-level interface: its events, for the views to read without Python lookups, and the
session, for the analyzer to call."""

from kafkasniff.protocol.messages cimport Message
from kafkasniff.stream.framing cimport Framer, int32_at


cdef class KafkaConnection:
    cdef public object stream, client, server
    cdef public object tls  # TLS connections: {"version", "cipher"}; else None


cdef class MessageEvent:
    cdef public KafkaConnection conn
    cdef public str direction
    cdef public object ts, first_ts  # capture times of the frame's last and first bytes
    cdef public object stream_offset
    cdef public bytes payload  # the frame after its size prefix: the buffer message offsets point into
    cdef public Message message
    cdef public MessageEvent request  # a response's, when captured
    cdef public object latency_ms  # a response's, when its request was captured
    cdef public bint inferred, expects_response
    cdef public object screened  # an inferred response's: the readings that fit its bytes (identify.Screened)
    cdef object analysed  # a request's: what the analyses read of it (analyses.wire), kept for its response


cdef class SaslTokenEvent:
    cdef public KafkaConnection conn
    cdef public str direction
    cdef public object ts, stream_offset
    cdef public bytes token
    cdef public str mechanism
    cdef public list fields


cdef class NoticeEvent:
    cdef public KafkaConnection conn
    cdef public str direction, kind, text
    cdef public object ts, stream_offset, size


cdef class Session:
    cdef object stream
    cdef tuple endpoints, from_start
    cdef object handshake_client, port_hint_client  # a side, or None
    cdef long long max_frame
    cdef KafkaConnection conn
    cdef int client_side  # NO_SIDE until known
    cdef list framers
    # Before the roles are known: each side's bytes (data, ts, gap size), and a probe looking for
    # requests on each side that may be the client.
    cdef list held, held_bytes, probes
    # (stream offset, message) of the request that told the client: decoded already, not decoded again.
    cdef tuple probed_request
    cdef public dict pending  # requests waiting for their response, by correlation id, oldest first
    cdef long long pending_bytes  # their payloads' bytes
    cdef long long given_up  # requests given up waiting (see MAX_PENDING), not yet reported
    cdef list given_up_named  # the first of them as the notice names them (NAMED_UNANSWERED)
    # Requests that expect no response (acks=0), by correlation id: some brokers answer them anyway.
    cdef public dict unanswered
    # Distinct (API key, version)s of the requests sent on the connection (see MAX_REQUEST_KINDS): a frozenset,
    # replaced when one is added.
    cdef frozenset requests_sent
    # Responses whose request has not been seen (yet): a request stuck behind a hole in the
    # client's stream is delivered after its response. Kafka clients number requests in
    # increasing order, so a later request proves an older orphan's request is not coming.
    cdef dict orphans
    cdef object latest_request_id  # the correlation id of the latest request seen (None before one)
    cdef bint sasl_raw
    cdef str sasl_mechanism
    cdef str ignored  # why everything is dropped: "tls" or "not-kafka"; None while decoding
    cdef list ignored_bytes  # bytes of each side dropped so, reported when the connection ends
    cdef public tuple just_inferred  # (payload, infer_response's answer) of the frame ResponseFrames just inferred
    cdef list events

    cpdef list data(self, int side, bytes data, double ts)
    cpdef list gap(self, int side, long long size, double ts)
    cpdef list end(self, double ts, str reason)
    cpdef NoticeEvent late(self, int side, long long stream_offset, long long size, double ts)
    cdef list _take(self)
    cdef void _set_roles(self, int client_side)
    cdef void _identify(self, int side, list probed)
    cdef void _identify_within_limits(self, double ts)
    cdef bint _identify_by_cut_request(self) except -1
    cdef tuple _guessed_order(self, bint clients)
    cdef bint _identify_by_responses(self) except -1
    cdef void _replay(self, int client_side)
    cdef void _ignore(self, double ts, str why)
    cdef int _likely_client_side(self)
    cdef KafkaConnection _unidentified_connection(self)
    cdef void _report_ignored(self, double ts)
    cdef void _frames(self, int side, list items)
    cdef void _request(self, frame)
    cdef void _await_response(self, correlation_id, MessageEvent event)
    cdef void _give_up(self, MessageEvent request)
    cdef void _report_unanswered(self, double ts, str reason)
    cdef void _expect_no_response(self, correlation_id, MessageEvent event)
    cdef void _remember_sent(self, Message msg)
    cdef tuple _infer(self, bytes payload)
    cdef void _release_orphans(self, below)
    cdef void _raw_sasl(self, bint on)
    cdef void _response(self, frame, bint orphan)
