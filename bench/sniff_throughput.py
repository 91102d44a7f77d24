"""How fast `kafkasniff sniff` decodes live: one kafka-python producer, as fast as it goes, on loopback.

Starts a Tansu broker, starts `kafkasniff sniff -i lo --port P --json` (output to
/dev/null; `--view line` for the one-line view, which skips record decoding), produces for --seconds, gives the sniffer --settle seconds to catch up,
stops it with SIGINT and reports, from its summary line and its CPU time:

- records/s the producer reached, and the Kafka messages/s and packets/s decoded live;
- kernel drops (frames the socket buffer had no room for) and backlog (frames the
  kernel captured that the sniffer had not read when it stopped);
- the sniffer's CPU seconds, and packets per CPU second (its ceiling on this machine).

Run as root: python bench/sniff_throughput.py [--seconds 10] [--value-size 100]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from broker import TansuBroker  # noqa: E402

SUMMARY = re.compile(r"(\d+) packets captured, (\d+) Kafka messages decoded; "
                     r"kernel: (\d+) packets received by filter, (\d+) dropped")


def produce_flat_out(bootstrap: str, topic: str, seconds: float, value_size: int) -> tuple[int, float]:
    """Send as fast as kafka-python goes for `seconds`; return (records acknowledged, seconds taken)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1)
    value = os.urandom(value_size)
    sent = 0
    began = time.monotonic()
    try:
        while time.monotonic() - began < seconds:
            for _ in range(1000):
                producer.send(topic, value=value)
            sent += 1000
        producer.flush()
        return sent, time.monotonic() - began
    finally:
        producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the producer runs")
    parser.add_argument("--value-size", type=int, default=100, help="bytes per record value")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds the sniffer gets to catch up")
    parser.add_argument("--buffer-mib", type=int, default=32, help="the sniffer's -B")
    parser.add_argument("--view", choices=("json", "line"), default="json",
                        help="json decodes every record; line decodes headers only")
    args = parser.parse_args()

    with TansuBroker() as broker:
        broker.create_topic("bench", partitions=3)
        sniffer = subprocess.Popen(
            [sys.executable, "-m", "kafkasniff", "sniff", "-i", "lo", "--port", str(broker.port),
             *(["--json"] if args.view == "json" else []), "-B", str(args.buffer_mib)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ready = sniffer.stderr.readline()
        if not ready.startswith("capturing on"):
            sys.exit(f"sniffer did not start: {ready}{sniffer.stderr.read()}")
        records, produce_seconds = produce_flat_out(broker.bootstrap, "bench", args.seconds, args.value_size)
        time.sleep(args.settle)
        sniffer.send_signal(signal.SIGINT)
        _, status, usage = os.wait4(sniffer.pid, 0)
        stderr = sniffer.stderr.read()
    match = SUMMARY.search(stderr)
    if os.waitstatus_to_exitcode(status) != 0 or match is None:
        sys.exit(f"sniffer failed: {stderr}")
    captured, messages, received, drops = (int(n) for n in match.groups())
    cpu = usage.ru_utime + usage.ru_stime
    print(f"producer: {records:,} records of {args.value_size} B in {produce_seconds:.1f} s "
          f"= {records / produce_seconds:,.0f} records/s")
    print(f"sniffer:  {messages:,} Kafka messages, {captured:,} packets decoded "
          f"= {messages / produce_seconds:,.0f} messages/s, {captured / produce_seconds:,.0f} packets/s")
    print(f"kernel:   {received:,} packets received by filter, {drops:,} dropped, "
          f"{received - drops - captured:,} left unread at stop")
    print(f"cpu:      sniffer used {cpu:.1f} s = {captured / cpu:,.0f} packets per CPU second")


if __name__ == "__main__":
    main()
