"""A command run in a process of its own, measured: what the hostile-input tests bound.

The command runs under a small Python parent that reads its standard output as it comes (keeping only the
start, and counting records), then reports its exit status, its peak resident memory (the largest process of the
tree: getrusage of the waited-for children), the peak memory of the whole tree (its processes' proportional set
sizes summed, sampled every 10 ms: what decode's worker processes take together) and the seconds it took,
start-up included.
"""

from __future__ import annotations

import subprocess
import sys
from typing import NamedTuple

HEAD_BYTES = 1 << 16
RECORD_MARK = b'{"offset":'  # how a record starts in --json

_PARENT = f"""
import glob, resource, subprocess, sys, threading, time
started = time.monotonic()
child = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stdin=None if sys.argv[1] == "-" else open(sys.argv[1], "rb"))
done = threading.Event()
tree_peak = 0

def tree_pss(root):
    total, pids = 0, [root]
    while pids:
        pid = pids.pop()
        try:
            for tasks in glob.glob(f"/proc/{{pid}}/task/*/children"):
                pids += [int(kid) for kid in open(tasks).read().split()]
            total += next(int(line.split()[1]) for line in open(f"/proc/{{pid}}/smaps_rollup") if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass  # gone meanwhile
    return total

def sample():
    global tree_peak
    while not done.wait(0.01):
        tree_peak = max(tree_peak, tree_pss(child.pid))

sampler = threading.Thread(target=sample)
sampler.start()
head = tail = b""
size = records = 0
while chunk := child.stdout.read(1 << 20):
    records += (tail + chunk).count({RECORD_MARK!r}) - tail.count({RECORD_MARK!r})
    head = (head + chunk)[:{HEAD_BYTES}]
    tail = chunk[-16:]
    size += len(chunk)
done.set()
sampler.join()
child.wait()
seconds = time.monotonic() - started
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
sys.stdout.buffer.write(b"%d %d %d %d %d %f\\n" % (child.returncode, size, records, peak, tree_peak, seconds) + head)
"""


class Measured(NamedTuple):
    returncode: int
    head: bytes          # the first 64 KiB of standard output
    size: int            # bytes of standard output in all
    records: int         # records it lists (--json)
    peak_mb: float       # peak resident memory of the largest process
    tree_mb: float       # peak memory of the process tree (sampled)
    seconds: float
    stderr: str


def run_measured(argv: list[str], stdin: str | None = None, timeout: float = 300) -> Measured:
    """Run argv (stdin: a file to read from) and measure it."""
    done = subprocess.run([sys.executable, "-c", _PARENT, stdin or "-", *argv], capture_output=True,
                          timeout=timeout, check=True)
    first, head = done.stdout.split(b"\n", 1)
    code, size, records, peak_kb, tree_kb, seconds = first.split()
    return Measured(int(code), head, int(size), int(records), int(peak_kb) / 1024, int(tree_kb) / 1024,
                    float(seconds), done.stderr.decode(errors="replace"))


def decode_measured(capture, options: list[str], timeout: float = 300) -> Measured:
    """`kafkasniff decode OPTIONS CAPTURE`, measured."""
    return run_measured([sys.executable, "-m", "kafkasniff", "decode", *options, str(capture)], timeout=timeout)
