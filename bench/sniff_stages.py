"""Where `kafkasniff sniff` spends its time per packet: its loop cut short at each stage. Run as root.

    python bench/sniff_stages.py /tmp/bench60.pcap [--pps 60000] [--seconds 4] [--port P ...]

For each stage, one process captures on loopback as `sniff` does (the ring, the kernel filter, the garbage
collector set as sniff sets it) while tcpreplay sends the capture's packets at --pps (the replayed copy of
sniff_throughput.py: destination MAC of another host, frames longer than tcpreplay sends cut in two), and
does only the work up to that stage:

    read      the ring's blocks walked into TCP segments (headers parsed in C)
    tcp       + TCP reassembly
    sessions  + framing, decoding and pairing (the Analyzer)
    line      + the one-line view written to /dev/null, flushed after each block

Printed per stage: the CPU time (user and system, from the first packet to the last) per packet read, and the
kernel's counters (a stage with drops did not keep up: lower --pps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

STAGES = ("read", "tcp", "sessions", "line")


def capture_stage(stage: str, ports: list[int]) -> None:
    """The sniffer's loop up to `stage`, until SIGINT; then one line of numbers on stdout."""
    from kafkasniff.capture.live import LiveCapture, port_filter
    from kafkasniff.commands.decode import make_options
    from kafkasniff.engine.heap import collect_rarely
    from kafkasniff.render.output import Output
    from kafkasniff.stream.analyzer import Analyzer

    capture = LiveCapture("lo", port_filter(tuple(ports)))
    signal.signal(signal.SIGINT, lambda *_: capture.stop())
    analyzer = Analyzer(ports)
    output = Output(make_options(False, False, False, (), (), (), (), False, False, False, False),
                    open(os.devnull, "w"))
    collect_rarely()
    print("ready", flush=True)
    began = None
    for segments in capture.segment_batches():
        if segments is None:
            continue
        if began is None:
            began = resource.getrusage(resource.RUSAGE_SELF)
        if stage == "tcp":
            analyzer.tcp.feed_all(segments)
        elif stage in ("sessions", "line"):
            events = analyzer.feed_all(segments)
            if stage == "line":
                for ev in events:
                    output.emit(ev)
                output.flush()
    ended = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ended.ru_utime - began.ru_utime) + (ended.ru_stime - began.ru_stime) if began else 0.0
    packets, drops = capture.kernel_stats()
    print(json.dumps({"frames": capture.frames, "cpu": cpu, "packets": packets, "drops": drops}), flush=True)


def measure(stage: str, replay: Path, ports: list[int], pps: int, seconds: float) -> dict:
    sniffer = subprocess.Popen([sys.executable, __file__, "--stage", stage, *[f"--port={p}" for p in ports]],
                               stdout=subprocess.PIPE, text=True)
    assert sniffer.stdout.readline().strip() == "ready"
    command = ["tcpreplay", "-i", "lo", "--pps", str(pps), "--limit", str(int(pps * seconds))]
    if pps >= 20_000:
        command += ["--pps-multi", str(pps // 10_000)]
    subprocess.run([*command, str(replay)], capture_output=True, check=True)
    sniffer.send_signal(signal.SIGINT)
    numbers = json.loads(sniffer.stdout.readline())
    sniffer.wait()
    return numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path, nargs="?")
    parser.add_argument("--pps", type=int, default=60_000)
    parser.add_argument("--seconds", type=float, default=4.0, help="of replay per stage (at most the capture)")
    parser.add_argument("--port", type=int, action="append", default=[],
                        help="broker port (repeatable; default: from CAPTURE.json)")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # the capturing process
    args = parser.parse_args()
    if args.stage:
        capture_stage(args.stage, args.port)
        return
    if os.geteuid() != 0:
        sys.exit("run as root: packet capture and tcpreplay need it")
    sys.path.insert(0, str(Path(__file__).parent))
    from sniff_throughput import replay_copy

    summary = Path(f"{args.capture}.json")
    ports = args.port or (json.loads(summary.read_text()).get("broker_ports") if summary.exists() else None) or [9092]
    with tempfile.TemporaryDirectory(prefix="sniff-stages-") as tmp:
        replay = Path(tmp) / args.capture.name
        replay_copy(args.capture, replay, None)
        print(f"{args.capture}: {args.pps:,} packets/s for {args.seconds:g} s; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        previous = 0.0
        for stage in STAGES:
            n = measure(stage, replay, ports, args.pps, args.seconds)
            per_frame = n["cpu"] / n["frames"] * 1e6 if n["frames"] else float("nan")
            print(f"  {stage:<9} {per_frame:6.2f} us/packet (+{per_frame - previous:5.2f})  {n['frames']:,} packets "
                  f"read, kernel: {n['packets']:,} received, {n['drops']:,} dropped")
            previous = per_frame


if __name__ == "__main__":
    main()
