"""Kafka codecs: every framing real clients write, and the bound on decompressed bytes."""

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import cramjam
import lz4.frame
import pytest
from kafka import codec as kafka_python_codec

from kafkasniff.protocol import compression
from kafkasniff.protocol.compression import (
    CODEC_IDS, DecompressedTooLarge, DecompressionFailed, MiB, RecentBatches, compress, decompress)

REPO = Path(__file__).resolve().parents[1]
# 300 KB of text that compresses about 10:1, spanning several lz4 and xerial blocks.
PAYLOAD = b"".join(b"record %06d: some repetitive kafka payload\n" % i for i in range(7000))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_own_compression_round_trips(codec):
    compressed = compress(CODEC_IDS[codec], PAYLOAD)
    assert len(compressed) < len(PAYLOAD) // 4
    assert decompress(CODEC_IDS[codec], compressed, 64 * MiB) == PAYLOAD


def test_snappy_xerial_framing_and_raw_blocks():
    xerial = compress(2, PAYLOAD)
    assert xerial[:16] == b"\x82SNAPPY\x00" + b"\0\0\0\x01" + b"\0\0\0\x01"
    raw = compress(2, PAYLOAD, xerial_snappy=False)
    assert raw[:1] != b"\x82"
    assert decompress(2, xerial, 64 * MiB) == PAYLOAD
    assert decompress(2, raw, 64 * MiB) == PAYLOAD


def test_kafka_python_codecs_decode():
    """Frames as kafka-python writes them: xerial snappy, lz4 with content size (python-lz4), zstd."""
    assert decompress(1, kafka_python_codec.gzip_encode(PAYLOAD), 64 * MiB) == PAYLOAD
    assert decompress(2, kafka_python_codec.snappy_encode(PAYLOAD), 64 * MiB) == PAYLOAD
    framed = kafka_python_codec.lz4_encode(PAYLOAD)
    assert framed[4] & 0x08  # content size present: the descriptor is 8 bytes longer
    assert decompress(3, framed, 64 * MiB) == PAYLOAD
    assert decompress(4, kafka_python_codec.zstd_encode(PAYLOAD), 64 * MiB) == PAYLOAD


def test_lz4_with_block_and_content_checksums():
    framed = lz4.frame.compress(PAYLOAD, block_linked=False, block_checksum=True,
                                content_checksum=True, block_size=lz4.frame.BLOCKSIZE_MAX256KB)
    assert decompress(3, framed, 64 * MiB) == PAYLOAD


def test_lz4_linked_blocks_go_to_cramjam_frame_decoder():
    framed = bytes(cramjam.lz4.compress(PAYLOAD))
    assert not framed[4] & 0x20  # cramjam links blocks by default
    assert decompress(3, framed, 64 * MiB) == PAYLOAD


def test_lz4_legacy_header_checksum_is_accepted():
    """Magic-0 producers hashed magic number + descriptor; the standard HC hashes the descriptor only."""
    standard = compress(3, PAYLOAD)
    legacy = compress(3, PAYLOAD, legacy_lz4_checksum=True)
    assert standard[:7] == bytes.fromhex("04224d18604082")
    assert legacy[:7] == bytes.fromhex("04224d1860401a")
    assert bytes(cramjam.lz4.decompress(standard)) == PAYLOAD
    with pytest.raises(cramjam.DecompressionError, match="headerChecksum"):
        cramjam.lz4.decompress(legacy)
    assert decompress(3, legacy, 64 * MiB) == PAYLOAD


def test_lz4_blocks_stored_and_compressed_are_each_decompressed_in_place():
    """Each block is decompressed where it goes in an output sized by what the blocks can make at most: a stored
    block (its size's high bit set) beside compressed ones, to the byte, and the limit to the byte."""
    stored, rest = PAYLOAD[:1000], PAYLOAD[1000:31000]  # blocks of at most 64 KiB decompressed
    compressed = bytes(cramjam.lz4.compress_block(rest, store_size=False))
    frame = (compress(3, b"")[:7] + struct.pack("<I", len(stored) | 0x80000000) + stored
             + struct.pack("<I", len(compressed)) + compressed + struct.pack("<I", 0))
    assert decompress(3, frame, 64 * MiB) == stored + rest == decompress(3, frame, 31000)
    for limit in (31000 - 1, len(stored) - 1):
        with pytest.raises(DecompressedTooLarge, match=f"exceeds {limit} bytes limit"):
            decompress(3, frame, limit)


def test_exact_limit_is_allowed_one_byte_less_is_not():
    for codec in (1, 2, 3, 4):
        compressed = compress(codec, PAYLOAD)
        assert decompress(codec, compressed, len(PAYLOAD)) == PAYLOAD
        with pytest.raises(DecompressedTooLarge, match=f"exceeds {len(PAYLOAD) - 1} bytes limit"):
            decompress(codec, compressed, len(PAYLOAD) - 1)


