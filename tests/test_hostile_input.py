"""Inputs built to exhaust time or memory: each costs time and memory in proportion to its bytes, in every view,
and what it holds is still shown (issue 18).

Every capture is made here; each view runs as a process of its own (tests/measured.py), whose time and peak
resident memory are bounded. The captures are below the size at which decode starts worker processes, so one
process is the whole tree.
"""

from __future__ import annotations

import json
import struct

import cramjam
import pytest

from measured import decode_measured
from pcapkit import TcpConversation, write_pcap
from kafkasniff.protocol.compression import MiB
from kafkasniff.protocol.encoder import encode_request
from kafkasniff.protocol.records_encoder import Record, encode_record_batch

VIEWS = {"line": [], "json": ["--json"], "tree": ["-V"], "hex": ["--hex"], "stats": ["--stats", "--json"]}


def conversation_capture(path, *frames: tuple[bool, bytes]):
    """A captured TCP connection (handshake included) carrying the frames, (from_client, bytes) each."""
    conversation = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092))
    for from_client, frame in frames:
        conversation.send(from_client, frame)
    return write_pcap(path, conversation.close())


def produce(records: bytes) -> bytes:
    return encode_request(0, 9, 1, "hostile", {"Acks": 0, "TimeoutMs": 1000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": records}]}]})


def body_of(done) -> dict:
    return json.loads(done.head.split(b"\n", 1)[0])["body"]


# --- size fields that claim more than their bytes hold (item 4) ----------------------------------------------

CLAIMED = 64 * MiB - 1


def _lying_gzip() -> bytes:
    """A gzip stream of 100 bytes whose ISIZE trailer claims CLAIMED bytes."""
    stream = bytes(cramjam.gzip.compress(b"x" * 100))
    return stream[:-4] + struct.pack("<I", CLAIMED)


def _lying_snappy() -> bytes:
    """A raw snappy block of 100 bytes whose length varint claims CLAIMED bytes."""
    block = bytes(cramjam.snappy.compress_raw(b"y" * 100))
    assert block[0] == 100
    return bytes([0xFF, 0xFF, 0xFF, 0x1F]) + block[1:]


@pytest.fixture(scope="module")
def lying_sizes(tmp_path_factory):
    records = (encode_record_batch([], codec="gzip", compressed_payload=_lying_gzip(), record_count=1)
               + encode_record_batch([], codec="snappy", compressed_payload=_lying_snappy(), record_count=1,
                                     base_offset=1)
               + encode_record_batch([Record(value=b"after them")], base_offset=2))
    frame = produce(records)
    assert len(frame) < 450
    return conversation_capture(tmp_path_factory.mktemp("sizes") / "sizes.pcap", (True, frame))


@pytest.mark.parametrize("view", VIEWS)
def test_size_fields_do_not_size_buffers(lying_sizes, view):
    """A 430-byte frame whose gzip ISIZE and snappy length claim 64 MiB: nothing near that is allocated."""
    done = decode_measured(lying_sizes, VIEWS[view])
    assert done.returncode == 0, done.stderr
    assert done.peak_mb < 60, f"{view}: {done.peak_mb:.0f} MB"
    assert done.seconds < 10
    if view == "json":
        gzip, snappy, plain = body_of(done)["topic_data"][0]["partition_data"][0]["records"]
        assert gzip["note"] == "decompression failed: gzip: corrupt gzip stream does not have a matching checksum"
        assert snappy["note"] == ("decompression failed: snappy: a block of 12 bytes claims 67108863 bytes "
                                  "decompressed, more than it can make")
        assert [r["value"]["text"] for r in plain["records"]] == ["after them"]
