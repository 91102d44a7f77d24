"""Encode values into Kafka wire bytes, driven by the same schema table as the decoder.

Values are plain Python: a dict per struct keyed by the schema's field names,
lists for arrays, bytes for `bytes` and `records`, str for strings and uuids.
A missing field takes its schema default. A tagged field is written when its
name is present in the dict. Used by tests and tools to build exact frames.
"""

from __future__ import annotations

import struct

from kafkasniff.protocol import primitives as p
from kafkasniff.protocol import quirks
from kafkasniff.protocol.schema import (Variant, header_variant, in_range, is_flexible, message_variant)

ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def default_value(f: dict, version: int):
    type_ = f["type"]
    nullable = in_range(version, f.get("nullable"))
    default = f.get("default")
    if type_.startswith("[]"):
        return []
    if default == "null" and nullable:
        return None
    if type_ in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return int(default, 0) if isinstance(default, str) else int(default or 0)
    if type_ == "float64":
        return float(default or 0)
    if type_ == "bool":
        return default in (True, "true")
    if type_ == "string":
        return default if isinstance(default, str) else ""
    if type_ == "uuid":
        return ZERO_UUID
    if type_ in ("bytes", "records"):
        return None if nullable else b""
    return {}


class Encoder:
    def __init__(self, variant: Variant, version: int):
        self.variant = variant
        self.version = version
        self.flexible = is_flexible(variant, version)

    def struct_fields(self, f: dict) -> list[dict]:
        return f["fields"] if "fields" in f else self.variant.structs[f["type"].removeprefix("[]")]

    def struct(self, fields: list[dict], values: dict) -> bytes:
        out = []
        tagged = []
        for f in fields:
            if not in_range(self.version, f.get("versions")):
                continue
            if in_range(self.version, f.get("tagged")):
                if f["name"] in values:
                    tagged.append((f["tag"], self.field(f, values[f["name"]])))
                continue
            value = values[f["name"]] if f["name"] in values else default_value(f, self.version)
            out.append(self.field(f, value))
        if self.flexible:
            out.append(p.write_unsigned_varint(len(tagged)))
            for tag, raw in sorted(tagged):
                out.append(p.write_unsigned_varint(tag) + p.write_unsigned_varint(len(raw)) + raw)
        return b"".join(out)

    def field(self, f: dict, value) -> bytes:
        type_ = f["type"]
        compact = self.flexible and ("flexible" not in f or in_range(self.version, f["flexible"]))
        if type_.startswith("[]"):
            if value is None:
                return p.write_array_length(None, compact)
            elem_type = type_[2:]
            parts = [p.write_array_length(len(value), compact)]
            if elem_type in p.FIXED_WRITERS or elem_type in ("bool", "uuid", "string", "bytes"):
                parts += [self.leaf(elem_type, v, compact) for v in value]
            else:
                fields = self.struct_fields(f)
                parts += [self.struct(fields, v) for v in value]
            return b"".join(parts)
        if type_ in p.FIXED_WRITERS or type_ in ("bool", "uuid", "string", "bytes", "records"):
            return self.leaf(type_, value, compact)
        body = self.struct(self.struct_fields(f), value or {})
        if in_range(self.version, f.get("nullable")):
            return b"\xff" if value is None else b"\x01" + body
        return body

    @staticmethod
    def leaf(type_: str, value, compact: bool) -> bytes:
        if type_ in p.FIXED_WRITERS:
            return p.FIXED_WRITERS[type_](value)
        if type_ == "bool":
            return p.write_bool(value)
        if type_ == "uuid":
            return p.write_uuid(value)
        if type_ == "string":
            return p.write_string(value, compact)
        return p.write_bytes(value, compact)


def encode_struct(variant: Variant, version: int, values: dict) -> bytes:
    return Encoder(variant, version).struct(variant.fields, values)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                   body: dict, size_prefix: bool = True) -> bytes:
    variant = message_variant(api_key, "request", api_version)
    if variant is None:
        raise ValueError(f"API {api_key} v{api_version} has no request schema")
    hv = quirks.request_header_version(api_key, api_version, is_flexible(variant, api_version))
    header = encode_struct(header_variant("request", hv), hv, {
        "RequestApiKey": api_key, "RequestApiVersion": api_version,
        "CorrelationId": correlation_id, "ClientId": client_id})
    payload = header + encode_struct(variant, api_version, body)
    return _frame(payload) if size_prefix else payload


def encode_response(api_key: int, api_version: int, correlation_id: int, body: dict,
                    size_prefix: bool = True) -> bytes:
    variant = message_variant(api_key, "response", api_version)
    if variant is None:
        raise ValueError(f"API {api_key} v{api_version} has no response schema")
    hv = quirks.response_header_version(api_key, api_version, is_flexible(variant, api_version))
    header = encode_struct(header_variant("response", hv), hv, {"CorrelationId": correlation_id})
    payload = header + encode_struct(variant, api_version, body)
    return _frame(payload) if size_prefix else payload
