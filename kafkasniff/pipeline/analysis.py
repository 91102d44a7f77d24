"""The analyses of a whole run (consumer groups, lag, partition traffic) on Spark: the `groups` and
`partitions` tables, equal to what `kafkasniff groups --json` and `lag --json` say of the same captures.

The analyses need every message of the run in capture order, across connections: a generation is made of
the heartbeats of all its members' connections; a fetch counts towards the group whose latest generation,
at that moment, gives the partition to that client; a commit is measured against the log end that every
producer's and consumer's connection has shown so far; topic ids are named by whichever connection's
Metadata came first. Cut the run by group or by partition and each part would need the others' state at
every moment. So they run once, in one task, over the whole run's messages, while the decoding, which is
where the work is, stays spread over the tasks:

- each decode task makes, of each message, what the analyses read of it (analyses.wire.Seen: bodies of the
  group APIs, partition facts without records, a few hundred bytes), keyed by the capture position of
  the segment that completed it (the time its file had reached, file, index, and a sequence number for messages
  ending in the same segment); messages a wait's end releases (a hole given up, at a multiple of the sweep
  interval: stream.tcp) before the segments of that time, and those the connection's end releases after every
  segment, in the order the connections were opened (where their first packets are),
  and stages them sorted by that key (`StagedSeen`: sorted runs of a bounded size, at most a few files per
  task);
- one task of the finishing job merges the staged files in key order, one batch of each at a time
  (memory bounded by the number of decode tasks, not the run), feeds one Insight, and writes both tables.

The key is the order `decode` sees a single capture in, and the order the pipeline's shuffle gives the
segments of several inputs (time reached, then file, then index); connections are told apart by their
connection id, where `decode` tells them apart by object.
"""

from __future__ import annotations

import array
import contextlib
import marshal
import math

import numpy as np
import pyarrow as pa

from kafkasniff.analyses.insight import Insight
from kafkasniff.analyses.wire import PlainSeens
from kafkasniff.engine.heap import collecting_rarely
from kafkasniff.pipeline.tables import GROUPS, PARTITIONS
from kafkasniff.pipeline.writing import STAGED_SUFFIX, StagedWriter, output_fs, staged_batches, write_rows

STAGED_NAME = "seen"  # the staged files' folder, and their name among the run's facts
_SCHEMA = pa.schema([("ts", pa.float64()), ("file", pa.int32()), ("index", pa.int64()),
                     ("opened_ts", pa.float64()), ("opened_file", pa.int32()), ("opened_index", pa.int64()),
                     ("seq", pa.int64()), ("seen", pa.binary())])
# (seq: the order staged, in a task)
_KEY = [(name, "ascending") for name in ("ts", "file", "index", "opened_ts", "opened_file", "opened_index", "seq")]
BEFORE_THE_PACKETS = -1  # the file (and index) of a Seen released at a time before that time's packets'
IN_A_PACKET = (0.0, 0, 0)  # the `opened` of a Seen a packet released (one connection's: no order among connections)
_BATCH_ROWS = 4096
AT_THE_END = math.inf  # the time key of messages released by a connection's end


class StagedSeen:
    """A decode task's Seen messages with their keys, staged as files sorted by key (writing.StagedWriter). They
    are sorted in runs of at most RUN_BYTES, so that what a task holds does not grow with its share of the capture,
    and the runs merged, so that the analyses' merge holds a few batches per task, not one per run: on the way
    whenever MERGED_AT_ONCE files of one generation are there (a task's runs each span its whole share of the
    capture, connection after connection: a merge holds a batch of each of its files), and at the task's end into
    one file when more than `files_left` are left. Up to `files_left` are left as they are: merging them is a pass
    over every Seen of the task (bench60's two decode tasks each merged three runs, 30-48 ms of ~1.2 s), and the
    analyses' merge takes six files in the time it takes two (42-51 ms against 43-46 ms). How many a task may leave
    depends on how many tasks the run has (files_left): the analyses' merge holds a batch of every file."""

    # Marshalled Seens held before they are sorted and written. bench60 stages 36 MB of them: in one run at the
    # task's end its peak was 466 MB, in runs of 8 MB 370 MB.
    RUN_BYTES = 8 << 20
    MERGED_AT_ONCE = 16

    def __init__(self, out: str, staging: str, task: str, files_left: int = 1) -> None:
        self._filesystem, root = output_fs(out)
        self._files_left = files_left
        self._stem = f"{root}/{staging}/{STAGED_NAME}/{task}"
        # The columns as they come (a task's connections one after another, not in key order): sorted by Arrow
        # when the run is written.
        self._key = _key_columns()
        self._seen: list[bytes] = []
        self._bytes = 0
        self._staged = 0  # Seens in the runs written: the next one's first sequence number
        self._files: list[tuple[str, int, int]] = []  # (path, rows, generation: 0 a run, n + 1 a merge of n's)
        self._named = 0  # files named so far

    def add(self, position: tuple, opened: tuple, plain_seen: tuple) -> None:
        """A Seen released at `position` (time reached, file, index: a packet's; or a time, BEFORE_THE_PACKETS
        twice, or AT_THE_END and BEFORE_THE_PACKETS twice) of the connection whose first packet is at `opened` (the
        same three; IN_A_PACKET for a packet's)."""
        # Marshalled (plain values only, made and read by this run's own tasks, on the one Python version Spark
        # allows its driver and executors): made in half a pickle's time, and a decode task stages a Seen for about
        # every other message.
        seen = marshal.dumps(plain_seen)
        ts, file, index, opened_ts, opened_file, opened_index = self._key  # (a loop over them cost a tenth of a task)
        ts.append(position[0])
        file.append(position[1])
        index.append(position[2])
        opened_ts.append(opened[0])
        opened_file.append(opened[1])
        opened_index.append(opened[2])
        self._seen.append(seen)
        self._bytes += len(seen)
        if self._bytes >= self.RUN_BYTES:
            self._write_run()

    def close(self) -> list[tuple[str, int]]:
        """(staged file, rows) of each file left; none when there was nothing to stage."""
        if self._seen:
            self._write_run()
        if len(self._files) > self._files_left:
            self._merge(self._files)
        return [(path, rows) for path, rows, _ in self._files]

    def _write_run(self) -> None:
        rows = len(self._seen)
        # (the sequence numbers go on from run to run: they order a segment's Seens, which two runs may share)
        key = [np.frombuffer(column, column.typecode) for column in self._key]
        table = pa.table(key + [np.arange(self._staged, self._staged + rows, dtype=np.int64),
                                pa.array(self._seen, pa.binary())], schema=_SCHEMA)
        self._write([table.sort_by(_KEY)], rows, 0)
        self._staged += rows
        self._key = _key_columns()
        self._seen, self._bytes = [], 0
        generation = 0
        while len(same := [f for f in self._files if f[2] == generation]) >= self.MERGED_AT_ONCE:
            self._merge(same)
            generation += 1

    def _merge(self, files: list[tuple[str, int, int]]) -> None:
        """`files` replaced by one, their rows merged in key order."""
        files = list(files)  # (not self._files itself, which the merged file joins)
        self._write(_merged(self._filesystem, [path for path, _, _ in files]), sum(rows for _, rows, _ in files),
                    1 + max(generation for _, _, generation in files))
        for path, _, _ in files:
            self._filesystem.delete_file(path)
        self._files = [f for f in self._files if f not in files]

    def _write(self, tables, rows: int, generation: int) -> None:
        path = f"{self._stem}-{self._named:04d}{STAGED_SUFFIX}"
        self._named += 1
        writer = StagedWriter(self._filesystem, path, _SCHEMA)
        try:
            for table in tables:
                for batch in table.to_batches(max_chunksize=_BATCH_ROWS):
                    writer.write(batch)
        finally:
            writer.close()
        self._files.append((path, rows, generation))


