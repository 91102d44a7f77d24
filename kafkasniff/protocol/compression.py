"""Kafka's record compression codecs, decompressed with a hard bound on output.

Codec ids are the low three bits of a batch's or message's attributes.

Bounding the output, per codec (a "bomb" never makes us allocate past `limit`, and no size
field in the bytes sizes a buffer past what those bytes can decompress to):
- gzip, zstd: cramjam's `decompress_into` writes into a fixed buffer and stops with
  an error once it is full, so we try a buffer sized from a hint, grow it (x4) up
  to `limit`, and report "too large" when even a `limit`-sized buffer overflows.
  gzip's hint is the ISIZE trailer, exact for the single-member streams clients write,
  but never more than deflate's largest expansion of the bytes present (1032:1). zstd's
  is the frame's content size when its header says it (librdkafka's and aiokafka's
  frames do), but never more than 8 times the bytes present (a buffer is zeroed as it is
  made: a guess of 8x for every batch zeroed three times what records compressed 2.5:1
  fill).
- snappy: raw blocks state their decompressed length up front; it is checked against
  `limit`, and against the most a block of that many bytes can make (a 3-byte copy
  element writes at most 64 bytes), before any output is allocated. Java clients write the xerial framing
  (magic header, then 4-byte-length-prefixed raw blocks); we parse the framing and
  decompress the blocks with cramjam.
- lz4: we walk the frame ourselves and decompress each block with cramjam's block
  API. This accepts the header checksum (HC) byte that producers of magic-0
  messages wrote over the wrong range (Kafka's KafkaLZ4BlockOutputStream with
  useBrokenFlagDescriptorChecksum hashes magic number + descriptor instead of the
  descriptor alone), which cramjam's frame decoder rejects. Kafka itself accepts only
  frames of independent blocks; a frame with linked blocks goes to cramjam's frame
  decoder (bounded like zstd), which then needs a standard HC. Besides the output,
  one scratch buffer is allocated, as large as the largest block can decompress to: at
  most the frame's block size (64 KiB in Kafka's frames, 4 MiB at most), and at most
  lz4's largest expansion of that block's bytes (about 255:1).
"""

from __future__ import annotations

import struct
from collections import OrderedDict

import cramjam

from kafkasniff.protocol._walk import unfilled

CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")
CODEC_IDS = {name: i for i, name in enumerate(CODEC_NAMES)}

MiB = 1024 * 1024
_FIRST_GUESS_MIN = 64 * 1024
_OUTPUT_FULL = "failed to write whole buffer"  # cramjam's message when an _into buffer is full
# The most each codec can make of n compressed bytes, rounded up: deflate 1032:1; snappy 64 bytes from a
# 3-byte copy element; lz4 255 bytes per byte of a match length, plus a sequence's last literals.
_DEFLATE_MAX_RATIO = 1032
_SNAPPY_MAX_RATIO = 22
_LZ4_MAX_RATIO, _LZ4_MAX_EXTRA = 256, 64

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_BLOCK_SIZE = 32 * 1024  # the xerial library's default, used by Java clients

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_GUESS_RATIO = 8

LZ4_MAGIC = b"\x04\x22\x4d\x18"
# Kafka's lz4 frame descriptor: version 1, independent blocks, no checksums, 64 KiB blocks.
_KAFKA_LZ4_FLG, _KAFKA_LZ4_BD = 0x60, 0x40
_KAFKA_LZ4_BLOCK = 64 * 1024
# (xxh32(FLG BD) >> 8) & 0xFF, and the legacy variant over magic number + FLG BD.
_KAFKA_LZ4_HC = {False: 0x82, True: 0x1A}
_LZ4_UNCOMPRESSED_BIT = 0x80000000


class DecompressionFailed(Exception):
    """The compressed bytes could not be decompressed; `str()` says why."""


class DecompressedTooLarge(DecompressionFailed):
    def __init__(self, limit: int):
        super().__init__(f"decompressed size exceeds {format_size(limit)} limit")
        self.limit = limit


def format_size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"


def codec_name(codec_id: int) -> str:
    return CODEC_NAMES[codec_id] if 0 <= codec_id < len(CODEC_NAMES) else f"unknown({codec_id})"


def decompress(codec_id: int, data, limit: int) -> bytearray:
    """Decompress `data` (any buffer) with a Kafka codec; raise DecompressionFailed."""
    try:
        if codec_id == 1:
            isize = struct.unpack_from("<I", data, len(data) - 4)[0] if len(data) >= 4 else 0
            hint = min(isize, _DEFLATE_MAX_RATIO * len(data))
            return _into_growing_buffer(cramjam.gzip.decompress_into, data, limit, hint)
        if codec_id == 2:
            return _snappy(data, limit)
        if codec_id == 3:
            return _lz4_frame(data, limit)
        if codec_id == 4:
            guess = _ZSTD_GUESS_RATIO * len(data)
            return _into_growing_buffer(cramjam.zstd.decompress_into, data, limit,
                                        min(_zstd_content_size(data) or guess, guess))
    except cramjam.DecompressionError as exc:
        raise DecompressionFailed(f"{codec_name(codec_id)}: {exc}") from None
    raise DecompressionFailed(f"unknown compression codec {codec_id}")


