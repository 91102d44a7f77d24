"""The tables' Parquet files, written by the Spark workers with pyarrow: no table row passes through the JVM.

Two steps. Each decode task stages its raw rows, one file per table, under OUT/_staging-RUN/ (a name Spark and
other readers skip), as an Arrow IPC stream of LZ4-compressed batches: a staged file is written once and read once,
by this project's own tasks, so Parquet's encodings bought nothing there and cost a records-heavy decode task a third
of its time (0.20 of 0.56 s to write 360,000 records, 0.10 s more to read them back; as IPC 0.04 s and 0.03 s, in
about the same bytes). Once the run's connections are numbered and its topic ids named, the finishing tasks
(build.finishing_tasks shares the staged files out) add `stream`, name the topic ids, make timestamps of
microseconds and write OUT/TABLE/date=YYYY-MM-DD/part-*.parquet, which Spark reads with `date` as a partition
column. The analysed tables (`groups`, `partitions`)
are written whole by the one task that runs the analyses (`write_rows`), as
OUT/TABLE/part-00000.parquet. OUT is a local path (on a cluster, one every executor sees at the
same place) or a URI of a file system pyarrow has: hdfs://, s3:// (s3a:// is taken as s3://), gs://.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from datetime import date, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from kafkasniff.pipeline.inputs import is_uri
from kafkasniff.pipeline.rows import MessageColumns, RecordColumns, micros
from kafkasniff.pipeline.tables import DECODED_TABLES, MESSAGES, RECORDS, TABLES, Table, file_schema, raw_schema

_MICROS_PER_DAY = 86_400_000_000
_EPOCH = date(1970, 1, 1)
_TABLE = {t.name: t for t in TABLES}


def output_fs(out: str) -> tuple[pafs.FileSystem, str]:
    """The file system and path of the --out folder."""
    if not is_uri(out):
        return pafs.LocalFileSystem(), os.path.abspath(out)
    filesystem, path = pafs.FileSystem.from_uri(re.sub(r"^s3a://", "s3://", out))
    return filesystem, path.rstrip("/")


STAGED_SUFFIX = ".arrows"  # (the name Arrow gives its IPC stream format's files)
_STAGED_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


class StagedWriter:
    """A staged file being written: batches of one schema (a dictionary column may change its dictionary from one
    batch to the next: the stream format carries each)."""

    def __init__(self, filesystem: pafs.FileSystem, path: str, schema: pa.Schema) -> None:
        filesystem.create_dir(path.rsplit("/", 1)[0])
        self._sink = filesystem.open_output_stream(path)
        self._writer = pa.ipc.new_stream(self._sink, schema, options=_STAGED_OPTIONS)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()
        self._sink.close()


def staged_batches(filesystem: pafs.FileSystem, path: str) -> Iterator[pa.RecordBatch]:
    """A staged file's batches, one at a time."""
    with filesystem.open_input_stream(path) as source:
        yield from pa.ipc.open_stream(source)


class StagedTables:
    """A decode task's rows of every table, gathered in `rows` (raw column order: the messages as
    rows.MessageColumns, the records as rows.RecordColumns, the connections as tuples) and written out in row groups
    as they come, one staged file per table."""

    ROWS_PER_GROUP = 16384

    def __init__(self, out: str, staging: str, task: str) -> None:
        self._fs, root = output_fs(out)
        self.rows: dict[str, list[tuple] | MessageColumns | RecordColumns] = {
            t.name: RecordColumns(self.ROWS_PER_GROUP, self.flush) if t is RECORDS else
            MessageColumns() if t is MESSAGES else [] for t in DECODED_TABLES}
        self._paths = {t.name: f"{root}/{staging}/{t.name}/{task}{STAGED_SUFFIX}" for t in DECODED_TABLES}
        self._schemas = {t.name: raw_schema(t) for t in DECODED_TABLES}
        self._writers: dict[str, StagedWriter] = {}
        self.written = dict.fromkeys(self.rows, 0)

    def flush(self, *, all_rows: bool = False) -> None:
        for name, rows in self.rows.items():
            if rows and (all_rows or len(rows) >= self.ROWS_PER_GROUP):
                batch = _batch(rows, self._schemas[name])
                writer = self._writers.get(name)
                if writer is None:
                    writer = self._writers[name] = StagedWriter(self._fs, self._paths[name], batch.schema)
                writer.write(batch)
                self.written[name] += len(rows)
                rows.clear()

    def close(self) -> list[tuple[str, str, int]]:
        """(table, staged file, rows) of every file written."""
        self.flush(all_rows=True)
        for writer in self._writers.values():
            writer.close()
        return [(name, self._paths[name], self.written[name]) for name in self._writers]


