"""The decoded message's C-level interface, for the stream layer and the views to read without Python lookups."""


cdef class Message:
    cdef public str kind, api_name
    cdef public object api_key, api_version, header_version
    cdef public object correlation_id
    cdef public str client_id
    cdef public object acks                   # Produce requests: whether a response will come
    cdef public object throttle_time_ms       # responses
    cdef public list errors                   # non-zero error codes, each once, in wire order
    # [topic name or None, topic id or None, data records, [partitions]] per topic the structs name, in order
    cdef public list mentions
    cdef public long long batches             # record batches (or legacy messages) in the body
    cdef public long long records             # data records in them, by their headers
    cdef public long long suspicion           # implausible values: unknown error codes, bad ports, illegal nulls, ...
    cdef public object header, body           # the Field trees, when asked for
    cdef public object body_offset            # where the body starts, when the header was read
    cdef public object malformed
    cdef public object trailing
    cdef public Py_ssize_t offset, end
    cdef public str sasl_mechanism            # SaslAuthenticate: the mechanism its session agreed


# The stream layer's: a frame's payload summarized without its Field trees (decode_request and
# decode_response_for_request with skim=True, without their Python calls).
cdef Message skim_request(bytes payload)
cdef Message skim_response(bytes payload, int api_key, int api_version)
