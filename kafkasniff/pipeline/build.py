"""The Spark jobs: capture files -> segments -> one connection per decoder -> Parquet tables.

1. One job reads, shuffles and decodes, with the segments crossing between the JVM and the Python
   workers as Arrow batches (mapInArrow):
   - read: one task per capture file (a big local file: several, each reading it whole and taking its
     share of the connections, their buckets dealt round); plain paths are streamed by the worker with the
     project's reader, URIs are read whole by Spark's `binaryFile` source; every TCP segment becomes a row
     keyed by its connection (see `reading`);
   - shuffle: the rows are hashed by connection key to a partition and sorted there by (key, time
     its file had reached, file, index in the file) by Spark's own (spilling) sort, so a partition is a
     sequence of 4-tuples, each one's packets in capture order, and a big connection never has to fit
     in memory;
   - decode: each 4-tuple's run goes through TcpReassembler and Analyzer; the rows of every table
     are staged by the worker (Arrow IPC files, see `writing`), with what the analyses read of each
     message (see `analysis`), and only the facts the run needs (the connections' first packets,
     topic names, the staged files) go back to the driver.
2. The driver numbers the connections by first-seen time and pools the topic names.
3. One job finishes the staged files into the tables (stream numbers, topic names, timestamps,
   folders by date), each task counting what it wrote: the summary counts what the tables hold;
   one of its tasks runs the analyses over the whole run into the groups and partitions tables.
   A task per core at most, the work shared out by its estimated cost (finishing_tasks).
The inputs are decoded once (a task may read a file another task reads: it skips the other's connections in C); no
table row passes through the JVM.

A run of local uncompressed files of at most UNSHUFFLED_MAX_BYTES in all skips the shuffle: its first job has a task
per partition that reads every file and decodes its share of the connections (shared out by their bytes, which
the driver counts first: reading.connection_shares), their segments merged and sorted as a shuffled partition's
(reading.shard_rows), without the read stage (a task per file, or a few for a big local one), the shuffle and the
Arrow batches on both sides of it, which cost more CPU than the decoding they fed.

A session's first run through the shuffle also starts the Python workers, in a job of its own, while the JVM plans
the shuffle's (_start_python_workers).

Jobs through which nothing but a few facts and counts pass (that first job, the finishing) are RDD jobs of Python
functions, not DataFrames: a DataFrame job's planning, code generation and Arrow conversions cost the JVM about
0.3 s a job, and several seconds the first time in a session (measured on this project's 2-core machine: the first
mapInArrow job 10.0-10.7 s, the first RDD job doing the same 3.9-4.8 s).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
import uuid
import weakref
from collections import defaultdict, namedtuple
from dataclasses import dataclass, field

import pyarrow as pa

from kafkasniff.capture.files import CONNECTION_BUCKETS, GZIP_MAGIC
from kafkasniff.engine.heap import collecting_rarely
from kafkasniff.pipeline.analysis import STAGED_NAME
from kafkasniff.pipeline.connections import RUN_FACTS_DDL, RUN_FACTS_SCHEMA, order_of_files
from kafkasniff.pipeline.inputs import CaptureFile
from kafkasniff.pipeline.reading import SEGMENT_DDL, SEGMENT_ORDER, connection_shares, read_local, read_spooled
from kafkasniff.pipeline.sparkenv import sql_session
from kafkasniff.pipeline.tables import CONNECTIONS, GROUPS, MESSAGES, PARTITIONS, RECORDS, TABLES
from kafkasniff.pipeline.writing import mark_done, remove_staging, replace_tables

_COUNTS = ("files", "bytes", "frames", "segments")
_CONTEXTS_RUN = weakref.WeakSet()  # the SparkContexts that ran a build_tables
RunFact = namedtuple("RunFact", RUN_FACTS_SCHEMA.names)  # what a decode task tells the driver (connections)
# A task taking its share of the inputs without the shuffle holds that share's segments until every file is read:
# the files' sizes bound them when none is compressed (gzip may inflate a capture tenfold). The shuffle is no
# thriftier: on a 356 MB records-heavy capture in local[2] its JVM peaked at 1.06 GB and its workers at 1.19 GB in
# all, against 0.37 GB and 1.09-1.16 GB for two tasks each holding their share (a first run in a fresh session
# 13.5 s against 3.6 s, later ones 2.0-2.6 s against 1.0-1.4 s).
UNSHUFFLED_MAX_BYTES = 512 << 20
# Through the shuffle, a local file of more than this is read by several tasks (read_shares)
READ_TASK_BYTES = 64 << 20
# What the finishing costs a staged row of each kind, in microseconds (measured on this project's 2-core machine,
# warm: the analyses per Seen over bench60, the tables' files on bench60 and on records-heavy traffic): their ratios
# share the work out among the finishing tasks, and against TASK_MICROS they say how many tasks are worth it.
_FINISHING_MICROS_PER_ROW = {STAGED_NAME: 5.0, MESSAGES.name: 0.9, RECORDS.name: 0.5, CONNECTIONS.name: 1.1}
# What a Python task costs Spark however little it does, in the same microseconds (a trivial mapPartitions task, local
# mode, a reused worker, its daemon on a Unix socket (sparkenv): 7-9 ms; over loopback TCP, as Spark before 4.1 has
# it, 51-52 ms: there the finishing makes more tasks than are worth it, which costs it a few tenths of a second)
TASK_MICROS = 8_000.0


@dataclass
class BuildSummary:
    files: int = 0
    bytes: int = 0
    frames: int = 0
    segments: int = 0
    connections: int = 0
    messages: int = 0
    records: int = 0
    groups: int = 0       # rows of the groups table
    partitions: int = 0   # and of the partitions table
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


def _stats_param():
    from pyspark.accumulators import AccumulatorParam

    class ReadStats(AccumulatorParam):
        def zero(self, value):
            return _no_reads()

        def addInPlace(self, total, more):
            for k in _COUNTS:
                total[k] += more.get(k, 0)
            total["warnings"] += more.get("warnings", [])
            return total

    return ReadStats()


def _no_reads() -> dict:
    return {**{k: 0 for k in _COUNTS}, "warnings": []}


def run_order(files: list[CaptureFile]) -> list[CaptureFile]:
    """Files in the order their packets are taken when times are equal: by their first packet's time, so that
    rotated files keep the order they were written in whatever their names (tcpdump -z gzip's kafka.pcap.gz
    before kafka.pcap1.gz, a ring's files), and of overlapping inputs the one that starts first goes first (a
    packet's copies after it, where the reassembly takes them for retransmissions; the other way round a copy
    may come before the packets it followed, its connection's SYN among them). At the same time the bigger
    first (a merged capture before the parts it was merged from), then by name, numbers compared as numbers
    (kafka.pcap9 before kafka.pcap10). Files whose first packet is not known (URIs, which Spark reads) after the
    others, by name."""
    def order(f: CaptureFile):
        natural = [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", f.name)]
        known = f.first_ts is not None
        return not known, f.first_ts if known else 0.0, -f.size if known else 0, natural

    return sorted(files, key=order)


def build_tables(sc, files: list[CaptureFile], out: str, port_hints=(), partitions: int | None = None,
                 keylog_text: bytes = b"") -> BuildSummary:
    """Decode `files` and write the tables under `out`, with the SparkContext `sc` (and its SQL side through the
    shuffle). keylog_text: TLS key log lines, shipped to the executors with the tasks."""
    started = time.monotonic()
    files = run_order(files)
    names = [f.name for f in files]
    stats = sc.accumulator(_no_reads(), _stats_param())
    hints = frozenset(port_hints)
    staging = f"_staging-{uuid.uuid4().hex}"
    without_shuffle = unshuffled(files)
    parts = partitions or sc.defaultParallelism
    if without_shuffle:
        parts = min(parts, CONNECTION_BUCKETS)  # (a task per bucket at most: its connections go together)

    def decode(row_lists, capture_end):
        """A decode task's facts, from its segment rows (connections.decode_segment_rows)."""
        from pyspark import TaskContext

        from kafkasniff.engine.heap import freeze_at_task_start
        from kafkasniff.pipeline.connections import decode_segment_rows

        freeze_at_task_start()
        task = TaskContext.get()
        # (named by the task attempt's id, unique in the run: attempt numbers start again when a stage is re-run,
        # while the earlier attempt's task may still be writing)
        return decode_segment_rows(row_lists, names, hints, out, staging,
                                   f"{task.partitionId():05d}-{task.taskAttemptId()}", keylog_text, parts, capture_end)

    try:
        # (the driver's collections: a pass over every generation walks pyspark's and py4j's objects, 12-37 ms, about
        # one bench60 run in two, between the jobs where it holds up both)
        with collecting_rarely():
            written = _decode_and_write(sc, files, stats, decode, out, staging, parts, without_shuffle)
    finally:
        remove_staging(out, staging)
    read = stats.value
    return BuildSummary(files=read["files"], bytes=read["bytes"], frames=read["frames"], segments=read["segments"],
                        connections=written[CONNECTIONS.name], messages=written[MESSAGES.name],
                        records=written[RECORDS.name], groups=written[GROUPS.name],
                        partitions=written[PARTITIONS.name],
                        seconds=time.monotonic() - started,
                        warnings=read["warnings"])


def _decode_and_write(sc, files: list[CaptureFile], stats, decode, out: str, staging: str, parts: int,
                      without_shuffle: bool) -> dict[str, int]:
    """The two jobs (see the module's docstring), the decoding in `parts` tasks, `without_shuffle` (unshuffled) or
    through it; returns the rows written to each table."""
    first_run = sc not in _CONTEXTS_RUN  # (its Python workers yet to start)
    _CONTEXTS_RUN.add(sc)
    if without_shuffle:
        paths = [f.name for f in files]
        owners = connection_shares(paths, parts)

        def read_and_decode(shards):
            from kafkasniff.pipeline.reading import shard_rows

            for shard in shards:
                times_reached = []  # (each file's end, known before the first rows: shard_rows)
                yield from decode(shard_rows(paths, shard, owners, stats.add, times_reached),
                                  lambda: max(times_reached, default=None))

        collected = sc.parallelize(range(parts), parts).mapPartitions(read_and_decode).collect()
    else:
        def decode_batches(batches):
            from kafkasniff.pipeline.connections import rows_of_batches
            from kafkasniff.pipeline.writing import time_reached

            found = decode(rows_of_batches(batches), lambda: time_reached(out, staging))
            if found:
                yield pa.RecordBatch.from_struct_array(pa.array(found, pa.struct(RUN_FACTS_SCHEMA)))

        # (the SQL side before the workers' job: its making and the JVM's planning are one chain either way, and made
        # while the workers start it competed with them for the cores: a first run of ten gzipped 1 MB captures
        # 5.04-5.22 s against 4.85-5.09 s, four runs alternated)
        spark = sql_session()
        starting = _start_python_workers(sc, parts) if first_run else None
        collected = (_segments(spark, files, stats, sc.defaultParallelism, out, staging)
                     .repartition(parts, "key")
                     .sortWithinPartitions(*SEGMENT_ORDER)
                     .mapInArrow(decode_batches, RUN_FACTS_DDL)
                     .collect())
        if starting is not None:
            starting.join()
    facts = [RunFact._make(fact) for fact in collected]
    streams = {connection_id: number for number, connection_id in enumerate(connection_order(facts))}
    topic_of_id = dict(sorted({(f.topic_id, f.topic_name) for f in facts if f.topic_id is not None},
                              reverse=True))  # the smallest name wins
    staged = [(f.table_name, f.staged, f.rows) for f in facts if f.staged is not None and f.table_name != STAGED_NAME]
    seen = [f for f in facts if f.table_name == STAGED_NAME]
    # the finishing's work: the analyses (over every staged Seen file), and each staged file of the tables
    jobs = ([(STAGED_NAME, [f.staged for f in seen], sum(f.rows for f in seen))] if seen else []) + staged
    tasks = finishing_tasks([_FINISHING_MICROS_PER_ROW[kind] * rows for kind, _, rows in jobs], sc.defaultParallelism)

    def finish(numbers):
        from kafkasniff.engine.heap import freeze_at_task_start
        from kafkasniff.pipeline.analysis import analyse
        from kafkasniff.pipeline.writing import finish_staged

        freeze_at_task_start()
        for number in numbers:
            for job in tasks[number]:
                kind, what, _ = jobs[job]
                counts = analyse(what, out) if kind == STAGED_NAME else {
                    kind: finish_staged(kind, what, out, f"{job:05d}", streams, topic_of_id)}
                yield from counts.items()

    replace_tables(out)
    written = dict.fromkeys((t.name for t in TABLES), 0)
    if tasks:
        for table_name, rows in sc.parallelize(range(len(tasks)), len(tasks)).mapPartitions(finish).collect():
            written[table_name] += rows
    mark_done(out)
    return written


def connection_order(facts: list[RunFact]) -> list[str]:
    """The run's connection ids as `decode` numbers a capture's connections: by their first packets, in capture order
    (the time their file had reached, file, index). Connections opened at one time whose first packets several files
    hold (overlapping inputs) go as the files order those packets, and where none does, by the latest file holding
    each (as a connection's packets of one time: connections.order_of_files): a file may miss a packet another
    holds, and the first packet of a connection opened earlier be only in a file taken later."""
    firsts = sorted((f.first_reached, f.first_file, f.first_index, f.connection_id, f.first_copies)
                    for f in facts if f.connection_id is not None)
    if not any(first[4] for first in firsts):  # (the usual run: bench60's 10,955 took 15-17 ms through the ties, 6-7 ms
        return [first[3] for first in firsts]    # sorted, on the driver's way between the two jobs)
    order = []
    for _, tied in itertools.groupby(firsts, key=lambda first: first[0]):
        tied = list(tied)
        if len(tied) > 1 and any(first[4] for first in tied):
            tied = _as_files_order_them(tied)
        order += [first[3] for first in tied]
    return order


def _as_files_order_them(tied: list[tuple]) -> list[tuple]:
    """connection_order's (first_reached, first_file, first_index, connection id, first_copies) of connections opened at
    one time, in the order the files holding their first packets give them."""
    held = [list(zip(copies[::2], copies[1::2])) if copies else [(file, index)] for _, file, index, _, copies in tied]
    in_file = defaultdict(list)  # file -> (index, connection) of the first packets it holds
    for connection, places in enumerate(held):
        for file, index in places:
            in_file[file].append((index, connection))
    after, before = [[] for _ in tied], [0] * len(tied)
    for places in in_file.values():
        places.sort()
        for (_, earlier), (_, later) in zip(places, places[1:]):
            after[earlier].append(later)
            before[later] += 1
    return [tied[n] for n in order_of_files([max(f for f, _ in places) for places in held], after, before)]


def _start_python_workers(sc, count: int):
    """A job of `count` tasks that import what the shuffle's tasks run, in a thread of its own, started as the
    driver's JVM plans the shuffle's DataFrame job (the first in a session: about 2 s, the executors idle): the
    Python workers start and import meanwhile (1.6 s) instead of after, and the shuffle's tasks find them waiting
    (the SQL side's tasks and the RDD jobs' share workers: sparkenv). Ten gzipped 1 MB captures, `kafkasniff
    spark` (a session's first run) on two cores, five runs alternated: 5.1-5.9 s -> 4.2-5.2 s (medians 5.3, 4.7);
    with cores to spare for it, up to the 1.6 s. Only in a session's first run: later, the workers are there, and
    the job would cost a run about 50 ms. Whatever goes wrong in it is left to the shuffle's job to say."""
    from pyspark import InheritableThread

    def start():
        with contextlib.suppress(Exception):
            sc.parallelize(range(count), count).mapPartitions(_import_shuffle_modules).collect()

    thread = InheritableThread(target=start, daemon=True)
    thread.start()
    return thread


def _import_shuffle_modules(_):
    import pyspark.sql.pandas.serializers  # noqa: F401  (the Arrow functions' own)

    import kafkasniff.pipeline.connections  # noqa: F401
    import kafkasniff.pipeline.reading  # noqa: F401
    return ()


def finishing_tasks(costs: list[float], cores: int) -> list[list[int]]:
    """The finishing's jobs (their estimated costs, microseconds) shared out among at most `cores` tasks (Spark's
    default parallelism, whatever --partitions says of the decoding), so that the tasks end about together: the
    costliest first, each to the task with the least so far. Not a task per job: a task costs Spark about TASK_MICROS
    however little it does, and a records-heavy run has a few costly jobs among many cheap ones; and no more tasks
    than have that much work each."""
    count = min(cores, len(costs), max(1, int(sum(costs) // TASK_MICROS)))
    tasks: list[list[int]] = [[] for _ in range(count if costs else 0)]
    load = [0.0] * len(tasks)
    for job in sorted(range(len(costs)), key=lambda job: -costs[job]):
        least = load.index(min(load))
        tasks[least].append(job)
        load[least] += costs[job]
    return tasks


def unshuffled(files: list[CaptureFile]) -> bool:
    """Whether the run's first job reads its inputs without the shuffle: local files, none compressed, of at most
    UNSHUFFLED_MAX_BYTES in all."""
    if not all(f.local for f in files) or sum(f.size for f in files) > UNSHUFFLED_MAX_BYTES:
        return False
    try:
        return not any(_compressed(f) for f in files)
    except OSError:
        return False  # the shuffle's read task says why


def _compressed(f: CaptureFile) -> bool:
    with open(f.name, "rb") as capture:
        return capture.read(len(GZIP_MAGIC)) == GZIP_MAGIC


def read_shares(f: CaptureFile, cores: int, big_files: int) -> int:
    """How many read tasks share a local file out among themselves, each reading it whole and sending on its
    share of the connections (their buckets dealt round): one per READ_TASK_BYTES, as many as the `cores` left to
    each of the run's `big_files` (those of more than READ_TASK_BYTES) allow. A task's JVM side (the Arrow batches,
    the shuffle's writing) cost it four times what reading the file costs the worker, so one big file was a long
    serial stage (a 356 MB capture: 1.4-2.2 s). A compressed file is read by one task (each would inflate it)."""
    shares = min(cores // max(big_files, 1), -(-f.size // READ_TASK_BYTES))
    try:
        return 1 if shares <= 1 or _compressed(f) else shares
    except OSError:
        return 1  # (the read task says why)


def _segments(spark, files: list[CaptureFile], stats, cores: int, out: str, staging: str):
    """One DataFrame of the segments of every file (SEGMENT_DDL), a read task per file (a few for a big local
    file: read_shares), each file's end noted under out/staging for the decode tasks (writing.note_time_reached)."""
    numbered = list(enumerate(f.name for f in files))
    frames = []
    big_files = sum(f.local and f.size > READ_TASK_BYTES for f in files)
    local = [(n, name, share, shares) for (n, name), f in zip(numbered, files) if f.local
             for shares in [read_shares(f, cores, big_files)] for share in range(shares)]
    if local:
        def read_paths(batches):
            from kafkasniff.pipeline.writing import note_time_reached

            for batch in batches:
                for task in batch.column(0).to_pylist():
                    number, name, share, shares = local[task]
                    yield from read_local(name, name, number, stats.add, share, shares,
                                          lambda time: note_time_reached(out, staging, number, time))

        frames.append(spark.range(len(local), numPartitions=len(local)).mapInArrow(read_paths, SEGMENT_DDL))
    remote = {name: n for (n, name), f in zip(numbered, files) if not f.local}
    if remote:
        def read_contents(batches):
            from kafkasniff.pipeline.writing import note_time_reached

            for batch in batches:
                for path, content in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                    yield from read_spooled(path, content, remote[path], stats.add,
                                            lambda time: note_time_reached(out, staging, remote[path], time))

        frames.append(spark.read.format("binaryFile").load(list(remote)).select("path", "content")
                      .mapInArrow(read_contents, SEGMENT_DDL))
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
