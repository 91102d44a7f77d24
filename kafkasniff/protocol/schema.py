"""Access to the generated schema table (kafkasniff/protocol/schema_table.json).

The table is produced by tools/gen_schema_table.py; this module only looks
things up in it. Version ranges are `[lo, hi]` lists (hi = 32767 for "and up").
"""

from __future__ import annotations

import json
import os
from functools import cache, lru_cache
from typing import NamedTuple

TABLE = os.path.join(os.path.dirname(__file__), "schema_table.json")
# Look-ups by (API key, kind, version) kept: more than the triples Kafka defines (736), so real traffic never
# repeats one; the keys and versions of made-up frames push out the least recently used.
VERSIONS_KEPT = 1024


class Variant(NamedTuple):
    """One schema definition valid for a contiguous range of versions."""

    name: str
    versions: tuple[int, int]
    flexible: tuple[int, int] | None
    fields: list[dict]
    structs: dict[str, list[dict]]


@cache
def table() -> dict:
    with open(TABLE, encoding="utf-8") as f:
        return json.load(f)


@cache
def apis() -> dict[int, dict]:
    return {api["key"]: api for api in table()["apis"]}


def in_range(version: int, rng) -> bool:
    return rng is not None and rng[0] <= version <= rng[1]


def api_name(api_key: int) -> str:
    api = apis().get(api_key)
    return api["name"] if api else f"UnknownApi{api_key}"


def version_range(api_key: int, kind: str) -> tuple[int, int] | None:
    """(lowest, highest) version of a request or response, or None if unknown."""
    api = apis().get(api_key)
    if not api:
        return None
    variants = api[kind]
    return min(v["versions"][0] for v in variants), max(v["versions"][1] for v in variants)


def _pick(name: str, variants: list[dict], version: int) -> Variant | None:
    for v in variants:
        if in_range(version, v["versions"]):
            return Variant(name, tuple(v["versions"]), tuple(v["flexible"]) if v["flexible"] else None,
                           v["fields"], v.get("structs", {}))
    return None


@lru_cache(maxsize=VERSIONS_KEPT)
def message_variant(api_key: int, kind: str, version: int) -> Variant | None:
    """Schema for a request or response body at a version; None if Kafka never defined it."""
    api = apis().get(api_key)
    if not api:
        return None
    return _pick(f"{api['name']}{kind.capitalize()}", api[kind], version)


@cache
def header_variant(kind: str, version: int) -> Variant | None:
    name = "RequestHeader" if kind == "request" else "ResponseHeader"
    return _pick(name, table()["headers"][name], version)


@lru_cache(maxsize=VERSIONS_KEPT)
def data_variant(name: str, version: int) -> Variant | None:
    variants = table()["data"].get(name)
    return _pick(name, variants, version) if variants else None


def data_version_range(name: str) -> tuple[int, int] | None:
    variants = table()["data"].get(name)
    if not variants:
        return None
    return min(v["versions"][0] for v in variants), max(v["versions"][1] for v in variants)


def is_flexible(variant: Variant, version: int) -> bool:
    return in_range(version, variant.flexible)


def carries_records(api_key: int) -> bool:
    """Whether the API's requests or responses hold record batches (Produce, Fetch, ShareFetch)."""
    return api_key in record_apis()


@cache
def record_apis() -> frozenset[int]:
    """Keys of the APIs whose requests or responses hold record batches (a fact of the generated table)."""
    return frozenset(key for key, api in apis().items() if api.get("carries_records"))
