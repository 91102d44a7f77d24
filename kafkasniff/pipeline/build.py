"""The Spark job: capture files -> keyed segments -> one connection per decoder -> Parquet tables.

Stages:
1. read: one task per local file (streamed by the project's reader), or Spark's binaryFiles
   for URIs; every TCP segment is keyed by its 4-tuple (see `reading`);
2. shuffle: repartitionAndSortWithinPartitions hashes the 4-tuple to a partition and sorts
   each partition by the key with PySpark's external (spilling) sorter, so a partition is a
   sequence of 4-tuples, each one's packets in order, and a big connection never has to fit
   in memory;
3. decode: mapPartitions streams each 4-tuple's run through TcpReassembler and Analyzer and
   emits rows of every table, side by side in one DataFrame kept (memory, then disk) for the
   writes, so the rows cross from Python to the JVM once;
4. number the connections of the run by first-seen time, resolve topic ids to names, and
   write each table as Parquet partitioned by date.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

from kafkasniff.pipeline.connections import (CONNECTION_ROW, MESSAGE_ROW, RECORD_ROW, TOPIC_NAME_ROW,
                                             decode_sorted_partition)
from kafkasniff.pipeline.inputs import CaptureFile
from kafkasniff.pipeline.reading import read_local, read_spooled
from kafkasniff.pipeline.tables import CONNECTIONS, MESSAGES, RECORDS, Column, Table

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


def _partition_of(key) -> int:
    """Partition by the 4-tuple only, with a hash that is the same in every worker process."""
    return zlib.crc32(repr(key[0]).encode())


def build_tables(spark, files: list[CaptureFile], out: str, port_hints=(), partitions: int | None = None,
                 keylog_text: bytes = b"") -> BuildSummary:
    """Decode `files` and write the messages, records and connections tables under `out`. keylog_text: TLS
    key log lines, shipped to the executors with the tasks."""
    started = time.monotonic()
    sc = spark.sparkContext
    stats = sc.accumulator(_no_reads(), _stats_param())
    hints = frozenset(port_hints)

    sources = []
    local = [f.name for f in files if f.local]
    if local:
        sources.append(sc.parallelize(local, len(local)).flatMap(lambda path: read_local(path, path, stats.add)))
    remote = [f.name for f in files if not f.local]
    if remote:
        sources.append(sc.binaryFiles(",".join(remote))
                       .flatMap(lambda item: read_spooled(item[0], item[1], stats.add)))
    segments = sources[0] if len(sources) == 1 else sc.union(sources)

    rows = (segments
            .repartitionAndSortWithinPartitions(partitions or 2 * sc.defaultParallelism,
                                                partitionFunc=_partition_of)
            .mapPartitions(lambda items: decode_sorted_partition(items, hints, keylog_text))
            .map(_wide_row))
    # The one pass through Python: rows of every table side by side, kept on the JVM (memory, then disk).
    wide = spark.createDataFrame(rows, _WIDE_DDL, verifySchema=False).persist()
    try:
        summary = _write_tables(wide, out)
    finally:
        wide.unpersist()
    read = stats.value
    summary.files, summary.bytes, summary.frames, summary.segments = (read[k] for k in _COUNTS)
    summary.warnings = read["warnings"]
    summary.seconds = time.monotonic() - started
    return summary


# The wide row: the tag, then one struct per tag (in this order), all null but the tagged one.
_WIDE = {MESSAGE_ROW: (MESSAGES.name, MESSAGES.raw_columns), RECORD_ROW: (RECORDS.name, RECORDS.raw_columns),
         CONNECTION_ROW: (CONNECTIONS.name, CONNECTIONS.raw_columns),
         TOPIC_NAME_ROW: ("topic_name", (Column("topic_id", "string", ""), Column("name", "string", "")))}
_WIDE_DDL = ", ".join(["tag int"] + [f"`{name}` struct<{', '.join(f'`{c.name}`: {c.type}' for c in columns)}>"
                                     for name, columns in _WIDE.values()])


def _wide_row(item: tuple[int, tuple]) -> tuple:
    tag, row = item
    return (tag, *(row if column == tag else None for column in _WIDE))


def _write_tables(wide, out: str) -> BuildSummary:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def rows_of(tag: int):
        return wide.where(F.col("tag") == tag).select(f"{_WIDE[tag][0]}.*")

    summary = BuildSummary()
    counts = dict(wide.groupBy("tag").count().collect())
    summary.connections, summary.messages, summary.records = (
        counts.get(CONNECTION_ROW, 0), counts.get(MESSAGE_ROW, 0), counts.get(RECORD_ROW, 0))

    connections = rows_of(CONNECTION_ROW).withColumn(
        "stream", F.row_number().over(Window.orderBy("first_seen", "client", "server", "connection_id")) - 1)
    connections = _final(connections, CONNECTIONS).persist()
    numbers = F.broadcast(connections.select("connection_id", "stream"))

    topic_of_id = _topic_id_map(rows_of(TOPIC_NAME_ROW))
    records = rows_of(RECORD_ROW)
    messages = rows_of(MESSAGE_ROW)
    if topic_of_id is not None:
        records = records.withColumn("topic", F.coalesce("topic", F.try_element_at(topic_of_id, F.col("topic_id"))))
        messages = messages.withColumn(
            "topics", F.transform("topics", lambda t: F.coalesce(F.try_element_at(topic_of_id, t), t)))
    records = records.join(numbers, "connection_id", "left")
    messages = messages.join(numbers, "connection_id", "left")

    for table, frame in ((CONNECTIONS, connections), (MESSAGES, _final(messages, MESSAGES)),
                         (RECORDS, _final(records, RECORDS))):
        frame.write.mode("overwrite").partitionBy("date").parquet(f"{out.rstrip('/')}/{table.name}")
    connections.unpersist()
    return summary


def _topic_id_map(topic_names):
    """Topic id -> name over every input of the run, as a map column (None when no id was named)."""
    from pyspark.sql import functions as F

    pairs = dict(sorted(map(tuple, topic_names.distinct().collect()), reverse=True))  # the smallest name wins
    if not pairs:
        return None
    return F.create_map(*(F.lit(part) for pair in pairs.items() for part in pair))


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
