"""Kafka's exceptions to its own schema rules, each in one named function.

Everything else about the wire format follows from the schema table. The one
exception that the table itself records is ClientId: the RequestHeader schema
gives that field `flexibleVersions: none`, so it keeps its int16 length prefix
even in the flexible header v2 (old brokers must read any ApiVersions request).
"""

from __future__ import annotations

API_VERSIONS = 18
CONTROLLED_SHUTDOWN = 7
PRODUCE = 0
SASL_HANDSHAKE = 17


def request_header_version(api_key: int, api_version: int, body_flexible: bool) -> int:
    # ControlledShutdown v0 predates the client id: its requests use header v0.
    if api_key == CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    return 2 if body_flexible else 1


def response_header_version(api_key: int, api_version: int, body_flexible: bool) -> int:
    # A client reads the ApiVersions response before it knows what the broker
    # supports, so that response header never carries tagged fields.
    if api_key == API_VERSIONS:
        return 0
    return 1 if body_flexible else 0


def response_version_fallbacks(api_key: int, api_version: int) -> tuple[int, ...]:
    """Versions to try, in order, when decoding a response to a request of this version.

    A broker that does not support the requested ApiVersions version answers with
    an ApiVersions v0 body (error UNSUPPORTED_VERSION plus its ranges).
    """
    if api_key == API_VERSIONS and api_version > 0:
        return (api_version, 0)
    return (api_version,)


def expects_response(api_key: int, api_version: int, acks: int | None) -> bool:
    """Produce with acks=0 is fire-and-forget: the broker sends nothing back."""
    return not (api_key == PRODUCE and acks == 0)


def starts_raw_sasl(api_key: int, api_version: int) -> bool:
    """After SaslHandshake v0 the client sends bare SASL tokens (size-prefixed, no Kafka header).

    From v1 the tokens travel inside SaslAuthenticate requests instead.
    """
    return api_key == SASL_HANDSHAKE and api_version == 0