# The staged Seen files the analyses' merge takes at most, however many decode tasks there are (but one a task)
FILES_MERGED = 8


def files_left(tasks: int) -> int:
    """How many staged Seen files each of a run's `tasks` decode tasks may leave unmerged."""
    return max(1, FILES_MERGED // max(tasks, 1))


def _in_key_order(filesystem, staged: list[str]):
    """The staged files' Seens (marshalled) merged in key order (_merged)."""
    for table in _merged(filesystem, staged):
        yield from table.column("seen").to_pylist()


def _merged(filesystem, staged: list[str]):
    """The rows of staged files (each sorted by key) merged in key order, a sorted table at a time, a batch of each
    file held at a time: the rows of all files up to the least of their batches' last keys (no row to come can be
    before it) are sorted together by Arrow, and the rest wait for the next round. Keys are unique: a segment is
    one connection's, in one task, which numbers its Seens on from run to run."""
    with contextlib.ExitStack() as files:
        batches = [files.enter_context(contextlib.closing(staged_batches(filesystem, path))) for path in staged]
        pending = [_SCHEMA.empty_table() for _ in batches]  # each file's rows read and not yet given
        while True:
            for n in reversed(range(len(pending))):  # a file whose rows are all given reads its next batch, or ends
                while pending[n].num_rows == 0:
                    batch = next(batches[n], None)
                    if batch is None:
                        del pending[n], batches[n]
                        break
                    pending[n] = pa.table(batch)
            if not pending:
                return
            bound = min(map(_last_key, pending))
            ready = []
            for n, table in enumerate(pending):
                count = _rows_up_to(table, bound)
                ready.append(table.slice(0, count))
                pending[n] = table.slice(count)
            yield pa.concat_tables(ready).sort_by(_KEY)


def _last_key(table: pa.Table) -> tuple:
    return tuple(table.column(name)[-1].as_py() for name, _ in _KEY)


def _rows_up_to(table: pa.Table, bound: tuple) -> int:
    """How many of the table's first rows (sorted by key) have a key at most `bound`."""
    columns = [table.column(name).to_numpy() for name, _ in _KEY]
    at_most = columns[-1] <= bound[-1]
    for column, limit in zip(reversed(columns[:-1]), reversed(bound[:-1])):
        at_most = (column < limit) | ((column == limit) & at_most)
    return int(at_most.sum())


def _key_columns() -> list[array.array]:
    """A run's key columns but the sequence number (_SCHEMA's types), as they come."""
    return [array.array(typecode) for typecode in "diqdiq"]


def analyse(staged: list[str], out: str) -> dict[str, int]:
    """The staged Seen files of the run through one Insight, in capture order; writes the groups and
    partitions tables and returns the rows written to each."""
    filesystem, _ = output_fs(out)
    insight = Insight(samples=False)
    plain = PlainSeens()
    with collecting_rarely():  # (what the analyses hold grows with the run: each collection would walk all of it)
        for staged_seen in _in_key_order(filesystem, staged):
            insight.take(plain.seen(marshal.loads(staged_seen)))
    return {GROUPS.name: write_rows(GROUPS, insight.group_rows(), out),
            PARTITIONS.name: write_rows(PARTITIONS, insight.partition_rows(), out)}
