"""A Spark decode task's work, measured outside Spark: the shuffle path's decode on a capture
(`pipeline.connections.rows_of_batches` into `decode_segment_rows`, as pipeline.build does).

The capture's segments are read into Arrow batches as the pipeline's read tasks make them (`pipeline.reading`),
sorted by reading.SEGMENT_ORDER as the shuffle sorts a partition, cut into batches of --batch-rows rows (Spark's
spark.sql.execution.arrow.maxRecordsPerBatch, 10,000 by default) and decoded as one partition
holding every connection; the staged tables go to a temporary folder. Prints the seconds the decode took
and per TCP segment and per Kafka message; --profile adds cProfile's top functions.

For instructions (noise-free on a shared machine), run it under callgrind twice, with and without
--skip-decode (reading and sorting alone), and subtract:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench/spark_decode_task.py CAPTURE 2>&1 \\
        | grep Collected

    python bench/spark_decode_task.py /tmp/bench60.pcap [--cut-mb 3] [--profile] [--skip-decode]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from kafkasniff.pipeline.build import RunFact
from kafkasniff.pipeline.connections import decode_segment_rows, rows_of_batches
from kafkasniff.pipeline.reading import SEGMENT_ORDER, read_local

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from instructions import cut_capture  # noqa: E402  (a sibling script)


def sorted_segments(capture: Path) -> pa.Table:
    batches = list(read_local(str(capture), capture.name, 0, lambda report: None))
    table = pa.Table.from_batches(batches)
    return table.sort_by([(name, "ascending") for name in SEGMENT_ORDER])


def decode(segments: pa.Table, batch_rows: int, out: str) -> int:
    """The decode task over the segments; returns the messages staged."""
    rows = rows_of_batches(segments.to_batches(max_chunksize=batch_rows))
    facts = map(RunFact._make, decode_segment_rows(rows, ["capture"], frozenset(), out, "_staging", "00000-0"))
    return sum(fact.rows for fact in facts if fact.table_name == "messages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path)
    parser.add_argument("--cut-mb", type=float, help="the first N MB of the capture only")
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true", help="cProfile's top functions by own time")
    parser.add_argument("--skip-decode", action="store_true", help="read and sort only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kafkasniff-task-") as tmp:
        capture = cut_capture(args.capture, Path(tmp), args.cut_mb) if args.cut_mb else args.capture
        segments = sorted_segments(capture)
        if args.skip_decode:
            return
        profile = cProfile.Profile() if args.profile else None
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        messages = decode(segments, args.batch_rows, tmp)
        if profile is not None:
            profile.disable()
        seconds = time.perf_counter() - started
        print(f"{capture.stat().st_size / 1e6:.1f} MB, {segments.num_rows:,} segments, {messages:,} messages: "
              f"decode {seconds:.2f} s, {seconds / segments.num_rows * 1e6:.1f} µs per segment, "
              f"{seconds / max(messages, 1) * 1e6:.1f} µs per message")
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