class RecentBatches:
    """The batches decompressed last, found again by their compressed bytes. A capture taken at a broker holds
    most batches several times: in the Produce request that carried it and in the Fetch response of every
    consumer that read it, the same compressed bytes each time (a broker hands batches out as they were
    produced), and consumers read close behind producers. Holds at most `most` decompressed bytes, and no batch
    of more than half of them; a batch found again is compared byte for byte, not trusted to its checksum."""

    def __init__(self, most: int):
        self._entries: OrderedDict = OrderedDict()  # (codec, crc32c, length) -> (compressed bytes, decompressed)
        self._held = 0
        self._most = most

    def decompress(self, codec_id: int, data, limit: int) -> bytearray:
        """As decompress(), but that the same compressed bytes give the same bytearray: nobody may change it."""
        key = (codec_id, crc32c(data), len(data))
        found = self._entries.get(key)
        if found is not None and len(found[1]) <= limit and found[0] == bytes(data):
            self._entries.move_to_end(key)
            return found[1]
        out = decompress(codec_id, data, limit)
        if len(out) <= self._most // 2:
            if found is not None:  # other bytes of the same checksum, or a smaller limit: the latest is kept
                self._held -= len(found[1])
            self._entries[key] = (bytes(data), out)
            self._entries.move_to_end(key)
            self._held += len(out)
            while self._held > self._most:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._held -= len(dropped)
        return out


def crc32c(data) -> int:
    # Imported on first use: the crc32c package takes ~60 ms to import, and the one-line view needs no CRC and
    # decompresses nothing.
    from crc32c import crc32c as compute

    globals()["crc32c"] = compute
    return compute(data)


# What each process keeps of the batches it decompressed (the walker's decompression goes through it): a
# consumer's batch read within 8 MiB of others' after its producer's (a second or so of busy traffic) is not
# decompressed again. Measured on two records-heavy recordings (batches of 0.3-2 MB, fetched twice each): 8 MiB
# finds every batch seen again in both, 4 MiB in one and a fifth of them in the other.
RECENT_BATCHES = RecentBatches(8 * MiB)


def _zstd_content_size(data) -> int | None:
    """The decompressed size a zstd frame's header states, if it does (RFC 8878, 3.1.1.1)."""
    if len(data) < 6 or bytes(data[:4]) != ZSTD_MAGIC:
        return None
    descriptor = data[4]
    size_flag, single_segment, dictionary_flag = descriptor >> 6, descriptor >> 5 & 1, descriptor & 3
    size_bytes = (single_segment, 2, 4, 8)[size_flag]
    if not size_bytes:
        return None
    at = 5 + (not single_segment) + (0, 1, 2, 4)[dictionary_flag]
    if at + size_bytes > len(data):
        return None
    size = int.from_bytes(data[at:at + size_bytes], "little")
    return size + 256 if size_bytes == 2 else size


def _into_growing_buffer(decompress_into, data, limit: int, hint: int) -> bytearray:
    size = min(limit, max(hint, _FIRST_GUESS_MIN))
    while True:
        out = unfilled(size)  # trimmed to what the codec wrote, or dropped
        try:
            n = decompress_into(data, out)
        except cramjam.DecompressionError as exc:
            if _OUTPUT_FULL not in str(exc):
                raise
            if size >= limit:
                raise DecompressedTooLarge(limit) from None
            out = None  # free it before the next, larger try
            size = min(limit, size * 4)
            continue
        del out[n:]  # shrinks in place: no second copy of the output
        return out


def _snappy(data, limit: int) -> bytearray:
    if bytes(data[:8]) != XERIAL_MAGIC:
        return _snappy_blocks([memoryview(data)], limit)
    if len(data) < _XERIAL_HEADER.size:
        raise DecompressionFailed("snappy: xerial header cut short")
    blocks = []
    pos, end = _XERIAL_HEADER.size, len(data)
    while pos < end:
        if pos + 4 > end:
            raise DecompressionFailed(f"snappy: xerial block length cut short at byte {pos}")
        (n,) = struct.unpack_from(">i", data, pos)
        if n < 0 or pos + 4 + n > end:
            raise DecompressionFailed(f"snappy: xerial block at byte {pos} claims {n} bytes, {end - pos - 4} left")
        blocks.append(memoryview(data)[pos + 4:pos + 4 + n])
        pos += 4 + n
    return _snappy_blocks(blocks, limit)


