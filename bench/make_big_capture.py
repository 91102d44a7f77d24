"""Build a large capture of real client traffic for benchmarks, from the project's own captures.

Every capture in captures/ (kafka-python, confluent-kafka and aiokafka with every codec,
consumer groups, admin, transactions, old API versions, port 19092) is copied over and over
with dpkt: each copy gets client ports of its own (so every connection stays distinct, as
tcp.stream and kafkasniff number them) and is moved in time, copies overlapping so many
connections are open at once. The broker ports stay 9092 and 19092; TCP checksums are
recomputed. confluent_codecs.pcap (two 1 MiB messages) is copied once per round, the others
--small-copies times, so small messages dominate the count and big ones the bytes.

    python bench/make_big_capture.py /tmp/big.pcap [--target-mb 55] [--small-copies 10]

Writes F and F.json (broker ports, packets, bytes, composition) next to it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import dpkt

REPO = Path(__file__).resolve().parent.parent
CAPTURES = REPO / "captures"
BIG_ONE = "confluent_codecs"
COPY_STAGGER = 0.002  # seconds between the starts of overlapping copies
FIRST_CLIENT_PORT = 20000


def read(path: Path) -> list[tuple[float, bytes]]:
    with open(path, "rb") as f:
        return [(ts, bytes(frame)) for ts, frame in dpkt.pcap.Reader(f)]


class PortAllocator:
    """A fresh client port for every (copy, original client port); never a broker port."""

    def __init__(self, broker_ports: set[int]):
        self.broker_ports = broker_ports
        self.next = FIRST_CLIENT_PORT

    def take(self) -> int:
        while self.next in self.broker_ports:
            self.next += 1
        if self.next > 65535:
            raise SystemExit("out of client ports: lower --target-mb or --small-copies")
        port, self.next = self.next, self.next + 1
        return port


def copied(packets, broker_port: int, ports: PortAllocator, shift: float):
    """One copy of a capture: client ports replaced, times shifted."""
    mapping: dict[int, int] = {}

    def new_port(original: int) -> int:
        if original not in mapping:
            mapping[original] = ports.take()
        return mapping[original]

    for ts, frame in packets:
        eth = dpkt.ethernet.Ethernet(frame)
        ip = eth.data
        tcp = ip.data
        if tcp.dport == broker_port:
            tcp.sport = new_port(tcp.sport)
        else:
            tcp.dport = new_port(tcp.dport)
        ip.sum = 0
        tcp.sum = 0
        yield ts + shift, bytes(eth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path)
    parser.add_argument("--target-mb", type=float, default=55.0, help="stop after the round that passes this size")
    parser.add_argument("--small-copies", type=int, default=10, help="copies of each small capture per round")
    args = parser.parse_args()

    captures = {}
    for manifest_path in sorted(CAPTURES.glob("*.json")):
        manifest = json.loads(manifest_path.read_text())
        captures[manifest_path.stem] = (manifest["broker"]["port"], read(CAPTURES / manifest["pcap"]))
    broker_ports = {port for port, _packets in captures.values()}
    ports = PortAllocator(broker_ports)

    target = args.target_mb * 1e6
    written = packets_written = rounds = 0
    start = min(packets[0][0] for _port, packets in captures.values())
    clock = start
    with open(args.output, "wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
        while written < target:
            copies = []
            for name, (broker_port, packets) in captures.items():
                for j in range(1 if name == BIG_ONE else args.small_copies):
                    shift = clock - packets[0][0] + j * COPY_STAGGER
                    copies.append(list(copied(packets, broker_port, ports, shift)))
            round_end = clock
            for ts, frame in heapq.merge(*copies, key=lambda packet: packet[0]):
                writer.writepkt(frame, ts)
                written += 16 + len(frame)
                packets_written += 1
                round_end = max(round_end, ts)
            clock = round_end + 0.010
            rounds += 1
            print(f"round {rounds}: {written / 1e6:.1f} MB, {packets_written} packets", file=sys.stderr)

    summary = {
        "capture": str(args.output), "bytes": args.output.stat().st_size, "packets": packets_written,
        "rounds": rounds, "broker_ports": sorted(broker_ports), "client_ports_used": ports.next - FIRST_CLIENT_PORT,
        "copies_per_round": {name: 1 if name == BIG_ONE else args.small_copies for name in captures},
        "built_from": "captures/*.pcap replicated with new client ports and shifted times (bench/make_big_capture.py)",
    }
    Path(f"{args.output}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
