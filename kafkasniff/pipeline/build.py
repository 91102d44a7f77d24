"""The Spark job: capture files -> segments -> one connection per decoder -> Parquet tables.

Stages, all on DataFrames whose rows cross between Python and the JVM as Arrow batches:
1. read (mapInArrow): one task per capture file; plain paths are streamed by the worker with
   the project's reader, URIs are read whole by Spark's `binaryFile` source; every TCP segment
   becomes a row keyed by its connection (see `reading`);
2. shuffle: the rows are hashed by connection key to a partition and sorted there by (key,
   time, file, index in the file), by Spark's own (spilling) sort, so a partition is a
   sequence of 4-tuples, each one's packets in capture order, and a big connection never has
   to fit in memory;
3. decode (mapInArrow): each 4-tuple's run goes through TcpReassembler and Analyzer; rows of
   every table come out side by side (see `tables.DECODED_DDL`) and are kept (memory, then
   disk) for the writes, so the inputs are read and decoded once;
4. one small collect numbers the connections of the run by first-seen time and pools the
   topic names; each table is then written as Parquet partitioned by date, counted as it is
   written (so the summary counts what the tables hold).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from kafkasniff.pipeline.inputs import CaptureFile
from kafkasniff.pipeline.reading import SEGMENT_DDL, read_local, read_spooled
from kafkasniff.pipeline.tables import (CONNECTION_ROW, CONNECTIONS, DECODED_DDL, MESSAGE_ROW, MESSAGES,
                                        RECORD_ROW, RECORDS, TAGGED, TOPIC_NAME_ROW, Table)

_COUNTS = ("files", "bytes", "frames", "segments")


@dataclass
class BuildSummary:
    files: int = 0
    bytes: int = 0
    frames: int = 0
    segments: int = 0
    connections: int = 0
    messages: int = 0
    records: int = 0
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
    """Files in the order their packets are taken when times are equal: by name, numbers compared as
    numbers, so that rotated files (kafka.pcap9, kafka.pcap10) keep the order they were written in."""
    def natural(f: CaptureFile):
        return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", f.name)]

    return sorted(files, key=natural)


def build_tables(spark, files: list[CaptureFile], out: str, port_hints=(), partitions: int | None = None
                 ) -> BuildSummary:
    """Decode `files` and write the messages, records and connections tables under `out`."""
    started = time.monotonic()
    files = run_order(files)
    names = [f.name for f in files]
    stats = spark.sparkContext.accumulator(_no_reads(), _stats_param())
    segments = _segments(spark, files, stats)
    hints = frozenset(port_hints)

    def decode(batches):
        from kafkasniff.pipeline.connections import decode_partition

        return decode_partition(batches, names, hints)

    decoded = (segments.repartition(partitions or 2 * spark.sparkContext.defaultParallelism, "key")
               .sortWithinPartitions("key", "ts", "file", "index")
               .mapInArrow(decode, DECODED_DDL)
               .persist())
    try:
        summary = _write_tables(spark, decoded, out)
    finally:
        decoded.unpersist()
    read = stats.value
    summary.files, summary.bytes, summary.frames, summary.segments = (read[k] for k in _COUNTS)
    summary.warnings = read["warnings"]
    summary.seconds = time.monotonic() - started
    return summary


def _segments(spark, files: list[CaptureFile], stats):
    """One DataFrame of the segments of every file (SEGMENT_DDL), a read task per file."""
    numbered = list(enumerate(f.name for f in files))
    frames = []
    local = [(n, name) for (n, name), f in zip(numbered, files) if f.local]
    if local:
        def read_paths(batches):
            for batch in batches:
                for task in batch.column(0).to_pylist():
                    number, name = local[task]
                    yield from read_local(name, name, number, stats.add)

        frames.append(spark.range(len(local), numPartitions=len(local)).mapInArrow(read_paths, SEGMENT_DDL))
    remote = {name: n for (n, name), f in zip(numbered, files) if not f.local}
    if remote:
        def read_contents(batches):
            for batch in batches:
                for path, content in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                    yield from read_spooled(path, content, remote[path], stats.add)

        frames.append(spark.read.format("binaryFile").load(list(remote)).select("path", "content")
                      .mapInArrow(read_contents, SEGMENT_DDL))
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])


def _write_tables(spark, decoded, out: str) -> BuildSummary:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    def rows_of(tag: int):
        return decoded.where(F.col("tag") == tag).select(f"`{TAGGED[tag].name}`.*")

    # The one pass over the inputs: decoding fills the cache; only what numbers and names is collected.
    small = decoded.where(F.col("tag").isin(CONNECTION_ROW, TOPIC_NAME_ROW)).select(
        "tag", F.col(f"{CONNECTIONS.name}.connection_id"), F.col(f"{CONNECTIONS.name}.first_seen"),
        F.col(f"{CONNECTIONS.name}.first_file"), F.col(f"{CONNECTIONS.name}.first_index"),
        F.col(f"{TAGGED[TOPIC_NAME_ROW].name}.topic_id"), F.col(f"{TAGGED[TOPIC_NAME_ROW].name}.name")).collect()
    # numbered as `decode` numbers a capture's connections: by their first packets, in capture order
    connections = sorted((r.first_seen, r.first_file, r.first_index, r.connection_id)
                         for r in small if r.tag == CONNECTION_ROW)
    streams = spark.createDataFrame([(c[3], n) for n, c in enumerate(connections)],
                                    "connection_id string, stream bigint")
    numbers = F.broadcast(streams)
    topic_of_id = _topic_id_map([(r.topic_id, r.name) for r in small if r.tag == TOPIC_NAME_ROW])

    records = rows_of(RECORD_ROW)
    messages = rows_of(MESSAGE_ROW)
    if topic_of_id is not None:
        records = records.withColumn("topic", F.coalesce("topic", F.try_element_at(topic_of_id, F.col("topic_id"))))
        messages = messages.withColumn(
            "topics", F.transform("topics", lambda t: F.coalesce(F.try_element_at(topic_of_id, t), t)))
    summary = BuildSummary()
    counted = {}
    for table, frame in ((CONNECTIONS, rows_of(CONNECTION_ROW)), (MESSAGES, messages), (RECORDS, records)):
        counted[table.name] = Observation(table.name)
        (_final(frame.join(numbers, "connection_id", "left"), table)
         .observe(counted[table.name], F.count(F.lit(1)).alias("rows"))
         .write.mode("overwrite").partitionBy("date").parquet(f"{out.rstrip('/')}/{table.name}"))
    summary.connections, summary.messages, summary.records = (
        counted[t.name].get["rows"] for t in (CONNECTIONS, MESSAGES, RECORDS))
    return summary


def _topic_id_map(pairs: list[tuple[str, str]]):
    """Topic id -> name over every input of the run, as a map column (None when no id was named)."""
    from pyspark.sql import functions as F

    names = dict(sorted(set(pairs), reverse=True))  # the smallest name wins
    if not names:
        return None
    return F.create_map(*(F.lit(part) for pair in names.items() for part in pair))


def _final(frame, table: Table):
    """Raw columns to the table's: timestamps from microseconds, `date`, the documented order."""
    from pyspark.sql import functions as F

    columns = []
    for c in table.columns:
        if c.name == "date":
            columns.append(F.to_date(F.timestamp_micros(F.col(table.time_column))).alias("date"))
        elif c.type == "timestamp":
            columns.append(F.timestamp_micros(F.col(c.name)).alias(c.name))
        else:
            columns.append(F.col(c.name))
    return frame.select(*columns)
