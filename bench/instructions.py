"""Instructions, not seconds: `kafkasniff decode -j 1` against tshark under valgrind's callgrind.

Wall time on a shared machine swings by a third from minute to minute; the number of instructions a
command executes does not (the same binary on the same input gives the same count). This runs each
command once under callgrind, on the capture and on an empty capture of the same file's format (the
start-up alone), and prints both counts and the work in between, for the one-line view and for JSON.

    python bench/make_big_capture.py /tmp/small.pcap --target-mb 3
    python bench/instructions.py /tmp/small.pcap

Callgrind runs a program some 50 times slower: give it a capture of a few MB. One process only
(`-j 1`): instructions say how much work there is, not how it shares out over cores.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COLLECTED = re.compile(rb"Collected : (\d+)")


def instructions(command: list[str]) -> int:
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    return int(COLLECTED.search(run.stderr).group(1))


def empty_capture_like(capture: Path, into: Path) -> Path:
    """The capture's pcap file header and no records: what start-up alone costs."""
    empty = into / "empty.pcap"
    empty.write_bytes(capture.read_bytes()[:24])
    return empty


def commands(capture: Path, ports: list[int], view: str) -> dict[str, list[str]]:
    decode = [sys.executable, "-m", "kafkasniff", "decode", "-j", "1"] + (["--json"] if view == "json" else [])
    tshark = ["tshark", "-r", str(capture), "-Y", "kafka"] + (["-T", "json"] if view == "json" else [])
    for port in ports:
        tshark += ["-d", f"tcp.port=={port},kafka"]
    return {"kafkasniff": decode + [str(capture)], "tshark": tshark}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path)
    parser.add_argument("--port", type=int, action="append", default=[], help="broker port (repeatable)")
    parser.add_argument("--view", choices=("line", "json", "both"), default="both")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    manifest = args.capture.with_name(args.capture.name + ".json")
    ports = args.port or (json.loads(manifest.read_text())["broker_ports"] if manifest.exists() else [9092])
    views = ("line", "json") if args.view == "both" else (args.view,)
    with tempfile.TemporaryDirectory() as tmp:
        empty = empty_capture_like(args.capture, Path(tmp))
        print(f"{args.capture}: {args.capture.stat().st_size / 1e6:.1f} MB; instructions (millions)")
        print(f"{'view':6} {'command':11} {'whole run':>10} {'start-up':>9} {'work':>9}")
        for view in views:
            work = {}
            for name, command in commands(args.capture, ports, view).items():
                whole = instructions(command)
                start = instructions([str(empty) if part == str(args.capture) else part for part in command])
                work[name] = whole - start
                print(f"{view:6} {name:11} {whole / 1e6:10.0f} {start / 1e6:9.0f} {work[name] / 1e6:9.0f}")
            print(f"{view:6} kafkasniff's work is {work['kafkasniff'] / work['tshark']:.2f}x tshark's")


if __name__ == "__main__":
    main()
