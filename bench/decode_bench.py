"""`kafkasniff decode` against tshark on one or more capture files: wall time, CPU time, peak memory.

For each capture, four groups, each run --runs times, alternating (kafkasniff, tshark,
kafkasniff -j 1, kafkasniff, ...), output to /dev/null:

    json:    kafkasniff decode --json F  (and -j 1)       vs  tshark -r F -Y kafka -T json -d tcp.port==P,kafka ...
    line:    kafkasniff decode F         (and -j 1)       vs  tshark -r F -Y kafka -d tcp.port==P,kafka ...
             kafkasniff decode --stats F (summary tables only)
    verbose: kafkasniff decode -V F      (and -j 1)       vs  tshark -r F -Y kafka -V -d tcp.port==P,kafka ...
    hex:     kafkasniff decode --hex F   (and -j 1)       vs  tshark -r F -Y kafka -x -d tcp.port==P,kafka ...
             (the byte view: kafkasniff's rows of every field's bytes against tshark's hex dump of every packet;
             reported, no target)

`kafkasniff decode` shares a big capture's connections among worker processes (the default for
captures of 8 MiB and about 50,000 packets or more: one per core, one more for the one-line view, at
most 4; `-V` into /dev/null too, a file); `-j 1` is the same decode in one process. CPU time (os.wait4)
includes the workers'. Memory is the peak, over samples every 50 ms, of the summed proportional
set size (PSS: shared pages split among their sharers) of the command and its workers, and also
each run's largest single process (ru_maxrss).

Reported per capture: each run's wall time, the median, CPU time, memory; tshark's median over
kafkasniff's (the speed-up) per view; records per second (records = produced + fetched data
records: the capture's .json `records_total` when it has one, as record_records_heavy.py writes,
else what `kafkasniff decode --stats --json` counts, run once untimed); and how many of the Kafka
frames tshark marks malformed (tshark 4.0 knows Produce <= v8, Fetch <= v11: newer versions are
malformed to it, so it skips their records and does less work). Targets: --json >= 3x and the
one-line view >= 3x as fast as tshark's, -V >= 2x; --stats at most 1.5x kafkasniff's own
one-line time; kafkasniff's peak memory <= 200 MB. --profile then runs the one-line view and
--json once, in one process, under cProfile and prints the top functions by own time.

    python bench/make_big_capture.py /tmp/bench60.pcap
    python bench/record_records_heavy.py /tmp/records_heavy.pcap
    python bench/decode_bench.py /tmp/bench60.pcap /tmp/records_heavy.pcap [--runs 3] [--profile]

Broker ports come from F.json (written by both scripts above) or --port (then for every capture).
--views json line verbose hex picks the groups (line includes --stats).
--kafkasniff CMD benchmarks another build, e.g. a checkout of an older commit with its C modules
built in place: PYTHONPATH=/tmp/old --kafkasniff '/path/.venv/bin/python -P -m kafkasniff'.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

JSON_SPEEDUP_TARGET = 3.0
LINE_SPEEDUP_TARGET = 3.0
VERBOSE_SPEEDUP_TARGET = 2.0
STATS_OVER_LINE_TARGET = 1.5
RSS_TARGET_MB = 200
MEMORY_SAMPLE_SECONDS = 0.05


@dataclass
class Timings:
    label: str
    command: list[str]
    ours: bool = True
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

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)

    @property
    def peak_mb(self) -> float:
        return max(max(self.pss_mb), max(self.rss_mb))


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


def kafkasniff_command(given: str | None = None) -> list[str]:
    if given:
        return shlex.split(given)
    found = shutil.which("kafkasniff") or str(Path(sys.executable).with_name("kafkasniff"))
    return [found] if Path(found).exists() else [sys.executable, "-m", "kafkasniff"]


def capture_summary(capture: Path) -> dict:
    summary = Path(f"{capture}.json")
    return json.loads(summary.read_text()) if summary.exists() else {}


def count_records(capture: Path, summary: dict, ours: list[str]) -> tuple[int, str, int | None]:
    """(records produced + fetched, where the count comes from, Kafka messages or None)."""
    if "records_total" in summary:
        return summary["records_total"], f"{capture.name}.json", None
    # Read line by line, keeping the last (the stats): every message's JSON comes first, and holding it
    # would raise this process's peak RSS, which the children forked afterwards report as their ru_maxrss.
    with subprocess.Popen([*ours, "decode", "--stats", "--json", str(capture)], stdout=subprocess.PIPE) as run:
        last = b""
        for line in run.stdout:
            last = line
    if run.returncode != 0:
        raise SystemExit(f"kafkasniff decode --stats --json {capture} failed ({run.returncode})")
    stats = json.loads(last)
    records = sum(t["records_produced"] + t["records_fetched"] for t in stats["topics"])
    messages = sum(a["requests"] + a["responses"] for a in stats["apis"])
    return records, "kafkasniff decode --stats --json", messages


def tshark_malformed(tshark: str, capture: Path, decode_as: list[str]) -> tuple[int, int, Counter]:
    """(Kafka frames, frames tshark marks malformed, malformed requests by 'API key vN')."""
    frames = malformed = 0
    by_api: Counter = Counter()
    with subprocess.Popen([tshark, "-r", str(capture), "-Y", "kafka", *decode_as, "-T", "fields",
                           "-e", "_ws.malformed", "-e", "kafka.request_key", "-e", "kafka.request.version"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as run:
        for line in run.stdout:
            frames += 1
            bad, key, version = (line.rstrip("\n").split("\t") + ["", "", ""])[:3]
            if bad:
                malformed += 1
                if key:
                    by_api[f"key {key.split(',')[0]} v{version.split(',')[0]}"] += 1
    return frames, malformed, by_api


def alternate(group: tuple[Timings, ...], runs: int) -> None:
    for _ in range(runs):
        for timings in group:
            timings.run()


def show(rows: list[Timings], records: int | None) -> None:
    width = max(len(t.label) for t in rows) + 1
    runs_width = max(len(" ".join(f"{w:.2f}" for w in t.wall)) for t in rows) + 1
    print(f"{'command':<{width}} {'runs (s)':<{runs_width}} {'median s':>9} {'cpu s':>7} {'peak PSS MB':>12} "
          f"{'max RSS MB':>11}" + (f" {'records/s':>10}" if records else ""))
    for t in rows:
        runs = " ".join(f"{w:.2f}" for w in t.wall)
        print(f"{t.label:<{width}} {runs:<{runs_width}} {t.median:>9.2f} {t.median_cpu:>7.2f} "
              f"{max(t.pss_mb):>12.1f} {max(t.rss_mb):>11.1f}"
              + (f" {records / t.median:>10,.0f}" if records else ""))


def bench(capture: Path, args) -> list[tuple[str, str, bool]]:
    summary = capture_summary(capture)
    ports = args.port or summary.get("broker_ports") or [9092]
    decode_as = [arg for port in ports for arg in ("-d", f"tcp.port=={port},kafka")]
    ours = kafkasniff_command(args.kafkasniff)
    tshark = args.tshark
    f = str(capture)
    json_group = (Timings("kafkasniff --json", [*ours, "decode", "--json", f]),
                  Timings("tshark -T json", [tshark, "-r", f, "-Y", "kafka", "-T", "json", *decode_as], ours=False),
                  Timings("kafkasniff --json -j 1", [*ours, "decode", "--json", "-j", "1", f]))
    line_group = (Timings("kafkasniff (one line)", [*ours, "decode", f]),
                  Timings("tshark (one line)", [tshark, "-r", f, "-Y", "kafka", *decode_as], ours=False),
                  Timings("kafkasniff -j 1 (one line)", [*ours, "decode", "-j", "1", f]),
                  Timings("kafkasniff --stats", [*ours, "decode", "--stats", f]))
    verbose_group = (Timings("kafkasniff -V", [*ours, "decode", "-V", f]),
                     Timings("tshark -V", [tshark, "-r", f, "-Y", "kafka", "-V", *decode_as], ours=False),
                     Timings("kafkasniff -V -j 1", [*ours, "decode", "-V", "-j", "1", f]))
    hex_group = (Timings("kafkasniff --hex", [*ours, "decode", "--hex", f]),
                 Timings("tshark -x", [tshark, "-r", f, "-Y", "kafka", "-x", *decode_as], ours=False),
                 Timings("kafkasniff --hex -j 1", [*ours, "decode", "--hex", "-j", "1", f]))

    size_mb = capture.stat().st_size / 1e6
    packets = summary.get("packets")
    print(f"\n== {f}: {size_mb:.1f} MB" + (f", {packets:,} packets" if packets else "")
          + f", broker ports {ports}; {args.runs} alternating runs each, "
            f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    records, source, messages = count_records(capture, summary, ours)
    print(f"records (produced + fetched): {records:,} (from {source})"
          + (f"; Kafka messages: {messages:,}" if messages is not None else ""))
    frames, malformed, by_api = tshark_malformed(tshark, capture, decode_as)
    print(f"tshark: {frames:,} Kafka frames, {malformed:,} marked malformed"
          + (f" (requests: {', '.join(f'{k} x{n}' for k, n in sorted(by_api.items()))})" if by_api else ""),
          flush=True)

    groups = {"json": json_group, "line": line_group, "verbose": verbose_group, "hex": hex_group}
    groups = {name: group for name, group in groups.items() if name in args.views}
    for group in groups.values():
        alternate(group, args.runs)
    show([t for group in groups.values() for t in group], records)
    print(f"load average at the end {os.getloadavg()[0]:.2f} (1 min), {os.getloadavg()[1]:.2f} (5 min)")

    print()
    for name, key, (parallel, theirs, single) in (("--json", "json", json_group), ("one-line", "line", line_group[:3]),
                                                  ("-V", "verbose", verbose_group), ("--hex", "hex", hex_group)):
        if key not in groups:
            continue
        print(f"{name}: tshark / kafkasniff {theirs.median / parallel.median:.2f}x (wall), "
              f"{theirs.median_cpu / parallel.median_cpu:.2f}x (CPU); in one process (-j 1) "
              f"{theirs.median / single.median:.2f}x (wall), {theirs.median_cpu / single.median_cpu:.2f}x (CPU); "
              f"workers use {parallel.median_cpu / single.median_cpu:.2f}x the CPU time of one process")
    checks = []
    if "json" in groups:
        json_ratio = json_group[1].median / json_group[0].median
        checks.append((f"--json speed-up over tshark -T json (target >= {JSON_SPEEDUP_TARGET:g}x)",
                       f"{json_ratio:.2f}x", json_ratio >= JSON_SPEEDUP_TARGET))
    if "line" in groups:
        line_ratio = line_group[1].median / line_group[0].median
        stats_ratio = line_group[3].median / line_group[0].median
        checks.append((f"one-line speed-up over tshark (target >= {LINE_SPEEDUP_TARGET:g}x)", f"{line_ratio:.2f}x",
                       line_ratio >= LINE_SPEEDUP_TARGET))
    if "verbose" in groups:
        verbose, their_verbose, _ = verbose_group
        verbose_ratio = their_verbose.median / verbose.median
        checks.append((f"-V speed-up over tshark -V (target >= {VERBOSE_SPEEDUP_TARGET:g}x)",
                       f"{verbose_ratio:.2f}x", verbose_ratio >= VERBOSE_SPEEDUP_TARGET))
    if "line" in groups:
        checks.append((f"--stats time / one-line time (target <= {STATS_OVER_LINE_TARGET:g}x)",
                       f"{stats_ratio:.2f}x", stats_ratio <= STATS_OVER_LINE_TARGET))
    peak = max(t.peak_mb for group in groups.values() for t in group if t.ours)
    checks.append((f"kafkasniff peak memory (target <= {RSS_TARGET_MB} MB)", f"{peak:.1f} MB",
                   peak <= RSS_TARGET_MB))
    print()
    for name, value, ok in checks:
        print(f"{name:<58} {value:>10}  {'met' if ok else 'MISSED'}")
    return [(capture.name, name.split(" (target")[0], value, ok) for name, value, ok in checks]


def profile(capture: Path, top: int) -> None:
    import pstats

    for label, options in (("one-line", []), ("--json", ["--json"])):
        with tempfile.NamedTemporaryFile(suffix=".prof") as out:
            subprocess.run([sys.executable, "-m", "cProfile", "-o", out.name, "-m", "kafkasniff", "decode",
                            "-j", "1", *options, str(capture)], stdout=subprocess.DEVNULL, check=True)
            print(f"\n== cProfile, kafkasniff decode -j 1 {label} {capture} (times inflated by the profiler)")
            stats = pstats.Stats(out.name)
            stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("captures", type=Path, nargs="+")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, action="append", default=[],
                        help="broker port (repeatable; default: from CAPTURE.json)")
    parser.add_argument("--tshark", default="tshark")
    parser.add_argument("--views", nargs="+", choices=("json", "line", "verbose", "hex"),
                        default=["json", "line", "verbose", "hex"],
                        help="groups to run (line includes --stats)")
    parser.add_argument("--kafkasniff", help="the kafkasniff command, e.g. 'python -m kafkasniff' "
                                              "(default: the kafkasniff beside this Python)")
    parser.add_argument("--profile", action="store_true", help="then profile kafkasniff in both modes")
    parser.add_argument("--top", type=int, default=25, help="functions shown per profile")
    args = parser.parse_args()

    verdicts = []
    for capture in args.captures:
        verdicts += bench(capture, args)
    if len(args.captures) > 1:
        print("\n== targets")
        for name, check, value, ok in verdicts:
            print(f"{name:<24} {check:<48} {value:>10}  {'met' if ok else 'MISSED'}")
    if args.profile:
        for capture in args.captures:
            profile(capture, args.top)


if __name__ == "__main__":
    main()
