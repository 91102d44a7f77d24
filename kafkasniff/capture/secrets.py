"""TLS key log text embedded in a pcapng capture: its Decryption Secrets Blocks (`editcap --inject-secrets`).

Read once per file, before its packets, by walking the block headers (block bodies are skipped unread).
"""

from __future__ import annotations

import gzip
import os
import struct

SECTION_HEADER = 0x0A0D0D0A
DECRYPTION_SECRETS = 0x0000000A
TLS_KEY_LOG = 0x544C534B  # "TLSK": the secrets are NSS key log lines
BYTE_ORDER_MAGIC = 0x1A2B3C4D
MAX_SECRETS = 16 << 20  # a key log of a million connections is about 100 MiB; bigger blocks are damage


def tls_key_log_text(path: str | os.PathLike) -> bytes:
    """The key log lines of every TLS Decryption Secrets Block in a pcapng file (gzip too), joined;
    b"" for other files, and from the first damaged block on (the packet reader reports damage)."""
    try:
        with open(path, "rb") as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if compressed else raw
            return b"".join(_secrets(stream))
    except (OSError, EOFError, struct.error):
        return b""


def _secrets(stream):
    """Walks the blocks from one block start to the next (forward seeks only: cheap in gzip too)."""
    order = "<"
    at = 0
    while True:
        stream.seek(at)
        head = stream.read(12)
        if len(head) < 8:
            return
        kind = struct.unpack_from(order + "I", head)[0]
        if at == 0 and struct.unpack_from("<I", head)[0] != SECTION_HEADER:
            return
        if kind == SECTION_HEADER:
            if len(head) < 12:
                return
            order = "<" if struct.unpack_from("<I", head, 8)[0] == BYTE_ORDER_MAGIC else ">"
        length = struct.unpack_from(order + "I", head, 4)[0]
        if length < 12 or length % 4:
            return
        if kind == DECRYPTION_SECRETS and length <= MAX_SECRETS + 20 and len(head) == 12:
            secrets_type = struct.unpack_from(order + "I", head, 8)[0]
            size = struct.unpack(order + "I", stream.read(4))[0]
            if secrets_type == TLS_KEY_LOG and size <= length - 20:
                text = stream.read(size)
                yield text if text.endswith(b"\n") else text + b"\n"
        at += length
