"""Values of a given entity type in a decoded message (topic names, group ids, ...).

Kafka's schemas tag fields with an `entityType` (topicName, groupId,
transactionalId, brokerId, producerId). The paths of those fields are worked out
once per (API, direction, version) from the schema table.
"""

from __future__ import annotations

from functools import cache

from kafkasniff.protocol.fields import Field
from kafkasniff.protocol.interpreter import TAGGED_FIELDS
from kafkasniff.protocol.messages import Message
from kafkasniff.protocol.schema import in_range, message_variant


def _paths(fields: list[dict], structs: dict, version: int, entity: str, prefix: tuple) -> list[tuple]:
    out = []
    for f in fields:
        if not in_range(version, f.get("versions")):
            continue
        path = prefix + (f["name"],)
        if f.get("entity") == entity:
            out.append(path)
        inner = f.get("fields") or structs.get(f["type"].removeprefix("[]"))
        if inner:
            out += _paths(inner, structs, version, entity, path)
    return out


@cache
def entity_paths(api_key: int, kind: str, version: int, entity: str) -> tuple[tuple[str, ...], ...]:
    variant = message_variant(api_key, kind, version)
    if variant is None:
        return ()
    return tuple(_paths(variant.fields, variant.structs, version, entity, ()))


def _collect(field: Field, path: tuple, out: list) -> None:
    if not path:
        if field.children is not None and field.type.startswith("[]"):
            out.extend(c.value for c in field.children)
        elif field.value is not None:
            out.append(field.value)
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


def entity_values(msg: Message, entity: str) -> list:
    """Distinct values of the entity in the message body, in order of appearance."""
    if msg.body is None or msg.api_key is None:
        return []
    out: list = []
    for path in entity_paths(msg.api_key, msg.kind, msg.api_version, entity):
        _collect(msg.body, path, out)
    return list(dict.fromkeys(v for v in out if v is not None))


def topics(msg: Message) -> list[str]:
    return entity_values(msg, "topicName")