def _snappy_blocks(blocks: list[memoryview], limit: int) -> bytearray:
    sizes = []
    total = 0
    for block in blocks:
        n = cramjam.snappy.decompress_raw_len(block)
        if n > _SNAPPY_MAX_RATIO * len(block):
            raise DecompressionFailed(f"snappy: a block of {len(block)} bytes claims {n} bytes decompressed, "
                                      f"more than it can make")
        total += n
        if total > limit:
            raise DecompressedTooLarge(limit)
        sizes.append(n)
    out = unfilled(total)
    view = memoryview(out)
    pos = 0
    for block, n in zip(blocks, sizes):
        written = cramjam.snappy.decompress_raw_into(block, view[pos:pos + n])
        if written != n:  # every byte of `out` is written, or it is dropped
            raise DecompressionFailed(f"snappy: a block claims {n} bytes decompressed and makes {written}")
        pos += n
    return out


def _lz4_frame(data, limit: int) -> bytearray:
    end = len(data)
    if end < 7 or bytes(data[:4]) != LZ4_MAGIC:
        raise DecompressionFailed("lz4: not an lz4 frame (bad magic number)")
    flg, bd = data[4], data[5]
    if flg >> 6 != 1:
        raise DecompressionFailed(f"lz4: frame version {flg >> 6} is not 1")
    if not flg & 0x20:
        return _into_growing_buffer(cramjam.lz4.decompress_into, data, limit, 8 * end)
    block_max = 1 << (2 * ((bd >> 4) & 7) + 8)
    if block_max < _KAFKA_LZ4_BLOCK:
        raise DecompressionFailed(f"lz4: invalid block size code {(bd >> 4) & 7}")
    has_block_checksum = bool(flg & 0x10)
    pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0) + 1  # + content size, dict id, HC
    blocks = []  # (start, size, the most it can make, or None: stored as it is) of each block
    most_made = 0  # the output's size
    while True:
        if pos + 4 > end:
            raise DecompressionFailed("lz4: frame ends without an end mark")
        (word,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if word == 0:
            break
        size = word & ~_LZ4_UNCOMPRESSED_BIT
        if size > block_max or pos + size > end:
            raise DecompressionFailed(f"lz4: block of {size} bytes at byte {pos - 4} does not fit")
        most = None if word & _LZ4_UNCOMPRESSED_BIT else min(block_max, _LZ4_MAX_RATIO * size + _LZ4_MAX_EXTRA)
        blocks.append((pos, size, most))
        most_made += size if most is None else most
        pos += size + (4 if has_block_checksum else 0)
    # Each block decompressed where it goes, instead of appended to a growing output
    out = unfilled(min(most_made, limit))
    made = 0
    with memoryview(data) as source, memoryview(out) as into:
        for start, size, most in blocks:
            block = source[start:start + size]
            room = len(out) - made
            if most is None:
                if size > room:
                    raise DecompressedTooLarge(limit)
                into[made:made + size] = block
                made += size
                continue
            if most <= room:
                made += cramjam.lz4.decompress_block_into(block, into[made:made + most])
                continue
            # near the limit: apart, to tell a block that passes it from a damaged one
            scratch = bytearray(most)
            n = cramjam.lz4.decompress_block_into(block, scratch)
            if n > room:
                raise DecompressedTooLarge(limit)
            into[made:made + n] = memoryview(scratch)[:n]
            made += n
    del out[made:]
    return out


# --- compression, for building test frames -----------------------------------

def compress(codec_id: int, data: bytes, *, xerial_snappy: bool = True,
             legacy_lz4_checksum: bool = False) -> bytes:
    """Compress as Kafka clients do: snappy xerial-framed (Java) or raw (librdkafka),
    lz4 in Kafka's frame layout, optionally with the magic-0 header checksum."""
    if codec_id == 1:
        return bytes(cramjam.gzip.compress(data))
    if codec_id == 2:
        if not xerial_snappy:
            return bytes(cramjam.snappy.compress_raw(data))
        parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
        for i in range(0, len(data), _XERIAL_BLOCK_SIZE):
            block = bytes(cramjam.snappy.compress_raw(data[i:i + _XERIAL_BLOCK_SIZE]))
            parts += [struct.pack(">i", len(block)), block]
        return b"".join(parts)
    if codec_id == 3:
        parts = [LZ4_MAGIC, bytes([_KAFKA_LZ4_FLG, _KAFKA_LZ4_BD, _KAFKA_LZ4_HC[legacy_lz4_checksum]])]
        for i in range(0, len(data), _KAFKA_LZ4_BLOCK):
            chunk = data[i:i + _KAFKA_LZ4_BLOCK]
            block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
            if len(block) >= len(chunk):
                block, flag = chunk, _LZ4_UNCOMPRESSED_BIT
            else:
                flag = 0
            parts += [struct.pack("<I", len(block) | flag), block]
        parts.append(b"\0\0\0\0")
        return b"".join(parts)
    if codec_id == 4:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"cannot compress with codec {codec_id}")
