"""How fast `kafkasniff sniff` decodes live traffic on loopback. Two modes; run as root.

Replay mode (captures given): the highest drop-free packet rate per view.

    python bench/sniff_throughput.py /tmp/bench60.pcap /tmp/records_heavy.pcap [--view line json]
                                     [--seconds 10] [--start 5000] [--tolerance 0.15]

For each capture and view (`line`: `kafkasniff sniff` one line per message; `json`: `--json`, which
decodes every record), trials replay the capture onto loopback with `tcpreplay -i lo --pps N`
while `kafkasniff sniff -i lo --port P ... [--json] -B 32` (the default buffer; --buffer-mib)
writes to /dev/null. Each trial sends N x --seconds packets: the capture's first packets, or the
capture followed by copies of itself whose IPv4 addresses differ (so every copy's connections are
new ones; tcpreplay's own --loop --unique-ip breaks connections between two 127.0.0.1 ends). When
tcpreplay is done the sniffer is stopped with SIGINT, which makes it read what the kernel holds
(for up to 2 s) and exit. A trial passes when its summary shows no kernel drop (`... M dropped`)
AND that it read every packet the kernel counted, AND it exited within --max-lag seconds (1.0)
of the SIGINT: with a 32 MiB buffer a sniffer slower than the rate could otherwise hide its
deficit in the buffer for a whole trial. (The time to exit includes the sniffer's own end:
finishing the messages in flight and leaving Python, 0.1-0.3 s.) Rates go up x2 after a pass
and down x4 after a failure until both are seen, then
bisect (geometric middle) until the highest pass and the lowest failure are within
--tolerance; if tcpreplay cannot reach the rate asked, the result is "at least" what it sent.

The replayed copy of a capture has its destination MAC rewritten to 02:00:00:00:00:01: the kernel
then takes every replayed frame as meant for another host and drops it before IP, so no RST
answers the replay and no broker listening on a replayed port sees it, while packet sockets (the
sniffer) see every frame. tcpreplay 4.4 sends at most 65,535 bytes of a frame and loopback
captures hold frames of up to 65,549, so longer TCP segments are cut in two (--mss N cuts every
payload to N bytes, e.g. 1448 for Ethernet-sized packets).

Printed at the end, per capture and view: the highest drop-free rate in packets/s and MB/s and,
for --json on a records-heavy capture (one whose .json counts records, from
record_records_heavy.py), the records/s it decoded (records in the complete messages of the packets
that trial sent, counted offline with `kafkasniff decode --stats --json`). Targets: one-line view
drop-free at >= 100,000 packets/s; --json at >= 30,000 packets/s of records-heavy traffic. Both
count Ethernet-sized packets: replayed at loopback's sizes (records-heavy: 15 KB a packet on
average), a target is the same traffic in bytes (packets/s x 1,514 B: 151.4 and 45.4 MB/s).

Producer mode (no capture): one kafka-python producer, as fast as it goes, against a Tansu broker.

    python bench/sniff_throughput.py [--seconds 10] [--value-size 100] [--view json|line]

Starts `kafkasniff sniff -i lo --port P --json` (or the one-line view), produces for --seconds,
gives the sniffer --settle seconds to catch up, stops it with SIGINT and reports from its summary
line and CPU time: records/s the producer reached, Kafka messages/s and packets/s decoded live,
kernel drops and backlog (frames captured but unread at stop), CPU seconds and packets per CPU
second (its ceiling on this machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

SUMMARY = re.compile(r"(\d+) packets captured, (\d+) Kafka messages decoded; "
                     r"kernel: (\d+) packets received by filter, (\d+) dropped")
REPLAY_SENT = re.compile(r"Actual: (\d+) packets \((\d+) bytes\) sent in ([\d.]+) seconds")
OTHER_HOST_MAC = "02:00:00:00:00:01"
TCPREPLAY_MAX_FRAME = 65535  # tcpreplay 4.4 cuts longer frames to this length
LINE_TARGET_PPS = 100_000
JSON_RECORDS_HEAVY_TARGET_PPS = 30_000
ETHERNET_FRAME = 1514  # the largest Ethernet frame (no FCS): 1,448 B of TCP payload (--mss 1448) and its headers


def kafkasniff_command(given: str | None = None) -> list[str]:
    if given:
        return shlex.split(given)
    found = shutil.which("kafkasniff") or str(Path(sys.executable).with_name("kafkasniff"))
    return [found] if Path(found).exists() else [sys.executable, "-m", "kafkasniff"]


KAFKASNIFF: str | None = None  # --kafkasniff
SNIFF_JOBS: int | None = None  # --jobs


def view_args(view: str) -> list[str]:
    """The sniff options of a view: `top` is the --top dashboard, `metrics` the one-line view with
    --metrics-port (on a free port) and its counters, `metrics-quiet` the counters alone (-q)."""
    if view == "json":
        return ["--json"]
    if view == "top":
        return ["--top"]
    if view in ("metrics", "metrics-quiet"):
        from broker import free_port

        return ["--metrics-port", str(free_port())] + (["-q"] if view == "metrics-quiet" else [])
    return []


def start_sniffer(ports: list[int], view: str, buffer_mib: int) -> subprocess.Popen:
    port_args = [arg for port in ports for arg in ("--port", str(port))]
    jobs_args = ["-j", str(SNIFF_JOBS)] if SNIFF_JOBS is not None else []
    sniffer = subprocess.Popen(
        [*kafkasniff_command(KAFKASNIFF), "sniff", "-i", "lo", *port_args, *view_args(view),
         "-B", str(buffer_mib), *jobs_args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ready = sniffer.stderr.readline()
    if not ready.startswith("capturing on"):
        sniffer.kill()
        sys.exit(f"sniffer did not start: {ready}{sniffer.stderr.read()}")
    return sniffer


def stop_sniffer(sniffer: subprocess.Popen,
                 timeout: float = 120.0) -> tuple[tuple[int, int, int, int] | None, float, float]:
    """SIGINT; its summary numbers (None when it had to be killed after `timeout` seconds), CPU seconds and
    the seconds it took to exit."""
    stopping = time.monotonic()
    sniffer.send_signal(signal.SIGINT)
    killed = False
    while True:
        pid, status, usage = os.wait4(sniffer.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - stopping > timeout and not killed:
            sniffer.kill()
            killed = True
        time.sleep(0.005)
    stop_seconds = time.monotonic() - stopping
    sniffer.returncode = os.waitstatus_to_exitcode(status)
    stderr = sniffer.stderr.read()
    cpu = usage.ru_utime + usage.ru_stime
    if killed:
        return None, cpu, stop_seconds
    match = SUMMARY.search(stderr)
    if sniffer.returncode != 0 or match is None:
        sys.exit(f"sniffer failed ({sniffer.returncode}): {stderr[-2000:]}")
    return tuple(int(n) for n in match.groups()), cpu, stop_seconds


# --- replay mode ----------------------------------------------------------------------------

@dataclass
class Capture:
    path: Path
    replay_copy: Path  # `copies` copies of the capture, one after the other
    ports: list[int]
    packets: int  # in one copy
    bytes: int
    records: int | None  # records produced + fetched, for records-heavy captures
    copies: int = 1

    @property
    def records_per_packet(self) -> float | None:
        return self.records / self.packets if self.records else None

    def ensure_packets(self, wanted: int) -> None:
        """Append copies to the replay file until it holds `wanted` packets.

        Copy k (k >= 1) has the second octet of every IPv4 address XORed with k (the header checksum
        fixed): the same change on both ends keeps each connection's two directions mirror images
        of each other, and every copy's connections are new ones. (tcpreplay's --loop --unique-ip
        cannot be used: on a capture whose two ends share one address, 127.0.0.1, it moves them
        to different addresses in both directions, so each direction looks like a connection of
        its own.)"""
        while self.copies * self.packets < wanted:
            if self.copies > 255:
                sys.exit("more than 256 copies of the capture needed: lower the rate or --seconds")
            append_copy(self.replay_copy, self.packets, self.copies)
            self.copies += 1


@dataclass
class Trial:
    asked_pps: int
    sent: int
    sent_bytes: int
    seconds: float
    received: int
    captured: int
    messages: int
    drops: int
    cpu: float  # the sniffer's CPU seconds, start-up and stop included
    stop_seconds: float  # from SIGINT to its exit: reading what the kernel held, the end of decoding, exit
    max_lag: float
    hung: bool = False  # did not exit within 120 s of SIGINT; killed, no counts

    @property
    def pps(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0

    @property
    def unread(self) -> int:
        """Packets the kernel counted that the sniffer never read: it gave up draining them."""
        return self.received - self.drops - self.captured

    @property
    def passed(self) -> bool:
        return not self.hung and self.drops == 0 and self.unread == 0 and self.stop_seconds <= self.max_lag

    @property
    def short_of_rate(self) -> bool:
        """tcpreplay sent clearly slower than asked."""
        return self.pps < 0.95 * self.asked_pps


def replay_copy(capture: Path, copy: Path, mss: int | None) -> int:
    """Write the copy tcpreplay sends; return its packet count.

    Every Ethernet frame gets the destination MAC OTHER_HOST_MAC. TCP segments whose frame is longer
    than tcpreplay sends whole (65,535 bytes; loopback captures hold frames of up to 65,549), or whose
    payload is longer than `mss`, are cut into consecutive segments (sequence numbers, lengths and
    checksums adjusted; PSH and FIN on the last piece), so the byte streams stay complete.
    """
    import dpkt

    destination = bytes.fromhex(OTHER_HOST_MAC.replace(":", ""))
    written = 0
    with open(capture, "rb") as src, open(copy, "wb") as dst:
        reader = dpkt.pcap.UniversalReader(src)
        if reader.datalink() != dpkt.pcap.DLT_EN10MB:
            sys.exit(f"{capture}: only Ethernet captures can be replayed onto loopback (link type {reader.datalink()})")
        writer = dpkt.pcap.Writer(dst, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
        for ts, frame in reader:
            frame = destination + bytes(frame[6:])
            pieces = [frame]
            if len(frame) > TCPREPLAY_MAX_FRAME or mss:
                pieces = split_segment(frame, mss)
            for piece in pieces:
                writer.writepkt(piece, ts)
            written += len(pieces)
    return written


def append_copy(replay: Path, packets: int, k: int) -> None:
    """Append to `replay` its first `packets` packets with IPv4 addresses moved (see ensure_packets)."""
    with open(replay, "rb") as src:
        header = src.read(24)
        order = "<" if header[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        records = []
        for _ in range(packets):
            record = src.read(16)
            seconds, fraction, included, original = struct.unpack(order + "IIII", record)
            frame = bytearray(src.read(included))
            if included >= 34 and frame[12:14] == b"\x08\x00" and frame[14] >> 4 == 4:
                frame[27] ^= k & 0xFF  # second octet of the source address
                frame[31] ^= k & 0xFF  # and of the destination
                ihl = (frame[14] & 0x0F) * 4
                frame[24:26] = b"\x00\x00"
                frame[24:26] = ip_checksum(frame[14:14 + ihl]).to_bytes(2, "big")
            records.append(struct.pack(order + "IIII", seconds + 3600 * k, fraction, included, original) + frame)
    with open(replay, "ab") as dst:
        dst.write(b"".join(records))


def ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f">{len(header) // 2}H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def split_segment(frame: bytes, mss: int | None) -> list[bytes]:
    import dpkt

    eth = dpkt.ethernet.Ethernet(frame)
    ip = eth.data
    if not isinstance(ip, dpkt.ip.IP) or not isinstance(ip.data, dpkt.tcp.TCP):
        return [frame]
    tcp = ip.data
    payload = bytes(tcp.data)
    headers = len(frame) - len(payload)
    limit = min(mss or len(payload), TCPREPLAY_MAX_FRAME - headers)
    if len(payload) <= limit:
        return [frame]
    pieces = []
    flags, seq = tcp.flags, tcp.seq
    for start in range(0, len(payload), limit):
        last = start + limit >= len(payload)
        tcp.seq = (seq + start) & 0xFFFFFFFF
        tcp.flags = flags if last else flags & ~(dpkt.tcp.TH_PUSH | dpkt.tcp.TH_FIN)
        tcp.data = payload[start:start + limit]
        tcp.sum = 0
        ip.len = 0  # recomputed
        ip.sum = 0
        ip.data = tcp
        pieces.append(bytes(eth))
    return pieces


def prepare(capture: Path, ports: list[int], into: Path, mss: int | None) -> Capture:
    summary_path = Path(f"{capture}.json")
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    ports = ports or summary.get("broker_ports") or [9092]
    copy = into / capture.name
    packets = replay_copy(capture, copy, mss)
    return Capture(capture, copy, ports, packets, capture.stat().st_size, summary.get("records_total"))


def trial(capture: Capture, view: str, pps: int, seconds: float, buffer_mib: int, max_lag: float) -> Trial:
    total = max(1, round(pps * seconds))
    capture.ensure_packets(total)
    command = ["tcpreplay", "-i", "lo", "--pps", str(pps), "--limit", str(total)]
    if pps >= 20_000:
        command += ["--pps-multi", str(pps // 10_000)]  # bursts of a few packets, 10,000 times a second
    command.append(str(capture.replay_copy))
    sniffer = start_sniffer(capture.ports, view, buffer_mib)
    out = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    counts, cpu, stop_seconds = stop_sniffer(sniffer)
    hung = counts is None
    captured, messages, received, drops = counts or (0, 0, 0, 0)
    sent = REPLAY_SENT.search(out)
    if sent is None:
        sys.exit(f"tcpreplay printed no summary: {out[-2000:]}")
    return Trial(pps, int(sent.group(1)), int(sent.group(2)), float(sent.group(3)), received, captured, messages,
                 drops, cpu, stop_seconds, max_lag, hung)


def show_trial(t: Trial) -> None:
    verdict = "pass" if t.passed else ("HUNG (killed 120 s after SIGINT)" if t.hung else
                                       "fail (drops)" if t.drops else
                                       f"fail (lagging: {t.unread:,} never read)" if t.unread else
                                       "fail (lagging: slow to stop)")
    print(f"  {t.asked_pps:>9,} {t.pps:>11,.0f} {t.sent_bytes / t.seconds / 1e6:>8.1f} {t.sent:>9,} "
          f"{t.received:>9,} {t.drops:>8,} {t.cpu:>6.1f} {t.stop_seconds:>6.2f}  {verdict}", flush=True)


def rounded(rate: float) -> int:
    digits = max(0, int(math.log10(max(rate, 1))) - 1)
    return max(1, int(round(rate, -digits)))


def search(capture: Capture, view: str, args) -> tuple[list[Trial], Trial | None, Trial | None, bool]:
    """(trials, highest pass, lowest failure, capped: tcpreplay could not go faster)."""
    trials: list[Trial] = []
    best: Trial | None = None
    worst: Trial | None = None
    rate = args.start
    for _ in range(args.max_trials):
        t = trial(capture, view, rate, args.seconds, args.buffer_mib, args.max_lag)
        trials.append(t)
        show_trial(t)
        if t.passed:
            if best is None or t.asked_pps > best.asked_pps:
                best = t
            if t.short_of_rate:
                return trials, best, worst, True
        elif worst is None or t.asked_pps < worst.asked_pps:
            worst = t
        if best is None:
            rate = rounded(rate / 4)
        elif worst is None:
            rate = rounded(rate * 2)
            if rate > args.max_rate:
                break
        else:
            if worst.asked_pps <= best.asked_pps * (1 + args.tolerance):
                break
            rate = rounded(math.sqrt(best.asked_pps * worst.asked_pps))
            if rate in (best.asked_pps, worst.asked_pps):
                break
    return trials, best, worst, False


def records_in_first(replay: Path, packets: int, tmp: Path) -> int:
    """Records (produced + fetched) in complete messages of the first `packets` packets of `replay`,
    as `kafkasniff decode --stats --json` counts them: what a trial that sent them had to decode."""
    head = tmp / "head.pcap"
    with open(replay, "rb") as src, open(head, "wb") as dst:
        header = src.read(24)
        order = "<" if header[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        dst.write(header)
        for _ in range(packets):
            record = src.read(16)
            if len(record) < 16:
                break
            dst.write(record + src.read(struct.unpack(order + "IIII", record)[2]))
    with subprocess.Popen([*kafkasniff_command(KAFKASNIFF), "decode", "--stats", "--json", str(head)],
                          stdout=subprocess.PIPE) as decode:
        last = b""
        for line in decode.stdout:  # every message's JSON, then the stats
            last = line
    head.unlink()
    stats = json.loads(last)
    return sum(t["records_produced"] + t["records_fetched"] for t in stats["topics"])


def replay_main(args) -> None:
    if shutil.which("tcpreplay") is None:
        sys.exit("tcpreplay is not installed (apt-get install tcpreplay)")
    results = []
    with tempfile.TemporaryDirectory(prefix="sniff-replay-") as tmp:
        for path in args.captures:
            capture = prepare(path, args.port, Path(tmp), args.mss)
            per_packet = capture.records_per_packet
            print(f"\n{path}: {capture.bytes / 1e6:.1f} MB, {capture.packets:,} packets as replayed "
                  f"({capture.bytes / capture.packets:,.0f} B each on average"
                  + (f", TCP payloads cut to {args.mss} B" if args.mss else "") + ")"
                  + (f", {capture.records:,} records ({per_packet:.1f} per packet)" if per_packet else "")
                  + f", ports {capture.ports}; trials of {args.seconds:g} s, sniffer -B {args.buffer_mib}, "
                    f"pass = no drop, every packet read, and out within {args.max_lag:g} s of SIGINT")
            for view in args.view:
                print(f" view {view}: {'asked pps':>9} {'sent pps':>11} {'MB/s':>8} {'sent':>9} {'received':>9} "
                      f"{'dropped':>8} {'cpu s':>6} {'stop s':>6}")
                _trials, best, worst, capped = search(capture, view, args)
                records = None
                if best is not None and view == "json" and capture.records:
                    records = records_in_first(capture.replay_copy, best.sent, Path(tmp))
                results.append((capture, view, best, worst, capped, records))
    print("\nhighest drop-free rate (the sniffer kept up):")
    for capture, view, best, worst, capped, records in results:
        if best is None:
            text = f"below {worst.asked_pps:,} packets/s" if worst else "no trial passed"
        else:
            text = (f"{'at least ' if capped else ''}{best.pps:,.0f} packets/s, "
                    f"{best.sent_bytes / best.seconds / 1e6:.1f} MB/s")
            if records is not None:  # the one-line view does not decode records
                text += f", {records / best.seconds:,.0f} records/s ({records:,} records in {best.seconds:.1f} s)"
            if worst is not None and not capped:
                text += f" (fails at {worst.asked_pps:,})"
        print(f"  {capture.path.name:<24} {view:<5} {text}")
        rate = best.pps if best else 0.0
        if view == "line":
            target = LINE_TARGET_PPS
        elif capture.records:
            target = JSON_RECORDS_HEAVY_TARGET_PPS
        else:
            continue
        if capture.bytes / capture.packets > ETHERNET_FRAME:
            # loopback's TCP segments of up to 64 KB: a packet is many Ethernet packets' traffic, so the target
            # is held in bytes
            target_mbps = target * ETHERNET_FRAME / 1e6
            met = (best.sent_bytes / best.seconds / 1e6 if best else 0.0) >= target_mbps
            print(f"  {'':<24} {'':<5} target >= {target:,} Ethernet-sized packets/s ({target_mbps:.1f} MB/s of "
                  f"{ETHERNET_FRAME:,} B packets): {'met' if met else 'MISSED'}")
            continue
        print(f"  {'':<24} {'':<5} target >= {target:,} packets/s: {'met' if rate >= target else 'MISSED'}")


# --- producer mode --------------------------------------------------------------------------

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


def producer_main(args) -> None:
    from broker import TansuBroker

    with TansuBroker() as broker:
        broker.create_topic("bench", partitions=3)
        sniffer = start_sniffer([broker.port], args.view[0], args.buffer_mib)
        records, produce_seconds = produce_flat_out(broker.bootstrap, "bench", args.seconds, args.value_size)
        time.sleep(args.settle)
        counts, cpu, _ = stop_sniffer(sniffer)
    if counts is None:
        sys.exit("the sniffer did not stop within 120 s of SIGINT")
    captured, messages, received, drops = counts
    print(f"producer: {records:,} records of {args.value_size} B in {produce_seconds:.1f} s "
          f"= {records / produce_seconds:,.0f} records/s")
    print(f"sniffer:  {messages:,} Kafka messages, {captured:,} packets decoded "
          f"= {messages / produce_seconds:,.0f} messages/s, {captured / produce_seconds:,.0f} packets/s")
    print(f"kernel:   {received:,} packets received by filter, {drops:,} dropped, "
          f"{received - drops - captured:,} left unread at stop")
    print(f"cpu:      sniffer used {cpu:.1f} s = {captured / cpu:,.0f} packets per CPU second")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("captures", type=Path, nargs="*", help="replay mode: captures to replay")
    parser.add_argument("--view", nargs="+", choices=("json", "line", "top", "metrics", "metrics-quiet"), default=None,
                        help="json decodes every record; line decodes headers only; top is the --top "
                             "dashboard; metrics the one-line view serving --metrics-port "
                             "(replay default: both; producer default: json)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="replay: seconds per trial; producer: how long the producer runs")
    parser.add_argument("--buffer-mib", type=int, default=32, help="the sniffer's -B")
    parser.add_argument("--port", type=int, action="append", default=[],
                        help="replay: broker port (repeatable; default: from CAPTURE.json)")
    parser.add_argument("--start", type=int, default=5000, help="replay: first rate tried, packets/s")
    parser.add_argument("--tolerance", type=float, default=0.15,
                        help="replay: stop when the lowest failing rate is within this of the highest passing")
    parser.add_argument("--max-lag", type=float, default=1.0,
                        help="replay: seconds the sniffer may take to exit after tcpreplay's end and SIGINT "
                             "(reading what the kernel holds included)")
    parser.add_argument("--mss", type=int, help="replay: cut TCP payloads to at most this many bytes "
                        "(e.g. 1448 for Ethernet-sized packets; default: only frames tcpreplay cannot send whole)")
    parser.add_argument("--max-trials", type=int, default=12, help="replay: trials per capture and view")
    parser.add_argument("--max-rate", type=int, default=2_000_000, help="replay: highest rate tried")
    parser.add_argument("--kafkasniff", help="the kafkasniff command, e.g. 'python -P -m kafkasniff' "
                                              "(default: the kafkasniff beside this Python)")
    parser.add_argument("--jobs", type=int, help="the sniffer's -j (default: its own default)")
    parser.add_argument("--value-size", type=int, default=100, help="producer: bytes per record value")
    parser.add_argument("--settle", type=float, default=2.0, help="producer: seconds the sniffer gets to catch up")
    args = parser.parse_args()
    global KAFKASNIFF, SNIFF_JOBS
    KAFKASNIFF = args.kafkasniff
    SNIFF_JOBS = args.jobs
    if os.geteuid() != 0:
        sys.exit("run as root: packet capture and tcpreplay need it")
    if args.captures:
        args.view = args.view or ["line", "json"]
        replay_main(args)
    else:
        args.view = args.view or ["json"]
        producer_main(args)


if __name__ == "__main__":
    main()
