"""State that ages out: requests never answered, and made-up API keys and versions, keep bounded memory, and
what was given up is said (issue 18).

Every capture is made here; each view runs as a process of its own (tests/measured.py), whose time and peak
resident memory are bounded (one process: the captures are below the size at which decode starts workers).
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys

import pytest

from measured import decode_measured
from pcapkit import Packet, TcpConversation, merged, write_pcap
from kafkasniff.stream.session import MAX_PENDING

REQUESTS = 300_000


def header_only_requests(correlation_ids, api_key: int = 18, version: int = 0) -> bytes:
    """Requests of the given API and version (ApiVersions v0 by default) with a null client id and no body."""
    return b"".join(struct.pack(">ihhih", 10, api_key, version, c, -1) for c in correlation_ids)


def named(correlation_ids, more: int = 0) -> str:
    """ApiVersions v0 requests as an `unanswered` notice names them, and how many more it counts."""
    return ", ".join(f"ApiVersions v0 corr={c}" for c in correlation_ids) + (f" and {more:,} more" if more else "")


def given_up_text(count: int, requests: str) -> str:
    return (f"{count:,} request{'s' if count != 1 else ''} given up waiting for a response (more than "
            f"{MAX_PENDING:,} requests or 64 MiB waiting, or 900 s of capture time without one): {requests}; a "
            f"response that comes later is shown as one whose request was not captured")


def capture_of(path, *sends: tuple[bool, bytes, float]):
    """A captured connection: (from_client, bytes, seconds to wait before) for each send (no bytes: a bare ACK)."""
    conversation = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092), mss=60_000)
    for from_client, data, wait in sends:
        conversation.ts += wait
        conversation.send(from_client, data) if data else conversation.ack(from_client)
    return write_pcap(path, conversation.close())


def table_row(done, first: str) -> list[str]:
    """The cells after the first of the --stats table row that starts with `first`."""
    (row,) = [line for line in done.head.decode().splitlines() if line.split("│")[0].strip() == first]
    return [cell.strip() for cell in row.split("│")[1:]]


def decoded_json(capture) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "kafkasniff", "decode", "--json", str(capture)], capture_output=True,
                          check=True, timeout=60)
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("view", [["--stats"], ["--json"], []])
def test_requests_never_answered_are_given_up_and_counted(tmp_path, view):
    """Once 373 MB: 300,000 requests that no response answers were all kept until the end."""
    capture = capture_of(tmp_path / "never_answered.pcap",
                         *((True, header_only_requests(range(start, start + 4000)), 0)
                           for start in range(0, REQUESTS, 4000)))
    done = decode_measured(capture, view)
    assert done.returncode == 0, done.stderr
    assert done.peak_mb < 80 and done.seconds < 60, f"{done.peak_mb:.0f} MB, {done.seconds:.1f} s"
    if view == ["--stats"]:
        assert table_row(done, "ApiVersions") == ["300,000", "0", "3,000,000", "0", "", "", "", "", ""]
        assert "\n1 unanswered notices\n" in done.head.decode()


def test_the_oldest_requests_past_the_limit_are_given_up_and_said(tmp_path):
    waiting = MAX_PENDING + 76
    capture = capture_of(tmp_path / "over.pcap", (True, header_only_requests(range(waiting)), 0),
                         (False, struct.pack(">iihi", 10, waiting - 1, 0, 0), 0))
    *requests, response, notice = decoded_json(capture)
    assert len(requests) == waiting
    assert (response["correlation_id"], response["latency_ms"] is not None) == (waiting - 1, True)
    # The oldest 76 given up, the rest but the one answered without a response at the end: the first 5 of each named.
    assert (notice["notice"], notice["text"]) == ("unanswered", given_up_text(76, named(range(5), 71)) + (
        f"; {MAX_PENDING - 1:,} requests without a response when the connection ended: "
        f"{named(range(76, 81), MAX_PENDING - 6)}"))


def test_a_request_unanswered_longer_than_any_timeout_is_given_up(tmp_path):
    """A request, another 1000 s later (an ACK between keeps the connection from being given up as idle), then both
    responses: the first request was given up, its response is shown as one whose request was not captured
    (inferred), the second is paired."""
    capture = capture_of(tmp_path / "late.pcap", (True, header_only_requests([1]), 0), (False, b"", 500),
                         (True, header_only_requests([2]), 500),
                         (False, struct.pack(">iihi", 10, 1, 0, 0) + struct.pack(">iihi", 10, 2, 0, 0), 0))
    first, second, late, answered, notice = decoded_json(capture)
    assert (late["correlation_id"], late["api_name"], late["latency_ms"], late["inferred"]) == (
        1, "ApiVersions", None, True)
    assert (answered["correlation_id"], answered["latency_ms"] is not None) == (2, True)
    assert notice["text"] == given_up_text(1, named([1]))


def test_a_request_on_a_connection_given_up_as_idle_is_named(tmp_path):
    """A connection without a packet for more than 900 s of capture time (another connection's packets tell the
    time) is given up, and its request without a response said then: not the connection's end, nor the capture's.
    It was given up as of the first multiple of 90 s (the idle sweeps' interval) after its 900 s, before the packet
    that brought capture time past it."""
    quiet = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092))
    quiet.send(True, header_only_requests([5]))
    busy = TcpConversation(("10.0.0.3", 40001), ("10.0.0.2", 9092))
    busy.send(True, header_only_requests([1])).send(False, struct.pack(">iihi", 10, 1, 0, 0))
    busy.ts += 1000
    woken = len(busy.packets)
    busy.send(True, header_only_requests([2])).send(False, struct.pack(">iihi", 10, 2, 0, 0))
    capture = write_pcap(tmp_path / "idle.pcap", merged(quiet.packets, busy.close()))
    (notice,) = [e for e in decoded_json(capture) if e["kind"] == "notice"]
    given_up = (math.floor((quiet.packets[-1].ts + 900) / 90) + 1) * 90
    assert quiet.packets[-1].ts + 900 < given_up < busy.packets[woken].ts
    assert notice == {"kind": "notice", "ts": given_up, "notice": "unanswered", "stream": 0,
                      "text": "1 request without a response when the connection was given up as idle: "
                              "ApiVersions v0 corr=5", "src": "10.0.0.1:40000", "dst": "10.0.0.2:9092"}


def test_made_up_api_keys_and_versions_keep_bounded_memory(tmp_path):
    """Once 575 MB: 300,000 distinct (API key, version) pairs Kafka does not define, each answered. Here two
    batches of MAX_PENDING + 1,976 pairs (so that 1,976 of each are given up waiting, and their responses
    inferred): the made-up APIs share one row."""
    batch_size = MAX_PENDING + 1976
    pairs = [(1000 + i // 10, i % 10) for i in range(2 * batch_size)]
    n = len(pairs)
    # a request Kafka defines first: the connection is told to be Kafka by it
    sends = [(True, header_only_requests([n]), 0), (False, struct.pack(">iihi", 10, n, 0, 0), 0)]
    for start in range(0, n, batch_size):
        batch = range(start, start + batch_size)
        sends.append((True, b"".join(header_only_requests([i], *pairs[i]) for i in batch), 0))
        sends.append((False, b"".join(struct.pack(">ii", 4, i) for i in batch), 0))
    done = decode_measured(capture_of(tmp_path / "pairs.pcap", *sends), ["--stats"])
    assert done.returncode == 0, done.stderr
    assert done.peak_mb < 80 and done.seconds < 30, f"{done.peak_mb:.0f} MB, {done.seconds:.1f} s"
    # requests and responses of made-up APIs are malformed: "unknown API key"
    row = table_row(done, "?")
    assert row[:4] + row[8:] == [f"{n:,}", f"{n:,}", f"{10 * n:,}", f"{4 * n:,}", f"malformed×{2 * n}"]
    # each batch's requests and responses span a few segments of 60,000 bytes, 0.1 ms apart
    assert all(0.1 <= float(ms) <= 0.8 for ms in row[4:8]), row
    assert "\n1 unanswered notices\n" in done.head.decode()


@pytest.mark.parametrize("flood", ["syn", "syn answered by rst", "syn and bytes"])
def test_a_syn_flood_keeps_bounded_memory_and_a_real_connection_through_it(tmp_path, flood):
    """150,000 SYNs, each from a port of its own: unanswered, each opened a connection held until the idle timeout
    (200,000: 415 MB, 543 MB with the workers); answered by a RST, each 4-tuple was remembered for a minute (347 MB
    for 300,000); followed by the start of a request, each connection held its session (100,000: 386 MB). Beyond
    tcp.MAX_EMPTY_CONNECTIONS that carried no byte the oldest are ended, beyond MAX_CLOSED_REMEMBERED the oldest
    forgotten, beyond MAX_OPEN_CONNECTIONS the idlest ended. A request sent before the flood is still answered on its
    connection after it."""
    from kafkasniff.protocol.encoder import encode_request, encode_response

    conversation = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9092))
    conversation.send(True, encode_request(18, 0, 7, "survivor", {}))
    request_sent = conversation.ts
    syn = TcpConversation(("10.9.0.1", 1), ("10.0.0.2", 9092)).packets[0].frame
    rst = TcpConversation(("10.0.0.2", 9092), ("10.9.0.1", 1)).packets[0].frame
    rst = rst[:47] + bytes([rst[47] & 0xC0 | 0x14]) + rst[48:]  # its flags: RST and ACK
    start = TcpConversation(("10.9.0.1", 1), ("10.0.0.2", 9092)).send(True, bytes([0, 0, 0, 16, 0, 18])).packets[-1]
    flood_packets = []
    for n in range(150_000):
        ip, port = bytes([n // 250 % 250, n % 250 + 1]), struct.pack(">H", 1024 + n % 60000)
        ts = request_sent + 0.001 + n * 0.0001
        flood_packets.append(Packet(ts, syn[:28] + ip + syn[30:34] + port + syn[36:]))
        if flood == "syn answered by rst":
            flood_packets.append(Packet(ts + 0.00005, rst[:32] + ip + rst[34:36] + port + rst[38:]))
        elif flood == "syn and bytes":
            flood_packets.append(Packet(ts + 0.00005, start.frame[:28] + ip + start.frame[30:34] + port
                                        + start.frame[36:]))
    conversation.ts = flood_packets[-1].ts + 1
    conversation.send(False, encode_response(18, 0, 7, {"ErrorCode": 0, "ApiKeys": []}))
    capture = write_pcap(tmp_path / "syn_flood.pcap", merged(conversation.close(), flood_packets))
    done = decode_measured(capture, ["--json", "--api", "ApiVersions"])  # (a connection crowded out inside a frame
    assert done.returncode == 0, done.stderr                             # gets a notice: 150,000 of them)
    assert done.peak_mb < 300 and done.tree_mb < 400 and done.seconds < 60, \
        f"{done.peak_mb:.0f} MB, {done.tree_mb:.0f} MB in all, {done.seconds:.1f} s"
    if flood != "syn and bytes":
        assert done.peak_mb < 100, f"{done.peak_mb:.0f} MB"
    events = [json.loads(line) for line in done.head.splitlines()]
    assert [(e["kind"], e["correlation_id"], e.get("inferred")) for e in events] == [
        ("request", 7, None), ("response", 7, False)]
