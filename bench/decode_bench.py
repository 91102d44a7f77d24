"""`kafkasniff decode` against tshark on one capture file: wall time, CPU time and peak memory.

Two groups, each run --runs times, alternating (kafkasniff, kafkasniff -j 1, tshark, kafkasniff,
...), output to /dev/null:

    json:  kafkasniff decode --json F   (and -j 1)   vs  tshark -r F -Y kafka -T json -d tcp.port==P,kafka ...
    line:  kafkasniff decode F          (and -j 1)   vs  tshark -r F -Y kafka -d tcp.port==P,kafka ...

`kafkasniff decode` shares a big capture's connections among one worker process per core (up to
4); `-j 1` is the same decode in one process. CPU time (os.wait4) includes the workers'. Memory
is the peak, over samples every 50 ms, of the summed proportional set size (PSS: shared pages
split among their sharers) of the command and its workers, and also each run's largest single
process (ru_maxrss). The targets checked: --json at least 2x faster than tshark's JSON, the
one-line view no slower than tshark's, kafkasniff's peak memory at most 200 MB. --profile then
runs both kafkasniff modes once, in one process, under cProfile and prints the top functions
by own time.

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
MEMORY_SAMPLE_SECONDS = 0.05


@dataclass
class Timings:
    label: str
    command: list[str]
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    pss_mb: list[float] = field(default_factory=list)

    def run(self) -> None:
        began = time.perf_counter()
        errors = tempfile.TemporaryFile()
        child = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=errors)
        peak_pss = 0
        while True:
            # wait4 rather than child.wait(): it also gives CPU time and peak RSS, the reaped workers' included.
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            peak_pss = max(peak_pss, tree_pss_kib(child.pid))
            time.sleep(MEMORY_SAMPLE_SECONDS)
        self.wall.append(time.perf_counter() - began)
        child.returncode = exit_code = os.waitstatus_to_exitcode(status)
        if exit_code != 0:
            errors.seek(0)
            raise SystemExit(f"{' '.join(self.command)} failed ({exit_code}):\n{errors.read().decode()[-2000:]}")
        errors.close()
        self.cpu.append(usage.ru_utime + usage.ru_stime)
        self.rss_mb.append(usage.ru_maxrss / 1024)  # KiB on Linux
        self.pss_mb.append(peak_pss / 1024)

    @property
    def median(self) -> float:
        return statistics.median(self.wall)


def tree_pss_kib(pid: int) -> int:
    """Summed PSS of a process and its descendants, in KiB (0 for those already gone)."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return total
    return total + sum(tree_pss_kib(c) for c in children)


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


def compare(group: tuple[Timings, ...], runs: int) -> None:
    for _ in range(runs):
        for timings in group:
            timings.run()


def show(rows: list[Timings]) -> None:
    print(f"{'command':<26} {'runs (s)':<20} {'median s':>9} {'cpu s':>7} {'peak PSS MB':>12} {'max RSS MB':>11}")
    for t in rows:
        runs = " ".join(f"{w:.2f}" for w in t.wall)
        print(f"{t.label:<26} {runs:<20} {t.median:>9.2f} {statistics.median(t.cpu):>7.2f} "
              f"{max(t.pss_mb):>12.1f} {max(t.rss_mb):>11.1f}")


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
                 Timings("tshark -T json", [args.tshark, "-r", f, "-Y", "kafka", "-T", "json", *decode_as]),
                 Timings("kafkasniff --json -j 1", [*ours, "decode", "--json", "-j", "1", f]))
    line_pair = (Timings("kafkasniff (one line)", [*ours, "decode", f]),
                 Timings("tshark (one line)", [args.tshark, "-r", f, "-Y", "kafka", *decode_as]),
                 Timings("kafkasniff -j 1", [*ours, "decode", "-j", "1", f]))

    size_mb = args.capture.stat().st_size / 1e6
    print(f"{f}: {size_mb:.1f} MB, broker ports {ports}, {args.runs} alternating runs each, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    compare(json_pair, args.runs)
    compare(line_pair, args.runs)
    show([*json_pair, *line_pair])

    json_ratio = json_pair[1].median / json_pair[0].median
    line_ratio = line_pair[1].median / line_pair[0].median
    ours_runs = (json_pair[0], json_pair[2], line_pair[0], line_pair[2])
    peak = max(max(max(t.pss_mb), max(t.rss_mb)) for t in ours_runs)
    print()
    for name, (parallel, tshark, single) in (("json", json_pair), ("one-line", line_pair)):
        print(f"{name}: speed-up over tshark in one process {tshark.median / single.median:.2f}x (wall), "
              f"{statistics.median(tshark.cpu) / statistics.median(single.cpu):.2f}x (CPU); "
              f"all cores use {statistics.median(parallel.cpu) / statistics.median(single.cpu):.2f}x "
              f"the CPU time of one process")
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
