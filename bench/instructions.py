"""Instructions, not seconds: `kafkasniff decode -j 1` against tshark under valgrind's callgrind.

Wall time on a shared machine swings by a third from minute to minute; the number of instructions a
command executes does not (the same binary on the same input gives the same count). This runs each
command once under callgrind, on the capture and on an empty capture of the same file's format (the
start-up alone), and prints both counts and the work in between, per view: the one-line view, JSON
and, with --view verbose or all, -V. The work is also given per record (data records produced and
fetched, as `kafkasniff decode --stats --json` counts them on the same file) and per Kafka message.

    python bench/make_big_capture.py /tmp/small.pcap --target-mb 3
    python bench/instructions.py /tmp/small.pcap

    python bench/record_records_heavy.py /tmp/records_heavy.pcap
    python bench/instructions.py /tmp/records_heavy.pcap --cut-mb 4      # its first 4 MB

Callgrind runs a program some 50 times slower: give it a capture of a few MB, or --cut-mb N to
take the first N MB of a bigger pcap (whole packets; connections cut off at the end show up as
skipped bytes). One process only (`-j 1`): instructions say how much work there is, not how it
shares out over cores. tshark 4.0 marks Produce v9+ and Fetch v12+ malformed and skips their
records, so on modern clients' traffic its per-record count covers less work.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

COLLECTED = re.compile(rb"Collected : (\d+)")
PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}
VIEW_OPTIONS = {"line": ([], []), "json": (["--json"], ["-T", "json"]), "verbose": (["-V"], ["-V"])}


def instructions(command: list[str]) -> int:
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    return int(COLLECTED.search(run.stderr).group(1))


def empty_capture_like(capture: Path, into: Path) -> Path:
    """The capture's pcap file header and no records: what start-up alone costs."""
    empty = into / "empty.pcap"
    empty.write_bytes(capture.read_bytes()[:24])
    return empty


def cut_capture(capture: Path, into: Path, megabytes: float) -> Path:
    """The pcap file header and the whole packet records that fit in the first `megabytes` MB."""
    limit = int(megabytes * 1e6)
    cut = into / f"{capture.stem}.first{megabytes:g}MB.pcap"
    with open(capture, "rb") as src, open(cut, "wb") as dst:
        header = src.read(24)
        order = PCAP_MAGICS.get(header[:4])
        if order is None:
            raise SystemExit(f"{capture}: --cut-mb needs a pcap file (not pcapng)")
        dst.write(header)
        written = 24
        while True:
            record_header = src.read(16)
            if len(record_header) < 16:
                break
            included = struct.unpack(order + "IIII", record_header)[2]
            if written + 16 + included > limit:
                break
            dst.write(record_header + src.read(included))
            written += 16 + included
    return cut


def census(capture: Path, ours: list[str]) -> tuple[int, int]:
    """(data records produced + fetched, Kafka messages) as kafkasniff counts them."""
    with subprocess.Popen([*ours, "decode", "--stats", "--json", str(capture)], stdout=subprocess.PIPE) as run:
        last = b""
        for line in run.stdout:  # every message's JSON, then the stats
            last = line
    if run.returncode != 0:
        raise SystemExit(f"kafkasniff decode --stats --json {capture} failed ({run.returncode})")
    stats = json.loads(last)
    records = sum(t["records_produced"] + t["records_fetched"] for t in stats["topics"])
    messages = sum(a["requests"] + a["responses"] for a in stats["apis"])
    return records, messages


def commands(capture: Path, ports: list[int], view: str, kafkasniff: list[str]) -> dict[str, list[str]]:
    ours, theirs = VIEW_OPTIONS[view]
    decode = [*kafkasniff, "decode", "-j", "1", *ours]
    tshark = ["tshark", "-r", str(capture), "-Y", "kafka", *theirs]
    for port in ports:
        tshark += ["-d", f"tcp.port=={port},kafka"]
    return {"kafkasniff": decode + [str(capture)], "tshark": tshark}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path)
    parser.add_argument("--port", type=int, action="append", default=[], help="broker port (repeatable)")
    parser.add_argument("--view", choices=("line", "json", "verbose", "both", "all"), default="both",
                        help="both: line and json; all: also verbose")
    parser.add_argument("--kafkasniff", default=f"{sys.executable} -m kafkasniff",
                        help="the kafkasniff command (default: this Python -m kafkasniff)")
    parser.add_argument("--cut-mb", type=float, help="measure the first N MB of the capture only")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    manifest = args.capture.with_name(args.capture.name + ".json")
    ports = args.port or (json.loads(manifest.read_text())["broker_ports"] if manifest.exists() else [9092])
    views = {"both": ("line", "json"), "all": ("line", "json", "verbose")}.get(args.view, (args.view,))
    with tempfile.TemporaryDirectory() as tmp:
        capture = cut_capture(args.capture, Path(tmp), args.cut_mb) if args.cut_mb else args.capture
        empty = empty_capture_like(capture, Path(tmp))
        kafkasniff = shlex.split(args.kafkasniff)
        records, messages = census(capture, kafkasniff)
        print(f"{args.capture}" + (f", first {args.cut_mb:g} MB" if args.cut_mb else "")
              + f": {capture.stat().st_size / 1e6:.1f} MB, {messages:,} Kafka messages, {records:,} records "
                f"(produced + fetched); instructions (millions; per record and per message: thousands)")
        print(f"{'view':8} {'command':11} {'whole run':>10} {'start-up':>9} {'work':>9} {'per record':>11} "
              f"{'per message':>12}")
        for view in views:
            work = {}
            for name, command in commands(capture, ports, view, kafkasniff).items():
                whole = instructions(command)
                start = instructions([str(empty) if part == str(capture) else part for part in command])
                work[name] = whole - start
                per_record = f"{work[name] / records / 1e3:11.1f}" if records else f"{'-':>11}"
                per_message = f"{work[name] / messages / 1e3:12.1f}" if messages else f"{'-':>12}"
                print(f"{view:8} {name:11} {whole / 1e6:10.0f} {start / 1e6:9.0f} {work[name] / 1e6:9.0f} "
                      f"{per_record} {per_message}", flush=True)
            print(f"{view:8} kafkasniff's work is {work['kafkasniff'] / work['tshark']:.2f}x tshark's")


if __name__ == "__main__":
    main()
