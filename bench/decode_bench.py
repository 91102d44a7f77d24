"""`kafkasniff decode` against tshark on one capture file: wall time, CPU time and peak memory.

Two pairs, each run --runs times, alternating (kafkasniff, tshark, kafkasniff, ...), output to
/dev/null:

    json:  kafkasniff decode --json F           vs  tshark -r F -Y kafka -T json -d tcp.port==P,kafka ...
    line:  kafkasniff decode F                  vs  tshark -r F -Y kafka -d tcp.port==P,kafka ...

Peak memory is each child's own maximum RSS (os.wait4). The targets checked: --json at least
2x faster than tshark's JSON, the one-line view no slower than tshark's, kafkasniff's peak
RSS at most 200 MB. --profile then runs both kafkasniff modes once under cProfile and prints
the top functions by own time.

    python bench/make_big_capture.py /tmp/big.pcap
    python bench/decode_bench.py /tmp/big.pcap [--runs 3] [--profile]

Broker ports come from F.json (written by make_big_capture.py) or --port.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

JSON_SPEEDUP_TARGET = 2.0
LINE_SPEEDUP_TARGET = 1.0
RSS_TARGET_MB = 200


@dataclass
class Timings:
    label: str
    command: list[str]
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)

    def run(self) -> None:
        began = time.perf_counter()
        child = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with child.stderr:
            stderr = child.stderr.read()
        # wait4 rather than child.wait(): it also gives this child's own CPU time and peak RSS.
        _pid, status, usage = os.wait4(child.pid, 0)
        self.wall.append(time.perf_counter() - began)
        child.returncode = exit_code = os.waitstatus_to_exitcode(status)
        if exit_code != 0:
            raise SystemExit(f"{' '.join(self.command)} failed ({exit_code}):\n{stderr.decode()[-2000:]}")
        self.cpu.append(usage.ru_utime + usage.ru_stime)
        self.rss_mb.append(usage.ru_maxrss / 1024)  # KiB on Linux

    @property
    def median(self) -> float:
        return statistics.median(self.wall)


def kafkasniff_command() -> list[str]:
    found = shutil.which("kafkasniff")
    return [found] if found else [sys.executable, "-m", "kafkasniff"]


def broker_ports(capture: Path, given: list[int]) -> list[int]:
    if given:
        return given
    summary = Path(f"{capture}.json")
    if summary.exists():
        return json.loads(summary.read_text())["broker_ports"]
    return [9092]


def compare(ours: Timings, theirs: Timings, runs: int) -> None:
    for _ in range(runs):
        ours.run()
        theirs.run()


def show(rows: list[Timings]) -> None:
    print(f"{'command':<24} {'runs (s)':<26} {'median s':>9} {'cpu s':>7} {'max RSS MB':>11}")
    for t in rows:
        runs = " ".join(f"{w:.2f}" for w in t.wall)
        print(f"{t.label:<24} {runs:<26} {t.median:>9.2f} {statistics.median(t.cpu):>7.2f} {max(t.rss_mb):>11.1f}")


def profile(capture: Path, top: int) -> None:
    import pstats

    for label, options in (("one-line", []), ("--json", ["--json"])):
        with tempfile.NamedTemporaryFile(suffix=".prof") as out:
            subprocess.run([sys.executable, "-m", "cProfile", "-o", out.name, "-m", "kafkasniff", "decode",
                            *options, str(capture)], stdout=subprocess.DEVNULL, check=True)
            print(f"\n== cProfile, kafkasniff decode {label} (times inflated by the profiler)")
            stats = pstats.Stats(out.name)
            stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, action="append", default=[], help="broker port (repeatable)")
    parser.add_argument("--tshark", default="tshark")
    parser.add_argument("--profile", action="store_true", help="then profile kafkasniff in both modes")
    parser.add_argument("--top", type=int, default=25, help="functions shown per profile")
    args = parser.parse_args()

    ports = broker_ports(args.capture, args.port)
    decode_as = [arg for port in ports for arg in ("-d", f"tcp.port=={port},kafka")]
    ours = kafkasniff_command()
    f = str(args.capture)
    json_pair = (Timings("kafkasniff --json", [*ours, "decode", "--json", f]),
                 Timings("tshark -T json", [args.tshark, "-r", f, "-Y", "kafka", "-T", "json", *decode_as]))
    line_pair = (Timings("kafkasniff (one line)", [*ours, "decode", f]),
                 Timings("tshark (one line)", [args.tshark, "-r", f, "-Y", "kafka", *decode_as]))

    size_mb = args.capture.stat().st_size / 1e6
    print(f"{f}: {size_mb:.1f} MB, broker ports {ports}, {args.runs} alternating runs each, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    compare(*json_pair, args.runs)
    compare(*line_pair, args.runs)
    show([*json_pair, *line_pair])

    json_ratio = json_pair[1].median / json_pair[0].median
    line_ratio = line_pair[1].median / line_pair[0].median
    peak = max(max(t.rss_mb) for t in (json_pair[0], line_pair[0]))
    print()
    # On a shared machine wall time carries other people's load; CPU time does not.
    for name, (a, b) in (("json", json_pair), ("one-line", line_pair)):
        print(f"{name} speed-up by CPU time: {statistics.median(b.cpu) / statistics.median(a.cpu):.2f}x")
    for name, value, ok in (
        (f"--json speed-up over tshark -T json (target >= {JSON_SPEEDUP_TARGET:g}x)", f"{json_ratio:.2f}x",
         json_ratio >= JSON_SPEEDUP_TARGET),
        (f"one-line speed-up over tshark (target >= {LINE_SPEEDUP_TARGET:g}x)", f"{line_ratio:.2f}x",
         line_ratio >= LINE_SPEEDUP_TARGET),
        (f"kafkasniff peak RSS (target <= {RSS_TARGET_MB} MB)", f"{peak:.1f} MB", peak <= RSS_TARGET_MB),
    ):
        print(f"{name:<58} {value:>10}  {'met' if ok else 'MISSED'}")

    if args.profile:
        profile(args.capture, args.top)


if __name__ == "__main__":
    main()
