"""A second, independent way to the -V tree: from the Field tree, the way the project drew it in Python before
the tree was drawn straight from the bytes (text.c). Tests compare the two on real and broken frames, so the
Field builder and the text builder keep telling the same story.

Plain text only (no styles); the conventions are today's: CRCs in hex, times readable, arrays cut short say
how many items the wire promised, a record count that differs from the batch header's is a line after the
records.
"""

from __future__ import annotations

from kafkasniff.protocol.fields import DECOMPRESSED_MESSAGES, DECOMPRESSED_RECORDS, TAGGED_FIELDS, Field
from kafkasniff.protocol.records import DECOMPRESSED_NOTE
from kafkasniff.protocol.sasl import SECRET, TOKEN
from kafkasniff.protocol.schema import api_name, apis
from kafkasniff.render.values import show_bytes, show_value, timestamp_text

MASK = "********"
FRAME_PREFIX = 4
_DETACHED = (DECOMPRESSED_RECORDS, DECOMPRESSED_MESSAGES)


class Node:
    def __init__(self, label: str):
        self.label, self.children = label, []

    def add(self, label: str) -> "Node":
        self.children.append(Node(label))
        return self.children[-1]

    def lines(self, prefix: str = "") -> list[str]:
        out = []
        for i, child in enumerate(self.children):
            last = i == len(self.children) - 1
            out.append(prefix + ("└── " if last else "├── ") + child.label)
            out += child.lines(prefix + ("    " if last else "│   "))
        return out


def label(name: str, type_: str, value: str | None = None) -> str:
    return f"{name}: {value}  {type_}" if value is not None else f"{name}  {type_}"


class Oracle:
    def __init__(self, limit: int | None = 64, show_secrets: bool = False):
        self.limit, self.show_secrets = limit, show_secrets

    def tree(self, header: Field | None, header_version: int | None, body: Field | None) -> list[str]:
        root = Node("")
        if header is not None:
            self.members(root.add(label("header", f"{header.type} v{header_version}")), header)
        if body is not None:
            self.members(root.add(label("body", body.type)), body)
        return root.lines()

    def members(self, node: Node, struct: Field) -> None:
        for c in struct.children or ():
            if c.name == TAGGED_FIELDS:
                for tagged in c.children or ():
                    self.field(node, tagged)
            else:
                self.field(node, c)

    def field(self, node: Node, f: Field) -> None:
        if f.type == "records" and f.children is not None:
            self.records(node, f)
        elif f.type == SECRET:
            node.add(label(f.name, f.type, show_value(f, self.limit) if self.show_secrets else MASK))
        elif f.type == TOKEN:
            self.members(node.add(label(f.name, "SASL token", f"{len(f.value)} bytes")), f)
        elif f.children is None or (f.children and f.children[0].type == "bits"):
            node.add(label(f.name, f.type, self.value(f)))
        elif f.type.startswith("[]"):
            branch = node.add(label(f.name, f.type, show_value(f, self.limit)))
            for item in f.children:
                if item.children is None:
                    branch.add(label(item.name, item.type, self.value(item)))
                else:
                    self.members(branch.add(item.name), item)
        else:
            self.members(node.add(label(f.name, f.type)), f)

    def value(self, f: Field) -> str:
        if f.children and f.children[0].type == "bits":
            return f"{f.value} (" + ", ".join(f"{c.name}={c.note or c.value}" for c in f.children) + ")"
        if f.role == "apiKey" and f.value in apis():
            return f"{f.value} ({api_name(f.value)})"
        return show_value(f, self.limit)

    def records(self, node: Node, f: Field) -> None:
        kind = "legacy message" if f.children and f.children[0].type == "Message" else "record batch"
        n = len(f.children)
        count = f"{n} {kind}" + ("" if n == 1 else "es" if kind.endswith("h") else "s")
        branch = node.add(label(f.name, f.type, f"{count} in {f.length:,} bytes"))
        for item in f.children:
            self.item(branch, item, FRAME_PREFIX)

    def item(self, node: Node, item: Field, shift: int) -> None:
        if item.type == "Malformed":
            where = "byte" if shift else "decompressed byte"
            node.add(f"MALFORMED at {where} {item.value.offset + shift}: {item.value.reason}")
            return
        if item.type == "PartialBatch":
            branch = node.add(item.note)
            for c in item.children:
                self.field(branch, c)
            return
        v = item.value
        crc = "CRC valid" if v["crc_valid"] else f"CRC INVALID (computed 0x{v['crc_computed']:08x})"
        facts = [f"codec {v['codec']}"]
        if item.type == "RecordBatch":
            facts += [f"{v['record_count']} records", f"base offset {v['base_offset']}"]
            if v["producer_id"] != -1:
                facts.append(f"producer id {v['producer_id']}")
            facts += [flag for flag in ("transactional", "control") if v[f"is_{flag}"]]
            branch = node.add(f"record batch (magic {v['magic']}): {', '.join(facts)}, {crc}")
        else:
            facts += [f"offset {v['offset']}", f"timestamp {timestamp_text(v['timestamp'])}"]
            branch = node.add(f"message (magic {v['magic']}): {', '.join(facts)}, {crc}")
        for c in item.children:
            if c.name in ("records", "messages"):
                self.inner(branch, c, shift, item)
            else:
                self.field(branch, c)

    def inner(self, node: Node, inner: Field, shift: int, item: Field) -> None:
        mismatch = None
        if inner.note and "record_count is" in inner.note:
            mismatch = inner.note[inner.note.index("record_count is"):]
        if inner.type in _DETACHED:
            shift = 0
            if inner.value is None:
                branch = node.add(f"{inner.name}: not decompressed ({inner.note})")
            else:
                branch = node.add(f"{inner.name}: {len(inner.value):,} bytes decompressed ({DECOMPRESSED_NOTE})")
        else:
            branch = node.add(label(inner.name, inner.type))
        for r in inner.children:
            if r.type == "Record":
                self.record(branch, r)
            else:
                self.item(branch, r, shift)
        if mismatch:
            branch.add(mismatch)

    def record(self, node: Node, r: Field) -> None:
        v = r.value
        key = r["key"]
        when = f" offset {v['offset']}, timestamp {timestamp_text(v['timestamp'])}"
        if key.type == "ControlRecordKey":
            branch = node.add(f"control record {key['Type'].note}{when}")
        else:
            branch = node.add(f"record{when}")
        for name in ("key", "value"):
            f = r[name]
            if f.children is not None:
                self.field(branch, f)
            else:
                branch.add(label(name, f.type, "null" if v[name] is None else show_bytes(v[name], self.limit)))
        for k, value in v["headers"]:
            branch.add(f"header {k}: " + ("null" if value is None else show_bytes(value, self.limit)))
