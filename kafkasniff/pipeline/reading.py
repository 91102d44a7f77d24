"""Capture files to keyed TCP segments (runs on Spark workers), with the project's reader.

Each segment is keyed (4-tuple, first time of its file, file name, index in the file). The
job hashes the 4-tuple to pick a partition and sorts by the whole key, so the decoder of a
connection sees its packets file after file in the order the files began, and within a
file in the order they were written: files rotated by `tcpdump -C/-G` are read back as the
one capture they were cut from.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

from kafkasniff.capture.files import CaptureError, CaptureReader, open_capture
from kafkasniff.capture.packets import TcpSegment
from kafkasniff.pipeline.connections import connection_key

SegmentKey = tuple[tuple[str, int, str, int], float, str, int]
ReadReport = Callable[[dict], None]  # receives {"files", "bytes", "frames", "segments", "warnings"}


def read_local(path: str, name: str, report: ReadReport) -> Iterator[tuple[SegmentKey, TcpSegment]]:
    try:
        reader = open_capture(path)
    except CaptureError as error:
        report({"warnings": [f"skipped {name}: {str(error).removeprefix(path + ': ')}"]})
        return
    with reader:
        segments = 0
        for segments, keyed in enumerate(_keyed_segments(reader, name), 1):
            yield keyed
        report({"files": 1, "bytes": reader.total_size, "frames": reader.frames_read, "segments": segments,
                "warnings": [w.replace(path, name, 1) for w in reader.warnings]})


def read_spooled(name: str, content: bytes, report: ReadReport) -> Iterator[tuple[SegmentKey, TcpSegment]]:
    """A file Spark read whole (any Hadoop file system): spooled to local disk for the reader."""
    fd, path = tempfile.mkstemp(prefix="kafkasniff-", suffix=".capture")
    try:
        with os.fdopen(fd, "wb") as spool:
            spool.write(content)
        yield from read_local(path, name, report)
    finally:
        os.unlink(path)


def _keyed_segments(reader: CaptureReader, name: str) -> Iterator[tuple[SegmentKey, TcpSegment]]:
    first_ts = None
    for index, seg in enumerate(reader.segments()):
        if first_ts is None:
            first_ts = seg.ts
        yield (connection_key(seg), first_ts, name, index), seg
