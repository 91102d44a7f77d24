"""Kafka's exceptions (quirks.pyx), for the stream layer to ask without Python calls."""

cdef enum:
    _API_VERSIONS = 18
    _CONTROLLED_SHUTDOWN = 7
    _PRODUCE = 0
    _SASL_HANDSHAKE = 17

cpdef tuple response_version_fallbacks(int api_key, int api_version)
cpdef bint expects_response(int api_key, int api_version, acks)
cpdef bint starts_raw_sasl(int api_key, int api_version)