@pytest.mark.parametrize("codec, damage", [
    (1, lambda b: b[:len(b) // 2]),
    (2, lambda b: b[:16] + b"\x7f\xff\xff\xff"),
    (3, lambda b: b[:-4]),
    (3, lambda b: b"\x00" + b[1:]),
    (4, lambda b: b[:len(b) // 2]),
    (5, lambda b: b),
])
def test_damaged_input_raises_decompression_failed(codec, damage):
    with pytest.raises(DecompressionFailed) as info:
        decompress(codec, damage(compress(min(codec, 4), PAYLOAD)), 64 * MiB)
    assert not isinstance(info.value, DecompressedTooLarge)


BOMB_SCRIPT = textwrap.dedent("""
    import resource, sys
    import cramjam
    from kafkasniff.protocol.compression import compress, MiB
    from kafkasniff.protocol.records import decode_records
    from kafkasniff.protocol.records_encoder import Record, encode_record_batch

    codec = sys.argv[1]
    zeros = bytes(MiB)
    # 200 MiB of zeros, made cheaply: gzip members and zstd frames concatenate; lz4 and
    # xerial snappy repeat their blocks.
    if codec == "gzip":
        bomb = bytes(cramjam.gzip.compress(zeros)) * 200
    elif codec == "zstd":
        bomb = bytes(cramjam.zstd.compress(zeros)) * 200
    elif codec == "snappy":
        one = compress(2, zeros)
        bomb = one[:16] + one[16:] * 200
    else:
        one = compress(3, zeros)
        bomb = one[:7] + one[7:-4] * 200 + one[-4:]
    buf = (encode_record_batch([], codec=codec, record_count=1, compressed_payload=bomb)
           + encode_record_batch([Record(value=b"after the bomb")], base_offset=1))
    del zeros
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    items = decode_records(buf, 0, len(buf))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(items[0]["records"].note)
    print(items[1].value["record_count"], items[1]["records"].children[0].value["value"].decode())
    print((after - before) // 1024)
""")


@pytest.mark.parametrize("codec", ["gzip", "zstd", "snappy", "lz4"])
def test_decompression_bomb_stops_at_the_bound(codec):
    """200 MiB of zeros against the 64 MiB default bound, in a fresh process so the peak RSS is its own."""
    out = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, codec], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    note, after_bomb, peak_growth_mib = out.stdout.splitlines()
    assert note == "decompressed size exceeds 64 MiB limit; records not shown"
    assert after_bomb == "1 after the bomb"
    assert int(peak_growth_mib) <= 64 + 8


@pytest.mark.parametrize("size", [0, 200, 256, 300, 65_791, 70_000, 5_000_000])
def test_zstd_frames_that_state_their_size_are_read_into_a_buffer_of_that_size(size):
    """The size field takes 1, 2 (256 added), 4 or 8 bytes as the value needs; a frame that does not state it (as
    streams are written) is read as well, into a guessed buffer grown as needed."""
    import zstandard

    from kafkasniff.protocol.compression import _zstd_content_size

    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    stated = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    unstated = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert _zstd_content_size(stated) == size
    assert _zstd_content_size(unstated) is None
    assert _zstd_content_size(stated[:5]) is None
    assert decompress(4, stated, 64 * MiB) == data
    assert decompress(4, unstated, 64 * MiB) == data


def _other_payload(n: int) -> bytes:
    return PAYLOAD.replace(b"record", b"r%05d" % n)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_batch_seen_again_is_decompressed_once(codec):
    """The same compressed bytes (a Produce request's batch, then the Fetch responses that hand it out again),
    from other buffers, give the one bytearray; other bytes give their own."""
    recent = RecentBatches(8 * MiB)
    compressed = compress(CODEC_IDS[codec], PAYLOAD)
    first = recent.decompress(CODEC_IDS[codec], memoryview(compressed), 64 * MiB)
    again = recent.decompress(CODEC_IDS[codec], memoryview(bytearray(b"x" + compressed))[1:], 64 * MiB)
    assert first == PAYLOAD and again is first
    other = recent.decompress(CODEC_IDS[codec], compress(CODEC_IDS[codec], _other_payload(1)), 64 * MiB)
    assert other == _other_payload(1)
    assert recent.decompress(CODEC_IDS[codec], compressed, 64 * MiB) is first


def test_a_batch_seen_again_keeps_to_each_calls_limit():
    recent = RecentBatches(8 * MiB)
    compressed = compress(CODEC_IDS["zstd"], PAYLOAD)
    assert recent.decompress(4, compressed, 64 * MiB) == PAYLOAD
    with pytest.raises(DecompressedTooLarge):
        recent.decompress(4, compressed, len(PAYLOAD) - 1)
    assert recent.decompress(4, compressed, len(PAYLOAD)) == PAYLOAD


def test_recent_batches_hold_at_most_their_bytes():
    """Past `most` decompressed bytes the least recently used go; a batch of more than half of them is not kept."""
    recent = RecentBatches(4 * len(PAYLOAD))
    batches = [compress(CODEC_IDS["gzip"], _other_payload(n)) for n in range(5)]
    kept = [recent.decompress(1, batch, 64 * MiB) for batch in batches[:4]]
    assert recent.decompress(1, batches[0], 64 * MiB) is kept[0]  # the first is now the most recently used
    recent.decompress(1, batches[4], 64 * MiB)  # ... so the second goes
    assert recent.decompress(1, batches[1], 64 * MiB) is not kept[1]
    assert recent.decompress(1, batches[0], 64 * MiB) is kept[0]
    small = RecentBatches(2 * len(PAYLOAD) - 2)
    big = compress(CODEC_IDS["gzip"], PAYLOAD)
    assert small.decompress(1, big, 64 * MiB) is not small.decompress(1, big, 64 * MiB)


def test_recent_batches_compare_the_bytes_not_only_their_checksum(monkeypatch):
    monkeypatch.setattr(compression, "crc32c", lambda data: 7)  # every batch's checksum the same
    recent = RecentBatches(8 * MiB)
    one, two = (compress(CODEC_IDS["snappy"], _other_payload(n)) for n in (1, 2))
    assert len(one) == len(two)
    assert recent.decompress(2, one, 64 * MiB) == _other_payload(1)
    assert recent.decompress(2, two, 64 * MiB) == _other_payload(2)
    assert recent.decompress(2, one, 64 * MiB) == _other_payload(1)
