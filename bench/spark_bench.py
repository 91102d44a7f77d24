"""Throughput of the Spark pipeline on a large capture, and the fixed cost of starting Spark.

Builds a capture of at least --size-mb from the project's captures (copies one after another
in time, each copy's client ports renumbered so its connections are new ones; TCP checksums
are left stale, which the reader does not check), then for each master (local[1], local[2]):

- start: seconds to start the Spark session;
- first job: `spark` on the smallest capture (Python workers start, JIT warms up);
- one_file / rotated: `spark` on the big capture as one file, and cut into --rotate files
  (one read task per file) — MB/s and messages/s of the whole job;
- one_connection: a capture of the same size holding a single connection (all its packets
  meet in one task), to see that memory does not grow with a connection's size.

Peak resident memory of the JVM and its Python workers is sampled during each job.

Baseline: `kafkasniff decode --json` on the big capture, in one process, to /dev/null.

    python bench/spark_bench.py [--size-mb 60] [--rotate 6] [--masters 'local[1]' 'local[2]']
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


def bench_master(master: str, inputs: dict[str, list[Path]], out: Path) -> dict:
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
        for label, files in inputs.items():
            memory = PeakMemory(spark.sparkContext._gateway.proc.pid)
            summary = build_tables(spark, expand_local(list(map(str, files)))[0], str(out / label))
            result[label] = {"MB": round(summary.bytes / 1e6, 1), "seconds": round(summary.seconds, 2),
                             "MB/s": round(summary.bytes / 1e6 / summary.seconds, 2),
                             "messages/s": round(summary.messages / summary.seconds),
                             "messages": summary.messages, "records": summary.records, **memory.stop()}
    finally:
        spark.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=60)
    parser.add_argument("--rotate", type=int, default=6)
    parser.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    parser.add_argument("--run-master", help=argparse.SUPPRESS)
    parser.add_argument("inputs", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_master:
        inputs = {label: list(map(Path, files)) for label, files in json.loads(args.inputs).items()}
        with tempfile.TemporaryDirectory(prefix="kafkasniff-bench-out-") as out:
            print(json.dumps(bench_master(args.run_master, inputs, Path(out))), flush=True)
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
        one_connection = work / "one_connection.pcap"
        one_connection_capture(one_connection, args.size_mb)
        inputs = {"one_file": [big], "rotated": rotated, "one_connection": [one_connection]}
        for master in args.masters:
            subprocess.run([sys.executable, __file__, "--run-master", master, json.dumps(
                {label: list(map(str, files)) for label, files in inputs.items()})], check=True)


if __name__ == "__main__":
    main()
