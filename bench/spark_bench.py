"""Throughput of the Spark pipeline on a large capture, and the fixed cost of starting Spark.

Builds a capture of at least --size-mb from the project's captures (copies one after another
in time, each copy's client ports renumbered so its connections are new ones; TCP checksums
are left stale, which the reader does not check), then for each master (local[1], local[2]):

- start: seconds to start the Spark session;
- first job: `spark` on the smallest capture (Python workers start, JIT warms up);
- one file / rotated files: `spark` on the big capture as one file, and cut into --rotate
  files (one read task per file) — MB/s and messages/s of the whole job.

Baseline: `kafkasniff decode --json` on the big capture, in one process, to /dev/null.

    python bench/spark_bench.py [--size-mb 60] [--rotate 6] [--masters 'local[1]' 'local[2]']
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dpkt

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = sorted((ROOT / "captures").glob("*.pcap"))
BROKER_PORTS = {9092, 19092}
ETHERNET_HEADER = 14


def _renumber_client_port(frame: bytes, new_port: dict, next_port) -> bytes:
    """The frame with its non-broker TCP port replaced (Ethernet, IPv4, TCP as in the captures)."""
    tcp_at = ETHERNET_HEADER + (frame[ETHERNET_HEADER] & 0x0F) * 4
    ports = [int.from_bytes(frame[tcp_at + i:tcp_at + i + 2], "big") for i in (0, 2)]
    side = 0 if ports[1] in BROKER_PORTS else 1
    port = new_port.setdefault(ports[side], next_port())
    at = tcp_at + 2 * side
    return frame[:at] + port.to_bytes(2, "big") + frame[at + 2:]


def build_capture(path: Path, size_mb: float) -> int:
    """Write a capture of at least size_mb; returns its packet count."""
    sources = []
    for capture in CAPTURES:
        with open(capture, "rb") as f:
            sources.append(list(dpkt.pcap.Reader(f)))
    counter = iter(range(10**9))

    def next_port() -> int:
        return 1024 + next(counter) % 64000

    written = packets = 0
    offset = 0.0
    with open(path, "wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
        while written < size_mb * 1e6:
            for source in sources:
                new_port: dict[int, int] = {}
                start, end = source[0][0], source[-1][0]
                for ts, frame in source:
                    writer.writepkt(_renumber_client_port(bytes(frame), new_port, next_port), offset + ts - start)
                    written += 16 + len(frame)
                    packets += 1
                offset += end - start + 1.0
    return packets


def rotate(path: Path, parts: int, directory: Path) -> list[Path]:
    """Cut a capture into `parts` files by packet count, as tcpdump -C would."""
    with open(path, "rb") as f:
        packets = list(dpkt.pcap.Reader(f))
    files = []
    for part in range(parts):
        files.append(directory / f"{path.name}{part}")
        with open(files[-1], "wb") as out:
            writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
            for ts, frame in packets[part * len(packets) // parts:(part + 1) * len(packets) // parts]:
                writer.writepkt(frame, ts)
    return files


def bench_master(master: str, big: Path, rotated: list[Path], out: Path) -> dict:
    """Run in a fresh process, so that starting Spark is measured in full."""
    from kafkasniff.pipeline.build import build_tables
    from kafkasniff.pipeline.inputs import expand_local
    from kafkasniff.pipeline.sparkenv import start_session

    started = time.monotonic()
    spark, log_dir = start_session(master)
    result = {"master": master, "start_s": time.monotonic() - started}
    try:
        smallest = min(CAPTURES, key=lambda p: p.stat().st_size)
        result["first_job_s"] = build_tables(spark, expand_local([str(smallest)])[0], str(out / "small")).seconds
        for label, inputs in (("one_file", [str(big)]), ("rotated", [str(p) for p in rotated])):
            summary = build_tables(spark, expand_local(inputs)[0], str(out / label))
            result[label] = {"seconds": round(summary.seconds, 2), "MB/s": round(summary.bytes / 1e6 / summary.seconds, 2),
                             "messages/s": round(summary.messages / summary.seconds),
                             "messages": summary.messages, "records": summary.records}
    finally:
        spark.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=60)
    parser.add_argument("--rotate", type=int, default=6)
    parser.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    parser.add_argument("--run-master", help=argparse.SUPPRESS)
    parser.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_master:
        big, *rotated = map(Path, args.files)
        with tempfile.TemporaryDirectory(prefix="kafkasniff-bench-out-") as out:
            print(json.dumps(bench_master(args.run_master, big, rotated, Path(out))), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="kafkasniff-bench-") as tmp:
        work = Path(tmp)
        big = work / "big.pcap"
        packets = build_capture(big, args.size_mb)
        size = big.stat().st_size
        print(f"capture: {size / 1e6:.1f} MB, {packets} packets; rotated into {args.rotate} files", flush=True)
        rotated = rotate(big, args.rotate, work)

        started = time.monotonic()
        with open("/dev/null", "w") as sink:
            subprocess.run([sys.executable, "-m", "kafkasniff", "decode", "--json", str(big)], stdout=sink,
                           check=True)
        seconds = time.monotonic() - started
        print(f"baseline decode --json, one process: {seconds:.1f} s, {size / 1e6 / seconds:.2f} MB/s", flush=True)
        for master in args.masters:
            subprocess.run([sys.executable, __file__, "--run-master", master, str(big), *map(str, rotated)],
                           check=True)


if __name__ == "__main__":
    main()