def _batch(rows: list[tuple] | MessageColumns | RecordColumns, schema: pa.Schema) -> pa.RecordBatch:
    if type(rows) is not list:
        return rows.batch(schema)
    # tuples as a struct array: pyarrow converts them in one pass, where a list per column costs a zip first (a
    # third of the time the rows took to make)
    return pa.RecordBatch.from_struct_array(pa.array(rows, pa.struct(schema)))


def finish_staged(table_name: str, staged: str, out: str, part: str, streams: dict[str, int],
                  topic_of_id: dict[str, str]) -> int:
    """Write a staged file's rows as the table's, a file per day; returns how many rows were written. A staged batch
    at a time (a decode task's share of records-heavy traffic is millions of records) and a column at a time: text
    columns staged dictionary-encoded stay so. At most _DayFiles.OPEN_FILES days are written in one pass over the
    staged file: rows of any other day wait for the next pass (hostile input may date every packet on another day;
    a real run spans a few)."""
    filesystem, root = output_fs(out)
    table = _TABLE[table_name]
    done: set[int] = set()
    written = 0
    while True:
        days = _DayFiles(filesystem, f"{root}/{table.name}", part)
        left_for_later = False
        try:
            with contextlib.closing(staged_batches(filesystem, staged)) as batches:
                for batch in batches:
                    finished, day_of_rows = _finished(table, pa.Table.from_batches([batch]), streams, topic_of_id)
                    runs = pc.value_counts(day_of_rows)
                    if len(runs) > 1:  # the rows by day, in their order within each (a sort, not a filter per day)
                        finished = finished.take(pc.sort_indices(day_of_rows))
                    start = 0
                    for day, count in sorted(zip(runs.field("values").to_pylist(), runs.field("counts").to_pylist())):
                        if day not in done:
                            if days.take(day, finished.slice(start, count)):
                                written += count
                            else:
                                left_for_later = True
                        start += count
            days.flush()
        finally:
            days.close()
        if not left_for_later:
            return written  # (the staged file stays until the run ends: a task run again, on a cluster, reads it)
        done |= days.taken


