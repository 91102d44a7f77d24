"""Capture files to TCP segments as Arrow batches (runs on Spark workers), with the project's reader.

Each segment row carries its connection's key (both endpoints, the same for either direction),
its capture time, the number of its file in the run and its index in that file. The job
hashes the key to pick a partition and sorts by (key, time, file, index): the decoder of a
connection sees its packets in the order of one capture merged from all inputs, so rotated
files (`tcpdump -C/-G`) and overlapping inputs read as the capture they were cut from.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

import pyarrow as pa

from kafkasniff.capture.files import CaptureError, CaptureReader, open_capture
from kafkasniff.capture.packets import TcpSegment

SEGMENT_SCHEMA = pa.schema([
    ("key", pa.string()), ("ts", pa.float64()), ("file", pa.int32()), ("index", pa.int64()),
    ("src", pa.string()), ("sport", pa.int32()), ("dst", pa.string()), ("dport", pa.int32()),
    ("seq", pa.int64()), ("ack", pa.int64()), ("flags", pa.int32()), ("payload", pa.binary()),
    ("missing", pa.int64()),
])
SEGMENT_DDL = ("key string, ts double, file int, index bigint, src string, sport int, dst string, dport int, "
               "seq bigint, ack bigint, flags int, payload binary, missing bigint")
# A batch is cut at this many segments or payload bytes, whichever comes first: big enough to make the
# Arrow conversion cheap per segment, small enough to keep a worker's memory flat.
BATCH_SEGMENTS = 16384
BATCH_BYTES = 8 << 20

ReadReport = Callable[[dict], None]  # receives {"files", "bytes", "frames", "segments", "warnings"}


def connection_key(seg: TcpSegment) -> str:
    """The same key for both directions of a connection."""
    a, b = f"{seg.src} {seg.sport}", f"{seg.dst} {seg.dport}"
    return f"{a} {b}" if (seg.src, seg.sport) <= (seg.dst, seg.dport) else f"{b} {a}"


def read_local(path: str, name: str, file_number: int, report: ReadReport) -> Iterator[pa.RecordBatch]:
    try:
        reader = open_capture(path)
    except CaptureError as error:
        report({"warnings": [f"skipped {name}: {str(error).removeprefix(path + ': ')}"]})
        return
    with reader:
        segments = yield from _segment_batches(reader, file_number)
        report({"files": 1, "bytes": reader.total_size, "frames": reader.frames_read, "segments": segments,
                "warnings": [w.replace(path, name, 1) for w in reader.warnings]})


def read_spooled(name: str, content: bytes, file_number: int, report: ReadReport) -> Iterator[pa.RecordBatch]:
    """A file Spark read whole (any Hadoop file system): spooled to local disk for the reader."""
    fd, path = tempfile.mkstemp(prefix="kafkasniff-", suffix=".capture")
    try:
        with os.fdopen(fd, "wb") as spool:
            spool.write(content)
        yield from read_local(path, name, file_number, report)
    finally:
        os.unlink(path)


def _segment_batches(reader: CaptureReader, file_number: int):
    """Arrow batches of the reader's segments; returns how many segments there were."""
    rows: list[tuple] = []
    size = count = 0
    for seg in reader.segments():
        rows.append((connection_key(seg), count, *seg))
        count += 1
        size += len(seg.payload)
        if len(rows) >= BATCH_SEGMENTS or size >= BATCH_BYTES:
            yield _batch(rows, file_number)
            rows, size = [], 0
    if rows:
        yield _batch(rows, file_number)
    return count


def _batch(rows: list[tuple], file_number: int) -> pa.RecordBatch:
    key, index, ts, src, sport, dst, dport, seq, ack, flags, payload, missing = zip(*rows)
    columns = (key, ts, [file_number] * len(rows), index, src, sport, dst, dport, seq, ack, flags, payload, missing)
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, SEGMENT_SCHEMA)],
                                      schema=SEGMENT_SCHEMA)
