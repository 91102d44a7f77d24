"""Values of a given entity type in a decoded message (topic names, group ids, ...).

Kafka's schemas tag fields with an `entityType` (topicName, groupId,
transactionalId, brokerId, producerId). The paths of those fields are worked out
once per (API, direction, version) from the schema table.
"""

from __future__ import annotations

from functools import cache

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.interpreter import TAGGED_FIELDS, is_error_code_field
from kafkasniff.protocol.messages import Message
from kafkasniff.protocol.schema import in_range, message_variant


# Not Kafka entity types, but found the same way: the int16 *ErrorCode fields; and every field
# that can name a topic or carry records for it (topic names, TopicId uuids, records).
ERROR_CODES = "errorCode"
TOPIC_BEARING = "topicBearing"


def _matches(f: dict, entity: str) -> bool:
    if entity == ERROR_CODES:
        return is_error_code_field(f["name"], f["type"])
    if entity == TOPIC_BEARING:
        return f.get("entity") == "topicName" or f["type"] == "records" or \
            (f["name"] == "TopicId" and f["type"] == "uuid")
    return f.get("entity") == entity


def _paths(fields: list[dict], structs: dict, version: int, entity: str, prefix: tuple) -> list[tuple]:
    out = []
    for f in fields:
        if not in_range(version, f.get("versions")):
            continue
        path = prefix + (f["name"],)
        if _matches(f, entity):
            out.append(path)
        inner = f.get("fields") or structs.get(f["type"].removeprefix("[]"))
        if inner:
            out += _paths(inner, structs, version, entity, path)
    return out


@cache
def entity_paths(api_key: int, kind: str, version: int, entity: str) -> tuple[tuple[str, ...], ...]:
    """Paths (field names from the body down) of the fields of an entity type, or of ERROR_CODES."""
    variant = message_variant(api_key, kind, version)
    if variant is None:
        return ()
    return tuple(_paths(variant.fields, variant.structs, version, entity, ()))


def _collect(field: Field, path: tuple, out: list[Field]) -> None:
    """The leaf Fields at `path` below `field` (every array item on the way)."""
    if not path:
        if field.children is not None and field.type.startswith("[]"):
            out.extend(field.children)
        else:
            out.append(field)
        return
    for child in field.children or ():
        if child.name == TAGGED_FIELDS:
            _collect(child, path, out)
        elif child.name == path[0]:
            if child.type.startswith("[]") and child.children is not None and child.children \
                    and child.children[0].children is not None:
                for item in child.children:
                    _collect(item, path[1:], out)
            else:
                _collect(child, path[1:], out)


def _fields_at(msg: Message, entity: str) -> list[Field]:
    if msg.body is None or msg.api_key is None:
        return []
    out: list[Field] = []
    for path in entity_paths(msg.api_key, msg.kind, msg.api_version, entity):
        _collect(msg.body, path, out)
    return out


def entity_values(msg: Message, entity: str) -> list:
    """Distinct values of the entity in the message body, in order of appearance."""
    return list(dict.fromkeys(f.value for f in _fields_at(msg, entity) if f.value is not None))


def topics(msg: Message) -> list[str]:
    return entity_values(msg, "topicName")


def error_codes(msg: Message) -> list[int]:
    """Non-zero error codes in wire order, found along the schema's paths, not by walking the tree."""
    if msg.skimmed is not None:
        return [v for n, v in msg.skimmed if n != "Acks"]
    found = sorted(_fields_at(msg, ERROR_CODES), key=lambda f: f.offset)
    return [f.value for f in found if f.value]


@cache
def topic_bearing_prefixes(api_key: int, kind: str, version: int) -> frozenset[tuple[str, ...]]:
    """Every path, and every prefix of one, that leads to a topic name, topic id or records field."""
    return frozenset(path[:i] for path in entity_paths(api_key, kind, version, TOPIC_BEARING)
                     for i in range(1, len(path) + 1))
