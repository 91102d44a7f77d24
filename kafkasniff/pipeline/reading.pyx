# cython: language_level=3
"""Capture files to TCP segments as Arrow batches (runs on Spark workers), with the project's reader.

Each segment row carries its connection's key (both endpoints, the same for either direction),
its capture time, the number of its file in the run, its index in that file and the time its
file had reached there (the latest time of any record up to it: its own, unless the capture's
clock stepped back). The job hashes the key to pick a partition and sorts by (key, time reached,
file, index): the decoder of a connection sees its packets in the order of one capture merged
from all inputs as mergecap merges them (a file's packets in its own order), so rotated files
(`tcpdump -C/-G`) and overlapping inputs read as the capture they were cut from.

A run of local uncompressed files that are not too big skips the shuffle (shard_rows): each of N tasks reads every
file and keeps the connections whose endpoints hash to it (the reader makes no segment of the others' packets),
sorted as a shuffled partition would be, and decodes them (connections.decode_segment_rows). Reading a file costs
a fraction of decoding it, and the segments are never made Arrow batches nor cross into the JVM.

The loop over a file's segments is compiled: in Python it cost twice what reading the packets did.
"""

import heapq
import os
import tempfile
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from libc.math cimport INFINITY

import pyarrow as pa

from kafkasniff.capture.files import CONNECTION_BUCKETS, CaptureError, CaptureReader, open_capture
from kafkasniff.capture.packets import TcpSegment
from kafkasniff.engine.heap import collecting_rarely

# A segment row: its connection's key, its time, where it is in the run (file, index in the file), which way it goes
# (`forward`: from the key's first endpoint to its second; the endpoints are the key's, not repeated in every row,
# which would cost the shuffle and both conversions two strings a segment), the TCP fields after the ports and the
# time its file had reached (CaptureReader.segment_batches_reached), which orders it with (file, index).
SEGMENT_SCHEMA = pa.schema([
    ("key", pa.string()), ("ts", pa.float64()), ("file", pa.int32()), ("index", pa.int64()), ("forward", pa.bool_()),
    ("seq", pa.int64()), ("ack", pa.int64()), ("flags", pa.int32()), ("payload", pa.binary()),
    ("missing", pa.int64()), ("reached", pa.float64()),
])
SEGMENT_DDL = ("key string, ts double, file int, index bigint, forward boolean, seq bigint, ack bigint, flags int, "
               "payload binary, missing bigint, reached double")
SEGMENT_ORDER = ("key", "reached", "file", "index")  # a decode task's rows come sorted by these
_SEGMENT_STRUCT = pa.struct(SEGMENT_SCHEMA)
# A batch is cut at this many segments or payload bytes, whichever comes first: big enough to make the
# Arrow conversion cheap per segment, small enough to keep a worker's memory flat.
BATCH_SEGMENTS = 16384
BATCH_BYTES = 8 << 20
# Connection keys remembered by a read task: a file of countless 4-tuples (a port scan) must not fill memory
KEYS_KEPT = 1 << 16

ReadReport = Callable[[dict], None]  # receives {"files", "bytes", "frames", "segments", "warnings"}


def connection_key(seg: TcpSegment) -> str:
    """The same key for both directions of a connection."""
    return _key_and_direction(seg.src, seg.sport, seg.dst, seg.dport)[0]


def _key_and_direction(src: str, sport: int, dst: str, dport: int) -> tuple[str, bool]:
    """(the connection's key, whether src is the key's first endpoint)."""
    a, b = f"{src} {sport}", f"{dst} {dport}"
    return (f"{a} {b}", True) if (src, sport) <= (dst, dport) else (f"{b} {a}", False)


