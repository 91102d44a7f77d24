"""Bytes fields that carry another schema, found by role (program.py): facts about where they are.

Group members exchange opaque bytes whose meaning depends on the group's protocol type. For type
`consumer` they are a ConsumerProtocolSubscription (JoinGroup metadata) or ConsumerProtocolAssignment
(SyncGroup assignment): an int16 version followed by that schema at that version. Older JoinGroup and
SyncGroup versions do not say the protocol type; there the bytes are read as the consumer schema only if
it consumes them exactly. Where the type is `consumer`, bytes left over after the schema are a newer
version's fields, but bytes the schema cannot read (cut short, a count too big) are shown as bytes, not as
a partial struct (the walker decides: json.c, fields.c, text.c). SaslAuthenticate's AuthBytes hold a SASL
token (sasl.py reads it).
"""

from __future__ import annotations

JOIN_GROUP, SYNC_GROUP, SASL_AUTHENTICATE = 11, 14, 36
_PROTOCOL_TYPE = (("ProtocolType",), "protocolType")
_AUTH_BYTES = ((("AuthBytes",), "authBytes"),)

# (API key, direction) -> ((path of a field from the body down, role), ...)
EMBEDDED_ROLES: dict[tuple[int, str], tuple] = {
    (JOIN_GROUP, "request"): (_PROTOCOL_TYPE, (("Protocols", "Metadata"), "consumerSubscription")),
    (JOIN_GROUP, "response"): (_PROTOCOL_TYPE, (("Members", "Metadata"), "consumerSubscription")),
    (SYNC_GROUP, "request"): (_PROTOCOL_TYPE, (("Assignments", "Assignment"), "consumerAssignment")),
    (SYNC_GROUP, "response"): (_PROTOCOL_TYPE, (("Assignment",), "consumerAssignment")),
    (SASL_AUTHENTICATE, "request"): _AUTH_BYTES,
    (SASL_AUTHENTICATE, "response"): _AUTH_BYTES,
}
