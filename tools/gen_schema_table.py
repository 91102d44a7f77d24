#!/usr/bin/env python3
"""Generate kafkasniff's schema table from Apache Kafka's JSON message schemas.

Usage: python tools/gen_schema_table.py [SCHEMAS_DIR] [--check]

SCHEMAS_DIR defaults to ../shared/kafka-schemas (beside the repository). It holds
two snapshots: an old release that still lists versions Kafka 4.0 removed, and a
newer trunk. Kafka never changes what an existing (API key, version) means, so
each version is taken from the newest snapshot that lists it.

Only wire facts are kept: names, types, version ranges (valid, flexible,
nullable, tagged), tags, defaults and entity types, and each field's role (see
`field_role`). Prose (`about`, comments) is dropped. With --check the script exits 1 if the committed table differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "kafkasniff" / "protocol" / "schema_table.json"
DEFAULT_SCHEMAS = REPO.parent / "shared" / "kafka-schemas"
# Oldest first; a later snapshot wins for every version it lists.
SNAPSHOTS = ("apache-kafka-3.9", "kafka-trunk-2026-08")
MAX_VERSION = 32767
FIELD_FACTS = ("versions", "nullableVersions", "taggedVersions", "flexibleVersions")


def strip_comments(text: str) -> str:
    """Drop // and /* */ comments outside string literals (the files are JSON with comments)."""
    out = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
        elif c == '"':
            in_string = True
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_versions(spec: str | None) -> list[int] | None:
    """'3', '0-11', '2+', 'none' -> [lo, hi] or None."""
    if spec is None or spec == "none":
        return None
    spec = spec.strip()
    if spec.endswith("+"):
        return [int(spec[:-1]), MAX_VERSION]
    if "-" in spec:
        lo, hi = spec.split("-")
        return [int(lo), int(hi)]
    return [int(spec), int(spec)]


# Field roles: what a field is for, beyond its wire type. Views, filters and statistics find topics,
# partitions, error codes and records by role, never by guessing from names; this is the one place that
# reads the names.
PARTITION_FIELDS = {"int32": {"PartitionIndex", "Partition", "PartitionId", "Index"},
                    "[]int32": {"Partitions", "PartitionIndexes"}}
HEADER_ROLES = {("RequestHeader", "CorrelationId"): "correlationId", ("ResponseHeader", "CorrelationId"): "correlationId",
                ("RequestHeader", "ClientId"): "clientId"}
NAME_ENTITIES = ("groupId", "transactionalId")
MESSAGE_ROLES = {("ProduceRequest", "Acks"): "acks", ("ControlRecordTypeSchema", "Type"): "controlType"}


def field_role(field: dict, schema: str, top_level: bool) -> str | None:
    name, type_ = field["name"], field["type"]
    if type_ == "int16" and name.endswith("ErrorCode"):
        return "errorCode"
    if field.get("entityType") == "topicName" and type_ in ("string", "[]string"):
        return "topicName"
    if name == "TopicId" and type_ == "uuid":
        return "topicId"
    if name in PARTITION_FIELDS.get(type_, ()):
        return "partition"
    if type_ == "records":
        return "records"
    if type_ == "int16" and name in ("ApiKey", "RequestApiKey"):
        return "apiKey"
    # Values with a range on the wire, which rank the schemas that fit a response whose request was lost: a node
    # id or an offset is -1 (none) or more in responses, a port -1 (none) to 65535, a name holds no control
    # characters.
    if field.get("entityType") == "brokerId" and type_ in ("int32", "[]int32"):
        return "nodeId"
    if name == "Port" and type_ in ("int32", "uint16"):
        return "port"
    if type_ in ("int64", "[]int64") and (name.endswith(("Offset", "Offsets")) or name.endswith("Watermark")):
        return "offset"
    if (field.get("entityType") in NAME_ENTITIES and type_ in ("string", "[]string")) or \
            (name == "Host" and type_ == "string"):
        return "name"
    if top_level and name == "ThrottleTimeMs" and schema.endswith("Response"):
        return "throttleTimeMs"
    if top_level:
        return HEADER_ROLES.get((schema, name)) or MESSAGE_ROLES.get((schema, name))
    return None


def field_facts(field: dict, schema: str = "", top_level: bool = False) -> dict:
    out = {"name": field["name"], "type": field["type"]}
    for key in FIELD_FACTS:
        if key in field:
            out[key.removesuffix("Versions")] = parse_versions(field[key])
    if "tag" in field:
        out["tag"] = field["tag"]
    if "default" in field:
        out["default"] = field["default"]
    if "entityType" in field:
        out["entity"] = field["entityType"]
    role = field_role(field, schema, top_level)
    if role:
        out["role"] = role
    if "fields" in field:
        out["fields"] = [field_facts(f, schema) for f in field["fields"]]
    return out


