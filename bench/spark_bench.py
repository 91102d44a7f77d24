"""Throughput of the Spark pipeline against `decode --json`, and its fixed cost (issue 16's targets).

Inputs, from the 60 MB message-heavy benchmark (bench/make_big_capture.py; built when --capture is
missing):
- one_file: the capture as one file;
- rotated: the same cut into --rotate files by packet count, as tcpdump -C would;
- ten_small: its first 10 MB cut into 10 captures of 1 MB;
- one_connection: a capture of the same size holding a single connection (all its packets meet
  in one task), to see that memory does not grow with a connection's size.

Baseline: `kafkasniff decode --json -j 2` on the capture, to /dev/null (median of --runs).
Then for each master (local[1], local[2]) in a fresh process: seconds to start Spark; the ten
small captures as the session's first job (Python workers start, the JVM warms up: the time
from "Spark is up" to "tables written"); then one_file, rotated and one_connection, each
--runs times (median): MB/s, messages/s, and the peak resident memory of the JVM and its Python
workers, sampled during the job.

Targets: local[2] on one_file at least 70 % of the baseline's MB/s; ten_small done within 10 s
of Spark being up; local[2] at least 1.7x local[1] on rotated.

    python bench/spark_bench.py [--capture /tmp/bench60.pcap] [--rotate 6] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import dpkt

from kafkasniff.capture.packets import FrameParser
from kafkasniff.pipeline.reading import connection_key

ROOT = Path(__file__).resolve().parents[1]
ETHERNET_HEADER = 14


def one_connection_capture(path: Path, size_mb: float) -> int:
    """One connection of at least size_mb: the busiest connection of the project's captures, its
    conversation repeated end to end (sequence numbers continued, handshake only at the start,
    FIN and RST only at the end). Returns the packet count."""
    with open(ROOT / "captures" / "confluent_codecs.pcap", "rb") as f:
        packets = [(ts, bytes(frame)) for ts, frame in dpkt.pcap.Reader(f)]
    parser = FrameParser()
    segments = [parser.parse(frame, dpkt.pcap.DLT_EN10MB, ts) for ts, frame in packets]
    payload = Counter()
    for seg in segments:
        payload[connection_key(seg)] += len(seg.payload)
    busiest = payload.most_common(1)[0][0]
    conversation = [(p, s) for p, s in zip(packets, segments) if connection_key(s) == busiest]
    sent = Counter()  # payload bytes per sender
    for _, seg in conversation:
        sent[seg.sport] += len(seg.payload)
    copies = max(2, int(size_mb * 1e6 / sum(sent.values())) + 1)
    span = conversation[-1][1].ts - conversation[0][1].ts + 0.001
    written = 0
    with open(path, "wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
        for copy in range(copies):
            for (ts, frame), seg in conversation:
                ending = seg.flags & (dpkt.tcp.TH_FIN | dpkt.tcp.TH_RST)
                if (seg.flags & dpkt.tcp.TH_SYN and copy) or (ending and copy < copies - 1):
                    continue
                tcp_at = ETHERNET_HEADER + (frame[ETHERNET_HEADER] & 0x0F) * 4
                other = next(port for port in sent if port != seg.sport)
                seq = (seg.seq + copy * sent[seg.sport]) % 2**32
                ack = (seg.ack + copy * sent[other]) % 2**32
                frame = frame[:tcp_at + 4] + seq.to_bytes(4, "big") + ack.to_bytes(4, "big") + frame[tcp_at + 12:]
                writer.writepkt(frame, ts + copy * span)
                written += 1
    return written


def rotate(path: Path, parts: int, directory: Path, max_bytes: float | None = None) -> list[Path]:
    """Cut a capture into `parts` files of about the same size, as tcpdump -C would (with max_bytes:
    only the packets in the capture's first max_bytes)."""
    with open(path, "rb") as f:
        packets = list(dpkt.pcap.Reader(f))
    if max_bytes is not None:
        total = 0
        for count, (_, frame) in enumerate(packets):
            total += 16 + len(frame)
            if total >= max_bytes:
                packets = packets[:count + 1]
                break
    files = []
    for part in range(parts):
        files.append(directory / f"{path.stem}-{len(packets)}.pcap{part}")
        with open(files[-1], "wb") as out:
            writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
            for ts, frame in packets[part * len(packets) // parts:(part + 1) * len(packets) // parts]:
                writer.writepkt(frame, ts)
    return files


class PeakMemory:
    """Peak resident memory of the JVM and of its Python workers, sampled every 0.2 s."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid
        self.jvm_mb = self.worker_mb = self.workers_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            parents, rss = {}, {}
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    fields = stat.read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                pid = int(stat.parent.name)
                parents[pid], rss[pid] = int(fields[1]), int(fields[21]) * 4096 / 1e6
            workers = [pid for pid in parents if pid != self.jvm_pid and self._descends(pid, parents)]
            self.jvm_mb = max(self.jvm_mb, rss.get(self.jvm_pid, 0.0))
            self.worker_mb = max([self.worker_mb] + [rss[pid] for pid in workers])
            self.workers_mb = max(self.workers_mb, sum(rss[pid] for pid in workers))

    def _descends(self, pid: int, parents: dict) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == self.jvm_pid:
                return True
        return False

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {"jvm_MB": round(self.jvm_mb), "largest_worker_MB": round(self.worker_mb),
                "all_workers_MB": round(self.workers_mb)}


def bench_master(master: str, inputs: dict[str, list[Path]], out: Path, runs: int) -> dict:
    """Run in a fresh process, so that starting Spark is measured in full."""
    from kafkasniff.pipeline.build import build_tables
    from kafkasniff.pipeline.inputs import expand_local
    from kafkasniff.pipeline.sparkenv import start_session

    started = time.monotonic()
    spark, log_dir = start_session(master)
    result = {"master": master, "start_s": round(time.monotonic() - started, 1)}
    try:
        for label, files in inputs.items():
            measured = []
            for _ in range(1 if label == "ten_small" else runs):
                memory = PeakMemory(spark.sparkContext._gateway.proc.pid)
                summary = build_tables(spark, expand_local(list(map(str, files)))[0], str(out / label))
                measured.append((summary.seconds, summary, memory.stop()))
            seconds, summary, memory = sorted(measured, key=lambda m: m[0])[len(measured) // 2]
            result[label] = {"MB": round(summary.bytes / 1e6, 1), "seconds": round(seconds, 2),
                             "runs": [round(m[0], 2) for m in measured],
                             "MB/s": round(summary.bytes / 1e6 / seconds, 2),
                             "messages/s": round(summary.messages / seconds),
                             "messages": summary.messages, "records": summary.records, **memory}
    finally:
        spark.stop()
    return result


def decode_seconds(capture: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.monotonic()
        with open("/dev/null", "w") as sink:
            subprocess.run([sys.executable, "-m", "kafkasniff", "decode", "--json", "-j", "2", str(capture)],
                           stdout=sink, check=True)
        times.append(time.monotonic() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path, default=Path("/tmp/bench60.pcap"))
    parser.add_argument("--rotate", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    parser.add_argument("--run-master", help=argparse.SUPPRESS)
    parser.add_argument("inputs", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_master:
        inputs = {label: list(map(Path, files)) for label, files in json.loads(args.inputs).items()}
        with tempfile.TemporaryDirectory(prefix="kafkasniff-bench-out-") as out:
            print(json.dumps(bench_master(args.run_master, inputs, Path(out), args.runs)), flush=True)
        return
    if not args.capture.exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "make_big_capture.py"), str(args.capture)], check=True)
    big = args.capture
    size = big.stat().st_size
    with tempfile.TemporaryDirectory(prefix="kafkasniff-bench-") as tmp:
        work = Path(tmp)
        rotated = rotate(big, args.rotate, work)
        ten_small = rotate(big, 10, work, max_bytes=10e6)
        one_connection = work / "one_connection.pcap"
        one_connection_capture(one_connection, size / 1e6)
        print(f"capture: {big}, {size / 1e6:.1f} MB; rotated into {args.rotate} files; 10 captures of "
              f"{sum(f.stat().st_size for f in ten_small) / 10e6:.1f} MB", flush=True)

        times = decode_seconds(big, args.runs)
        baseline = size / 1e6 / sorted(times)[len(times) // 2]
        print(f"baseline decode --json -j 2: {' '.join(f'{t:.2f}' for t in times)} s, {baseline:.2f} MB/s",
              flush=True)
        inputs = {"ten_small": ten_small, "one_file": [big], "rotated": rotated, "one_connection": [one_connection]}
        results = {}
        for master in args.masters:
            done = subprocess.run([sys.executable, __file__, "--runs", str(args.runs), "--run-master", master,
                                   json.dumps({label: list(map(str, files)) for label, files in inputs.items()})],
                                  check=True, capture_output=True, text=True)
            results[master] = json.loads(done.stdout.splitlines()[-1])
            print(json.dumps(results[master]), flush=True)
    if {"local[1]", "local[2]"} <= set(results):
        one, two = results["local[1]"], results["local[2]"]
        targets = (
            ("local[2] one file, share of decode --json -j 2's MB/s (>= 70 %)",
             two["one_file"]["MB/s"] / baseline, 0.70, "{:.0%}"),
            ("ten 1 MB captures, seconds after Spark is up, local[2] (<= 10)",
             two["ten_small"]["seconds"], 10, "{:.1f}"),
            ("rotated files, local[2] / local[1] speed (>= 1.7x)",
             one["rotated"]["seconds"] / two["rotated"]["seconds"], 1.7, "{:.2f}x"),
        )
        for label, value, bound, shown in targets:
            met = value <= bound if "<=" in label else value >= bound
            print(f"{label:<70} {shown.format(value):>8}  {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
