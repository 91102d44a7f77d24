# cython: language_level=3
"""Kafka's exceptions to its own schema rules, each in one named function.

Everything else about the wire format follows from the schema table. The one
exception that the table itself records is ClientId: the RequestHeader schema
gives that field `flexibleVersions: none`, so it keeps its int16 length prefix
even in the flexible header v2 (old brokers must read any ApiVersions request).

Compiled (quirks.pxd): the stream layer asks some of these for every message.
"""

API_VERSIONS = _API_VERSIONS
CONTROLLED_SHUTDOWN = _CONTROLLED_SHUTDOWN
PRODUCE = _PRODUCE
SASL_HANDSHAKE = _SASL_HANDSHAKE


def request_header_version(api_key: int, api_version: int, body_flexible: bool) -> int:
    # ControlledShutdown v0 predates the client id: its requests use header v0.
    if api_key == _CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    return 2 if body_flexible else 1


def response_header_version(api_key: int, api_version: int, body_flexible: bool) -> int:
    # A client reads the ApiVersions response before it knows what the broker
    # supports, so that response header never carries tagged fields.
    if api_key == _API_VERSIONS:
        return 0
    return 1 if body_flexible else 0


cpdef tuple response_version_fallbacks(int api_key, int api_version):
    """Versions to try, in order, when decoding a response to a request of this version.

    A broker that does not support the requested ApiVersions version answers with
    an ApiVersions v0 body (error UNSUPPORTED_VERSION plus its ranges).
    """
    if api_key == _API_VERSIONS and api_version > 0:
        return (api_version, 0)
    return (api_version,)


cpdef bint expects_response(int api_key, int api_version, acks):
    """Produce with acks=0 is fire-and-forget: the broker sends nothing back."""
    return not (api_key == _PRODUCE and acks is not None and acks == 0)


cpdef bint starts_raw_sasl(int api_key, int api_version):
    """After SaslHandshake v0 the client sends bare SASL tokens (size-prefixed, no Kafka header).

    From v1 the tokens travel inside SaslAuthenticate requests instead.
    """
    return api_key == _SASL_HANDSHAKE and api_version == 0
