"""The JSON manifest next to each committed capture in captures/: writing and reading it.

A manifest says what went over the wire: broker port, client versions, every
produced message (with the partition and offset the broker acknowledged) and
what the consumers read back. Byte strings are objects
`{"length": n, "base64": ..., "text": ...}` (`text` only when the bytes are
UTF-8); `null` stands for a null key, value or header value. Consumed values
longer than DIGEST_ONLY_ABOVE bytes carry `sha256` instead of `base64`, to
keep manifests small; the produced entry still holds the full bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

CAPTURES_DIR = Path(__file__).resolve().parents[1] / "captures"
TLS_FOLDER = "tls"
DIGEST_ONLY_ABOVE = 64 * 1024

Headers = tuple[tuple[str, "bytes | None"], ...]


def encode_bytes(data: bytes | None, digest_only_above: int | None = None) -> dict | None:
    if data is None:
        return None
    encoded: dict = {"length": len(data)}
    if digest_only_above is not None and len(data) > digest_only_above:
        encoded["sha256"] = hashlib.sha256(data).hexdigest()
        return encoded
    encoded["base64"] = base64.b64encode(data).decode("ascii")
    try:
        encoded["text"] = data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    return encoded


def decode_bytes(encoded: dict | None) -> bytes | None:
    """The bytes an encoded entry stands for; digest-only entries cannot be decoded."""
    if encoded is None:
        return None
    if "base64" not in encoded:
        raise ValueError("digest-only entry: compare with matches_bytes() instead")
    return base64.b64decode(encoded["base64"])


def matches_bytes(encoded: dict | None, data: bytes | None) -> bool:
    if encoded is None or data is None:
        return encoded is None and data is None
    if "base64" in encoded:
        return decode_bytes(encoded) == data
    return encoded["length"] == len(data) and encoded["sha256"] == hashlib.sha256(data).hexdigest()


def encode_headers(headers: Headers) -> list[dict]:
    return [{"key": key, "value": encode_bytes(value)} for key, value in headers]


def decode_headers(encoded: list[dict]) -> Headers:
    return tuple((header["key"], decode_bytes(header["value"])) for header in encoded)


@dataclass(frozen=True)
class ProducedRecord:
    """One produced message as the manifest lists it, bytes decoded."""

    client: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    codec: str
    transaction: str | None  # None, "committed" or "aborted"


@dataclass(frozen=True)
class Capture:
    name: str
    pcap: Path
    manifest: dict

    @property
    def port(self) -> int:
        return self.manifest["broker"]["port"]

    @property
    def keylog(self) -> Path | None:
        """The key log that decrypts a TLS capture (None for plaintext captures)."""
        tls = self.manifest.get("tls")
        return self.pcap.parent / tls["keylog"] if tls else None

    def produced(self) -> list[ProducedRecord]:
        return [ProducedRecord(entry["client"], entry["topic"], entry["partition"], entry["offset"],
                               decode_bytes(entry["key"]), decode_bytes(entry["value"]),
                               decode_headers(entry["headers"]), entry["codec"], entry["transaction"])
                for entry in self.manifest["produced"]]


def load_capture(name: str, directory: Path = CAPTURES_DIR) -> Capture:
    """name: a capture of `directory`, or of its tls/ folder as "tls/NAME"."""
    path = directory / f"{name}.json"
    manifest = json.loads(path.read_text())
    return Capture(name, path.parent / manifest["pcap"], manifest)


def capture_names(directory: Path = CAPTURES_DIR) -> list[str]:
    """The plaintext captures."""
    return sorted(path.stem for path in directory.glob("*.json"))


def tls_capture_names(directory: Path = CAPTURES_DIR) -> list[str]:
    """The TLS captures, as "tls/NAME" (each decrypts with its manifest's key log)."""
    return sorted(f"{TLS_FOLDER}/{path.stem}" for path in (directory / TLS_FOLDER).glob("*.json"))
