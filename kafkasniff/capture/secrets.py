"""TLS key log text embedded in a pcapng capture: its Decryption Secrets Blocks (`editcap --inject-secrets`).

Read once per file, before its packets, by walking the block headers in chunks read in order (block bodies
other than secrets are never looked at).
"""

from __future__ import annotations

import gzip
import os
import struct

from kafkasniff.capture._headers import skip_blocks

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


CHUNK = 1 << 20
_HEAD = {"<": struct.Struct("<II"), ">": struct.Struct(">II")}  # block type, block length


def _secrets(stream):
    """The key log texts of the secrets blocks, walking the blocks a chunk at a time: a capture has a block per
    packet, and a seek and a read for each took longer than the rest of decoding a small packet."""
    order = "<"
    buf = stream.read(CHUNK)
    at = 0  # in buf
    if len(buf) < 8 or struct.unpack_from("<I", buf)[0] != SECTION_HEADER:
        return
    while True:
        if len(buf) - at < 12:
            rest = stream.read(CHUNK)
            if not rest and len(buf) - at < 8:
                return
            buf, at = buf[at:] + rest, 0
        else:  # the blocks that are neither, skipped in C up to one of these or the end of what is buffered
            at = skip_blocks(buf, at, order == ">")
            if at > len(buf):
                stream.seek(at - len(buf), os.SEEK_CUR)
                buf, at = b"", 0
                continue
            if len(buf) - at < 12:
                continue
        kind, length = _HEAD[order].unpack_from(buf, at)
        if kind == SECTION_HEADER:
            if len(buf) - at < 12:
                return
            order = "<" if struct.unpack_from("<I", buf, at + 8)[0] == BYTE_ORDER_MAGIC else ">"
            length = _HEAD[order].unpack_from(buf, at)[1]
        if length < 12 or length % 4:
            return
        if kind == DECRYPTION_SECRETS and length <= MAX_SECRETS + 20:
            if len(buf) - at < length:  # the whole block (at most MAX_SECRETS), or what the file holds of it
                buf, at = buf[at:] + stream.read(length - (len(buf) - at)), 0
            if len(buf) - at < 16:
                return
            secrets_type, size = _HEAD[order].unpack_from(buf, at + 8)
            if secrets_type == TLS_KEY_LOG and size <= length - 20:
                text = buf[at + 16:at + 16 + size]  # cut short when the file is: its whole lines still count
                yield text if text.endswith(b"\n") else text + b"\n"
        at += length
        if at > len(buf):  # the rest of a block bigger than what is buffered: skipped unread
            stream.seek(at - len(buf), os.SEEK_CUR)
            buf, at = b"", 0