class _DayFiles:
    """The files of one pass of a finishing task over a staged file: a file for each of at most OPEN_FILES days
    (folder date=YYYY-MM-DD). A day's rows are written once ROWS_PER_GROUP of them wait, or, when that many wait in
    all, those of the day with the most: a row group per staged batch was too small for the readers, and for the
    writer, which spent a tenth more time on them (a dictionary and statistics per column of each)."""

    ROWS_PER_GROUP = 1 << 17
    OPEN_FILES = 64

    def __init__(self, filesystem: pafs.FileSystem, folder: str, part: str) -> None:
        self._fs, self._folder, self._part = filesystem, folder, part
        self.taken: set[int] = set()  # the days of this pass
        self._writers: dict[int, pq.ParquetWriter] = {}
        self._pending: dict[int, list[pa.Table]] = {}  # rows not yet written, by day
        self._pending_rows: dict[int, int] = {}

    def take(self, day: int, rows: pa.Table) -> bool:
        """Whether the day's rows are taken in this pass (False: OPEN_FILES other days are)."""
        if day not in self.taken:
            if len(self.taken) >= self.OPEN_FILES:
                return False
            self.taken.add(day)
        self._pending.setdefault(day, []).append(rows)
        self._pending_rows[day] = self._pending_rows.get(day, 0) + rows.num_rows
        if self._pending_rows[day] >= self.ROWS_PER_GROUP:
            self._write(day)
        elif sum(self._pending_rows.values()) >= self.ROWS_PER_GROUP:
            self._write(max(self._pending_rows, key=self._pending_rows.__getitem__))
        return True

    def flush(self) -> None:
        for day in sorted(self._pending):
            self._write(day)

    def _write(self, day: int) -> None:
        # one dictionary per text column for the row group: the staged batches each have their own, and Parquet's
        # writer turns every batch whose dictionary differs from the first back into text and hashes it again (a
        # third of the records' writing, and files two and a half times as big)
        rows = pa.concat_tables(self._pending.pop(day)).unify_dictionaries()
        del self._pending_rows[day]
        writer = self._writers.get(day)
        if writer is None:
            folder = f"{self._folder}/date={(_EPOCH + timedelta(days=day)).isoformat()}"
            self._fs.create_dir(folder)
            writer = self._writers[day] = pq.ParquetWriter(f"{folder}/part-{self._part}.parquet", rows.schema,
                                                           filesystem=self._fs)
        writer.write_table(rows, row_group_size=rows.num_rows)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


def _finished(table: Table, raw: pa.Table, streams: dict[str, int],
              topic_of_id: dict[str, str]) -> tuple[pa.Table, pa.ChunkedArray]:
    """Staged rows as the table's (stream numbers, topic names), and the day of each."""
    columns = {name: raw.column(name) for name in raw.column_names}
    columns["stream"] = _looked_up(columns["connection_id"], streams, pa.int64())
    if topic_of_id and table is MESSAGES:
        columns["topics"] = _named_in_lists(columns["topics"], topic_of_id)
    if topic_of_id and table is RECORDS:
        columns["topic"] = pc.coalesce(_decoded(columns["topic"]),
                                       _looked_up(columns["topic_id"], topic_of_id, pa.string()))
    fields = [f.with_type(columns[f.name].type) if _dictionary_of(columns[f.name].type, f.type) else f
              for f in file_schema(table)]
    finished = pa.table([columns[f.name].cast(f.type) for f in fields], schema=pa.schema(fields))
    return finished, _floor_divided(columns[table.time_column].cast(pa.int64()), _MICROS_PER_DAY)


def _named_in_lists(column: pa.ChunkedArray, topic_of_id: dict[str, str]) -> pa.ChunkedArray:
    """Each list's topic ids named (topic_of_id), names and unknown ids kept as they are; null lists stay null.
    By Arrow's kernels, not a Python list per message (a staged file holds a decode task's share of the run)."""
    def named(lists: pa.Array) -> pa.Array:
        topics = pc.list_flatten(lists)
        renamed = pc.coalesce(_looked_up(pa.chunked_array([topics]), topic_of_id, pa.string()), topics)
        lengths = pc.fill_null(pc.list_value_length(lists), 0).cast(pa.int32())
        offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(lengths)])
        return pa.ListArray.from_arrays(offsets, renamed.combine_chunks(), mask=lists.is_null())

    return pa.chunked_array([named(chunk) for chunk in column.chunks], pa.list_(pa.string()))


def _looked_up(column: pa.ChunkedArray, mapping: dict, arrow_type: pa.DataType) -> pa.ChunkedArray:
    """mapping[value] for each value of the column; null where the value is null or not in the mapping. A
    dictionary-encoded column's values are looked up once each."""
    def look_up(values: pa.Array) -> pa.Array:
        if pa.types.is_dictionary(values.type):
            return look_up(values.dictionary).take(values.indices)
        found = pc.index_in(values, value_set=pa.array(list(mapping), values.type))
        return pa.array(list(mapping.values()), arrow_type).take(found)

    return pa.chunked_array([look_up(chunk) for chunk in column.chunks], arrow_type)


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column


