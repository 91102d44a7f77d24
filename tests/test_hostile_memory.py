"""Hostile records stay within bounded memory in every view, and say what they are.

Small captures (a few KB) whose record batches decompress to 63 MiB: of zeros (zstd, sixteen such batches in
one frame, a legacy gzip wrapper), and of the smallest valid records (9.4 million of them). Each view runs as
its own process; its peak resident memory must stay under 200 MB. These captures are far below the size at
which decode starts worker processes, so one process is the whole tree; with `-j 2` (as a big capture holding
such a message would be decoded) the whole tree must stay under it too, and the output be the same.
"""

from __future__ import annotations

import json

import cramjam
import pytest

from measured import decode_measured
from pcapkit import TcpConversation, write_pcap
from kafkasniff.protocol.compression import MiB
from kafkasniff.protocol.encoder import encode_request
from kafkasniff.protocol.records_encoder import encode_message, encode_record_batch

PEAK_LIMIT_MB = 200
INFLATED = 63 * MiB
TINY_RECORD = bytes([12, 0, 0, 0, 1, 1, 0])  # length 6: attributes, deltas 0, null key and value, no headers
TINY_COUNT = INFLATED // len(TINY_RECORD)
VIEWS = {"line": [], "json": ["--json"], "tree": ["-V"], "hex": ["--hex"], "stats": ["--stats", "--json"]}


def _capture(path, records: bytes):
    conversation = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092))
    conversation.send(True, encode_request(0, 9, 1, "hostile", {"Acks": 0, "TimeoutMs": 1000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": records}]}]}))
    return write_pcap(path, conversation.close())


def _zstd_zeros_batch() -> bytes:
    return encode_record_batch([], codec="zstd", compressed_payload=bytes(cramjam.zstd.compress(bytes(INFLATED))),
                               record_count=1)


CASES = {
    "zstd zeros": lambda: _zstd_zeros_batch(),
    "16 zstd batches of zeros": lambda: _zstd_zeros_batch() * 16,
    "legacy gzip wrapper of zeros": lambda: encode_message(
        magic=1, value=bytes(cramjam.gzip.compress(bytes(INFLATED))), attributes=1, timestamp=0),
    "9.4 million tiny records": lambda: encode_record_batch(
        [], codec="zstd", compressed_payload=bytes(cramjam.zstd.compress(TINY_RECORD * TINY_COUNT)),
        record_count=TINY_COUNT),
}


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    return {name: _capture(folder / f"case{i}.pcap", make()) for i, (name, make) in enumerate(CASES.items())}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("case", CASES)
def test_hostile_records_stay_in_bounded_memory(captures, case, view):
    done = decode_measured(captures[case], VIEWS[view])
    assert done.returncode == 0, done.stderr
    head, records = done.head, done.records
    assert done.peak_mb < PEAK_LIMIT_MB, f"{case}, {view}: {done.peak_mb:.0f} MB"
    if view != "json":
        return
    if case == "9.4 million tiny records":
        assert records == TINY_COUNT  # every record, streamed
        return
    (batches,) = [p["records"] for p in json.loads(head)["body"]["topic_data"][0]["partition_data"]]
    if case == "zstd zeros":
        assert batches[0]["records"] == [{"malformed": {"offset": 1, "reason": (
            "record has no attributes byte (and 66060287 more that do not decode: 66060288 bytes in all)")}}]
    elif case == "16 zstd batches of zeros":
        assert len(batches) == 16 and len(batches[0]["records"]) == 1
        assert {b["note"] for b in batches[1:]} == {
            "decompressed size of the message's batches exceeds 64 MiB limit; records not shown"}
    elif case == "legacy gzip wrapper of zeros":
        (wrapper,) = batches
        assert wrapper["records"] == [{"malformed": {"offset": 8, "reason": (
            "length 0 leaves no room for a magic byte (and 5505023 more that do not decode: 66060288 bytes in all)"
        )}}]


@pytest.mark.parametrize("view", ["json", "tree"])
@pytest.mark.parametrize("case", CASES)
def test_hostile_records_on_workers_stay_in_bounded_memory(captures, case, view):
    """A worker writes a message with records in parts as it makes them (JSON, like a tree): 9.4 million records
    of 2.5 KB on the wire are 604 MB of JSON, which a worker once made whole, pickled and sent (1.8 GB in all)."""
    one_process = decode_measured(captures[case], [*VIEWS[view], "-j", "1"])
    done = decode_measured(captures[case], [*VIEWS[view], "-j", "2"])
    assert done.returncode == 0, done.stderr
    assert done.tree_mb < PEAK_LIMIT_MB and done.peak_mb < PEAK_LIMIT_MB, f"{case}, {view}: {done.tree_mb:.0f} MB"
    assert (done.size, done.records, done.head) == (one_process.size, one_process.records, one_process.head)