def message_facts(doc: dict, versions: list[int]) -> dict:
    out = {
        "versions": versions,
        "flexible": parse_versions(doc.get("flexibleVersions")),
        "fields": [field_facts(f, doc["name"], True) for f in doc.get("fields", [])],
    }
    structs = {s["name"]: [field_facts(f, doc["name"]) for f in s["fields"]] for s in doc.get("commonStructs", [])}
    if structs:
        out["structs"] = structs
    if doc.get("latestVersionUnstable"):
        out["latest_unstable"] = True
    return out


def load_snapshot(root: Path) -> list[dict]:
    docs = []
    for path in sorted(root.glob("*/*.json")):
        doc = json.loads(strip_comments(path.read_text()))
        if doc.get("type") in ("request", "response", "header") or (
            doc.get("type") == "data" and path.parent.name == "clients"
        ):
            docs.append(doc)
    return docs


def combine(variants_by_snapshot: list[dict]) -> list[dict]:
    """Each version comes from the newest snapshot listing it; returns variants, newest first."""
    taken: set[int] = set()
    result = []
    for doc in reversed(variants_by_snapshot):
        lo, hi = parse_versions(doc["validVersions"]) or (0, -1)
        own = [v for v in range(lo, hi + 1) if v not in taken]
        if not own:
            continue
        # The older snapshot only adds versions below (or, for removed APIs, all of) the newer range.
        if own != list(range(own[0], own[-1] + 1)):
            raise SystemExit(f"{doc['name']}: versions from older snapshot are not contiguous: {own}")
        taken.update(own)
        result.append(message_facts(doc, [own[0], own[-1]]))
    return result


def _has_role(fields: list[dict], structs: dict, role: str) -> bool:
    """Whether a field among these (or the fields of their structs, common structs too) has the role."""
    return any(f.get("role") == role or _has_role(f.get("fields") or structs.get(f["type"].removeprefix("[]"), []),
                                                   structs, role)
               for f in fields)


def build_table(schemas: Path) -> dict:
    by_name: dict[str, list[dict]] = {}
    for snapshot in SNAPSHOTS:
        for doc in load_snapshot(schemas / snapshot):
            by_name.setdefault(doc["name"], []).append(doc)

    apis: dict[int, dict] = {}
    headers, data = {}, {}
    for name, docs in sorted(by_name.items()):
        kind = docs[-1]["type"]
        if kind in ("request", "response"):
            key = docs[-1]["apiKey"]
            api = apis.setdefault(key, {"key": key, "name": name.removesuffix("Request").removesuffix("Response")})
            api[kind] = combine(docs)
        elif kind == "header":
            headers[name] = combine(docs)
        else:
            data[name] = combine(docs)
    for api in apis.values():
        if any(_has_role(variant["fields"], variant.get("structs", {}), "records")
               for kind in ("request", "response") for variant in api.get(kind, ())):
            api["carries_records"] = True  # Produce, Fetch, ...: the views count and decode records for these
    return {
        "sources": list(SNAPSHOTS),
        "apis": [apis[k] for k in sorted(apis)],
        "headers": headers,
        "data": data,
    }


def render(table: dict) -> str:
    # One API / header / data schema per line keeps diffs readable and the file compact.
    lines = ["{", f' "sources": {json.dumps(table["sources"])},', ' "apis": [']
    lines += [" " + json.dumps(a, separators=(",", ":")) + "," for a in table["apis"]]
    lines[-1] = lines[-1].rstrip(",")
    for section in ("headers", "data"):
        lines += [" ],", f' "{section}": {{'] if section == "headers" else [" },", f' "{section}": {{']
        items = list(table[section].items())
        lines += [f" {json.dumps(k)}: " + json.dumps(v, separators=(",", ":")) + "," for k, v in items]
        lines[-1] = lines[-1].rstrip(",")
    lines += [" }", "}", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    schemas = Path(args[0]) if args else DEFAULT_SCHEMAS
    if not schemas.is_dir():
        print(f"schemas folder not found: {schemas} (pass it as the first argument)", file=sys.stderr)
        return 2
    text = render(build_table(schemas))
    json.loads(text)  # the hand-joined layout must still be valid JSON
    if check:
        if TABLE.read_text() != text:
            print(f"{TABLE} is out of date: run python tools/gen_schema_table.py", file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(text)
    print(f"wrote {TABLE} ({len(text):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