def _dictionary_of(column_type: pa.DataType, value_type: pa.DataType) -> bool:
    return pa.types.is_dictionary(column_type) and column_type.value_type == value_type


def _floor_divided(values: pa.ChunkedArray, divisor: int) -> pa.ChunkedArray:
    """values // divisor, as Python rounds (toward minus infinity; Arrow's division rounds toward zero)."""
    quotient = pc.divide(values, divisor)
    inexact_below_zero = pc.and_(pc.less(values, 0), pc.not_equal(pc.multiply(quotient, divisor), values))
    return pc.if_else(inexact_below_zero, pc.subtract(quotient, 1), quotient)


def write_rows(table: Table, rows: list[dict], out: str) -> int:
    """Rows of an analysed table (dicts of plain values, times in seconds) as its one Parquet file; returns
    how many rows were written (none: no file)."""
    if not rows:
        return 0
    filesystem, root = output_fs(out)
    schema = file_schema(table)
    columns = [pa.array([_arrow_value(row[field.name], field.type) for row in rows], field.type) for field in schema]
    pq.write_table(pa.table(columns, schema=schema), f"{root}/{table.name}/part-00000.parquet", filesystem=filesystem)
    return len(rows)


def _arrow_value(value, arrow_type):
    """A plain value as pyarrow takes it for `arrow_type`: times in seconds become microseconds, in lists, maps
    and structs too."""
    if value is None:
        return None
    if pa.types.is_timestamp(arrow_type):
        return micros(value)
    if pa.types.is_map(arrow_type):
        return [(key, _arrow_value(item, arrow_type.item_type)) for key, item in value.items()]
    if pa.types.is_list(arrow_type):
        return [_arrow_value(item, arrow_type.value_type) for item in value]
    if pa.types.is_struct(arrow_type):
        return {field.name: _arrow_value(value.get(field.name), field.type) for field in arrow_type}
    return value


def replace_tables(out: str) -> None:
    """Empty table folders under `out`, replacing any earlier run's."""
    filesystem, root = output_fs(out)
    for table in TABLES:
        folder = f"{root}/{table.name}"
        if filesystem.get_file_info(folder).type != pafs.FileType.NotFound:
            filesystem.delete_dir(folder)
        filesystem.create_dir(folder)


def mark_done(out: str) -> None:
    """What Spark's writer leaves behind: a _SUCCESS file per table."""
    filesystem, root = output_fs(out)
    for table in TABLES:
        with filesystem.open_output_stream(f"{root}/{table.name}/_SUCCESS"):
            pass


_TIMES_REACHED = "reached"  # the staging folder's folder of the files' capture times at their ends


def note_time_reached(out: str, staging: str, file_number: int, time: float) -> None:
    """A read task's word that the run's file `file_number` ends at capture time `time` (its latest TCP packet's):
    an empty file, its name saying both, which the decode tasks list (time_reached) once the reads are done."""
    filesystem, root = output_fs(out)
    filesystem.create_dir(f"{root}/{staging}/{_TIMES_REACHED}", recursive=True)
    with filesystem.open_output_stream(f"{root}/{staging}/{_TIMES_REACHED}/{file_number}-{time.hex()}"):
        pass


def time_reached(out: str, staging: str) -> float | None:
    """The capture time the run's files reach (note_time_reached): the latest of them; None without any."""
    filesystem, root = output_fs(out)
    found = filesystem.get_file_info(pafs.FileSelector(f"{root}/{staging}/{_TIMES_REACHED}", allow_not_found=True))
    return max((float.fromhex(info.base_name.split("-", 1)[1]) for info in found), default=None)


def remove_staging(out: str, staging: str) -> None:
    """The staging folder goes, whether the run succeeded or not (a run without packets staged nothing)."""
    filesystem, root = output_fs(out)
    if filesystem.get_file_info(f"{root}/{staging}").type != pafs.FileType.NotFound:
        filesystem.delete_dir(f"{root}/{staging}")

