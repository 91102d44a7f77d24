"""Bytes fields that carry another schema: the consumer protocol inside JoinGroup and SyncGroup.

Group members exchange opaque bytes whose meaning depends on the group's
protocol type. For type `consumer` they are a ConsumerProtocolSubscription
(JoinGroup metadata) or ConsumerProtocolAssignment (SyncGroup assignment): an
int16 version followed by that schema at that version. Older JoinGroup and
SyncGroup versions do not say the protocol type; there the bytes are decoded
only if the consumer schema consumes them exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.interpreter import decode_struct
from kafkasniff.protocol.primitives import read_int16
from kafkasniff.protocol.schema import data_variant, data_version_range

if TYPE_CHECKING:
    from kafkasniff.protocol.messages import Message

JOIN_GROUP, SYNC_GROUP = 11, 14
CONSUMER = "consumer"
# (API key, direction) -> (path of the bytes field, schema of its content)
EMBEDDED = {
    (JOIN_GROUP, "request"): (("Protocols", "Metadata"), "ConsumerProtocolSubscription"),
    (JOIN_GROUP, "response"): (("Members", "Metadata"), "ConsumerProtocolSubscription"),
    (SYNC_GROUP, "request"): (("Assignments", "Assignment"), "ConsumerProtocolAssignment"),
    (SYNC_GROUP, "response"): (("Assignment",), "ConsumerProtocolAssignment"),
}


def _bytes_fields(f: Field, path: tuple[str, ...]):
    child = f.child(path[0])
    if child is None:
        return
    if len(path) == 1:
        if child.value:
            yield child
        return
    for item in child.children or ():
        yield from _bytes_fields(item, path[1:])


def decode_embedded(buf, start: int, end: int, schema: str) -> tuple[list[Field], bool]:
    """Fields of an embedded schema in buf[start:end], and whether they consume it exactly."""
    try:
        version, pos = read_int16(buf, start, end)
    except Exception:
        return [], False
    lo, hi = data_version_range(schema)
    if version < lo:
        return [], False
    # Like Kafka, read a newer version with the newest schema we know: fields are only ever appended.
    variant = data_variant(schema, min(version, hi))
    struct, err = decode_struct(variant, min(version, hi), buf, pos, end, schema)
    fields = [Field("Version", "int16", start, 2, version)] + struct.children
    return fields, err is None and struct.end == end


def expand_embedded(msg: Message, buf) -> None:
    """Decode consumer-protocol bytes in a JoinGroup or SyncGroup message in place."""
    spec = EMBEDDED.get((msg.api_key, msg.kind))
    if spec is None or msg.body is None:
        return
    protocol_type = msg.body.child("ProtocolType")
    if protocol_type is not None and protocol_type.value not in (CONSUMER, None):
        return
    path, schema = spec
    for f in _bytes_fields(msg.body, path):
        start = f.end - len(f.value)
        fields, exact = decode_embedded(buf, start, f.end, schema)
        if exact or (protocol_type is not None and fields):
            f.children = fields
            f.note = schema if exact else f"{schema} (bytes left over)"