def key_endpoints(key: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """The key's first and second endpoints, (ip, port) each."""
    first_ip, first_port, second_ip, second_port = key.split(" ")
    return (first_ip, int(first_port)), (second_ip, int(second_port))


def read_local(path: str, name: str, file_number: int, report: ReadReport, int shard=0,
               int shards=1, noted=None) -> Iterator[pa.RecordBatch]:
    """The segments of a local file as Arrow batches; with `shards`, only those of `shard`'s connections, their
    buckets dealt round (a big file is read by several tasks, each reading it whole: see build.READ_TASK_BYTES).
    Shard 0 reports the file, and tells `noted` (a callable) the capture time the file ends at, when it holds TCP
    packets; every shard reports its segments."""
    owners = connection_shares((), shards)
    reader = _opened(path, name, report, shard == 0)
    if reader is None:
        return
    # a batch's rows are thousands of tuples that live until it is sent: the collector's default passes over them
    # cost more than the loop making them
    cdef long long segments = 0
    with reader, collecting_rarely():
        for rows in _segment_rows(reader, file_number, shard, owners):
            segments += len(rows)
            yield _batch(rows)
        report({"segments": segments} if shard else
               {"files": 1, "bytes": reader.total_size, "frames": reader.frames_read, "segments": segments,
                "warnings": [w.replace(path, name, 1) for w in reader.warnings]})
        if noted is not None and shard == 0 and reader.time_reached > -INFINITY:
            noted(reader.time_reached)


cdef object _opened(str path, str name, report, bint tell):
    """The capture's reader; None when it cannot be read, which `report` is told (`tell`) as a warning naming it."""
    try:
        return open_capture(path)
    except CaptureError as error:
        if tell:
            report({"warnings": [f"skipped {name}: {str(error).removeprefix(path + ': ')}"]})
        return None


def connection_shares(paths, int shards):
    """Which of `shards` tasks each connection bucket goes to (CaptureReader.segment_batches' owners), so that the
    tasks get about as many bytes each: the buckets' bytes are counted over the files (bucket_bytes), then the
    biggest bucket goes first, each to the task with the fewest bytes so far (ties: the lower bucket, the lower
    task); buckets without bytes (all of them, without paths) go round. Hashing the connections straight to tasks
    gave a records-heavy run's two tasks 39 and 50 MB of 58 connections, and a few big connections can all land in
    one task; counting only the start of each file did worse still (28 and 61 MB from its first 32 MB: connections
    come and go). The count costs a twentieth of what decoding the same bytes costs (the copy from the page cache,
    for big packets; 40 ns a packet). Drawn once for a run and handed to its tasks: a task drawing its own from a
    file still being written could disagree with another about a connection. None for one task."""
    if shards <= 1:
        return None
    if shards > CONNECTION_BUCKETS:
        raise ValueError(f"at most {CONNECTION_BUCKETS} shares of the connections, not {shards}")
    counts = array("Q", bytes(8 * CONNECTION_BUCKETS))

    def count(path):
        try:
            reader = open_capture(path)
        except CaptureError:
            return  # (the reading says why)
        with reader:
            reader.bucket_bytes(counts)

    # the files side by side: most of a count is reading, which releases the GIL (rotated records-heavy files:
    # 14 -> 9 ms in two threads), and each chunk's counts are added into `counts` under it
    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as threads:
        for _ in threads.map(count, paths):
            pass
    owners = array("H", [bucket % shards for bucket in range(CONNECTION_BUCKETS)])
    loads = [(0, task) for task in range(shards)]
    for bucket in sorted((bucket for bucket in range(CONNECTION_BUCKETS) if counts[bucket]),
                         key=lambda bucket: (-counts[bucket], bucket)):
        load, task = heapq.heappop(loads)
        owners[bucket] = task
        heapq.heappush(loads, (load + counts[bucket], task))
    return owners.tobytes()


def shard_rows(list paths, int shard, owners, report: ReadReport, list times_reached) -> Iterator[list[tuple]]:
    """The segment rows (SEGMENT_SCHEMA's order) of `shard`'s connections (owners: the run's connection_shares;
    None: every connection) in a run's local files (numbered in the list's order, the run's), in the order a
    shuffled partition has them (SEGMENT_ORDER), BATCH_SEGMENTS at a time: held in memory until every file is read,
    so the job takes this path only for files of at most build.UNSHUFFLED_MAX_BYTES in all; before the first,
    `times_reached` gets the capture time each file holding TCP packets ends at. Shard 0 reports the files."""
    # Rows are kept by connection, each connection's in the order read, (file, index): that is their (reached, file,
    # index) order unless files overlap in time, and only then is the connection sorted. Sorting all rows by
    # (key, time, file, index) took a quarter of the reading (470 M of 1,650 M instructions for bench60's half).
    cdef dict connections = {}  # key -> its rows
    cdef list rows
    cdef tuple row
    cdef long long count = 0
    with collecting_rarely():
        for number, path in enumerate(paths):
            reader = _opened(path, path, report, shard == 0)
            if reader is None:
                continue
            with reader:
                for some in _segment_rows(reader, number, shard, owners):
                    for item in <list>some:
                        row = <tuple>item
                        rows = connections.get(row[0])
                        if rows is None:
                            rows = connections[row[0]] = []
                        rows.append(row)
                    count += len(<list>some)
                if shard == 0:
                    report({"files": 1, "bytes": reader.total_size, "frames": reader.frames_read,
                            "warnings": list(reader.warnings)})
                if reader.time_reached > -INFINITY:
                    times_reached.append(reader.time_reached)
        batch = []
        for key in sorted(connections):
            rows = connections.pop(key)
            if not _in_time_order(rows):
                rows.sort(key=_reached_file_index)
            for item in rows:
                batch.append(item)
                if len(batch) == BATCH_SEGMENTS:
                    yield batch
                    batch = []
        if batch:
            yield batch
        report({"segments": count})


cdef bint _in_time_order(list rows):
    """Whether the rows' times reached never go back (read in (file, index) order, they are then in (reached, file,
    index) order)."""
    cdef double last = -INFINITY, reached
    for row in rows:
        reached = (<tuple>row)[10]
        if reached < last:
            return False
        last = reached
    return True


def _reached_file_index(tuple row):
    return row[10], row[2], row[3]


def read_spooled(name: str, content: bytes, file_number: int, report: ReadReport,
                 noted=None) -> Iterator[pa.RecordBatch]:
    """A file Spark read whole (any Hadoop file system): spooled to local disk for the reader."""
    fd, path = tempfile.mkstemp(prefix="kafkasniff-", suffix=".capture")
    try:
        with os.fdopen(fd, "wb") as spool:
            spool.write(content)
        yield from read_local(path, name, file_number, report, noted=noted)
    finally:
        os.unlink(path)


def _segment_rows(reader: CaptureReader, int file_number, int shard, owners):
    """The rows (SEGMENT_SCHEMA's order) of the reader's segments of `shard`'s connections (owners: see
    connection_shares; None: every connection), in lists of at most BATCH_SEGMENTS rows or about BATCH_BYTES of
    payload (a batch each)."""
    cdef list rows = []
    cdef dict keys = {}  # each connection's (key, forward), made once for its 4-tuple's packets
    cdef long long size = 0, count = 0
    cdef Py_ssize_t at
    cdef tuple seg, found
    for segments, reached in reader.segment_batches_reached(shard, owners):
        at = -1
        for item in <list>segments:
            count += 1  # (another shard's segment is None: it keeps its index)
            at += 1
            if item is None:
                continue
            seg = <tuple>item  # a TcpSegment: (ts, src, sport, dst, dport, seq, ack, flags, payload, missing)
            ends = seg[1:5]
            found = keys.get(ends)
            if found is None:
                if len(keys) >= KEYS_KEPT:
                    keys.clear()
                found = keys[ends] = _key_and_direction(*ends)
            payload = seg[8]
            rows.append((found[0], seg[0], file_number, count - 1, found[1], seg[5], seg[6], seg[7], payload,
                         seg[9], seg[0] if reached is None else reached[at]))
            size += len(<bytes>payload)
            if len(rows) >= BATCH_SEGMENTS or size >= BATCH_BYTES:
                yield rows
                rows, size = [], 0
    if rows:
        yield rows


def _batch(rows: list[tuple]) -> pa.RecordBatch:
    # rows as a struct array: pyarrow converts the tuples in one pass, where a list per column costs a zip first
    return pa.RecordBatch.from_struct_array(pa.array(rows, _SEGMENT_STRUCT))
