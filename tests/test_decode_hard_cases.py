"""`kafkasniff decode --json` on hard captures: the project's real captures cut, reordered,
duplicated, re-encapsulated and merged with tests/pcapkit.py, and connections of our own
built with the encoder. Each case is compared exactly with the decode of the untouched
capture: what must stay the same, stays the same, and what is lost is reported to the byte.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import json
import ssl
import struct
from functools import lru_cache
from pathlib import Path

import dpkt
import pytest
from click.testing import CliRunner

import pcapkit
from capture_manifest import CAPTURES_DIR, load_capture
from kafkasniff.cli import main
from kafkasniff.protocol.encoder import encode_request, encode_response
from kafkasniff.protocol.identify import response_fits
from kafkasniff.protocol.messages import decode_request, decode_response, with_fields
from kafkasniff.protocol.records_encoder import Record, encode_record_batch
from kafkasniff.protocol.schema import api_name as api_name_of
from loopback import connection_frames
from pcapkit import Packet, TcpConversation, payload_len, read_packets, tcp_of, write_pcap

BROKER = 9092
MID_STREAM = "capture started mid-connection; resynchronised"
MISSING = "bytes missing from the capture"


# ---------------------------------------------------------------- running the real command


def run(path: Path, *options: str) -> str:
    """The command's output, the same in one process as with connections shared among 3 workers."""
    outputs = []
    for jobs in ("1", "3"):
        result = CliRunner().invoke(main, ["decode", "-j", jobs, *options, str(path)], catch_exceptions=False)
        assert (result.exit_code, result.stderr) == (0, "")
        outputs.append(result.stdout)
    assert outputs[1] == outputs[0]
    return outputs[0]


def decode(path: Path, *options: str) -> list[dict]:
    return [json.loads(line) for line in run(path, "--json", *options).splitlines()]


@lru_cache(maxsize=None)
def _original_json(name: str) -> str:
    return json.dumps(decode(CAPTURES_DIR / f"{name}.pcap"))


def original(name: str) -> list[dict]:
    """The decode of the untouched capture (a fresh copy each call)."""
    return json.loads(_original_json(name))


@lru_cache(maxsize=None)
def _packets(name: str) -> tuple[Packet, ...]:
    return tuple(read_packets(CAPTURES_DIR / f"{name}.pcap"))


def packets(name: str) -> list[Packet]:
    return list(_packets(name))


# ---------------------------------------------------------------- looking at events and packets


def of_stream(events: list[dict], stream: int) -> list[dict]:
    return [e for e in events if e.get("stream") == stream]


def other_streams(events: list[dict], stream: int) -> list[dict]:
    return [e for e in events if e.get("stream") != stream]


def message(events: list[dict], kind: str, api_name: str, correlation_id: int, stream: int) -> dict:
    (found,) = [e for e in events if e["kind"] == kind and e.get("api_name") == api_name
                and e.get("correlation_id") == correlation_id and e["stream"] == stream]
    return found


def notice(stream: int, client: str, server: str, direction: str, ts: float, text: str, offset: int,
           size: int) -> dict:
    """A notice of bytes not shown as messages: skipped, or missing from the capture."""
    return {"kind": "notice", "ts": ts, "notice": "missing" if text == MISSING else "skipped", "text": text,
            "stream": stream, "src": client, "dst": server, "direction": direction, "stream_offset": offset,
            "size": size}


def unanswered(ts: float, stream: int, client: str, server: str, text: str) -> dict:
    """The notice of the requests a connection leaves without a response."""
    return {"kind": "notice", "ts": round(ts, 6), "notice": "unanswered", "text": text, "stream": stream,
            "src": client, "dst": server}


def text_json(data: bytes | None) -> dict | None:
    """How --json shows bytes that are UTF-8 text."""
    return None if data is None else {"base64": base64.b64encode(data).decode(), "text": data.decode()}


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def by_connection(events: list[dict]) -> dict[frozenset, list[dict]]:
    """Events per connection (its two endpoints), without stream numbers; checks that each
    connection kept one stream number and no two share one."""
    grouped: dict[frozenset, list[dict]] = {}
    numbers: dict[frozenset, set] = {}
    for e in events:
        key = frozenset((e["src"], e["dst"]))
        numbers.setdefault(key, set()).add(e["stream"])
        grouped.setdefault(key, []).append({k: v for k, v in e.items() if k != "stream"})
    assert all(len(n) == 1 for n in numbers.values())
    assert len({n for ns in numbers.values() for n in ns}) == len(numbers)
    return grouped


def indexes(pks: list[Packet], client_port: int) -> list[int]:
    """Positions of one connection's packets, given its client port."""
    return [i for i, p in enumerate(pks) if pcapkit.client_port(p, BROKER) == client_port]


def request_packet(pks: list[Packet], client_port: int, correlation_id: int) -> int:
    """Position of the client segment that starts the request with this correlation id."""
    return _segment_starting(pks, client_port, True, correlation_id)


def response_packet(pks: list[Packet], client_port: int, correlation_id: int) -> int:
    """Position of the server segment that starts the response with this correlation id."""
    return _segment_starting(pks, client_port, False, correlation_id)


def _segment_starting(pks, client_port, from_client, correlation_id) -> int:
    at = 8 if from_client else 4  # after the size, and the api key and version of a request
    for i in indexes(pks, client_port):
        data = tcp_of(pks[i].frame).data
        if pcapkit.from_client(pks[i], BROKER) == from_client and len(data) >= at + 4 and \
                struct.unpack_from(">i", data, at)[0] == correlation_id:
            return i
    raise LookupError(correlation_id)


def closed_at(pks: list[Packet], client_port: int) -> float:
    """Capture time of the segment that closes a connection: the second side's FIN."""
    closed = set()
    for i in indexes(pks, client_port):
        if tcp_of(pks[i].frame).flags & dpkt.tcp.TH_FIN:
            closed.add(pcapkit.from_client(pks[i], BROKER))
            if len(closed) == 2:
                return pks[i].ts
    raise LookupError(client_port)


def carrying(pks: list[Packet], start: int, size: int) -> list[int]:
    """Positions of the segments that carry `size` bytes of a direction's stream from packets[start] on."""
    sender = pcapkit.endpoints(pks[start])
    out, total = [], 0
    for i in range(start, len(pks)):
        if pcapkit.endpoints(pks[i]) == sender and payload_len(pks[i]):
            out.append(i)
            total += payload_len(pks[i])
            if total >= size:
                return out
    raise LookupError(size)


def request_of(events: list[dict], api_name: str, size: int) -> dict:
    (found,) = [e for e in events if e["kind"] == "request" and e["api_name"] == api_name and e["size"] == size]
    return found


# ---------------------------------------------------------------- cut, lost, duplicated, reordered


def test_mid_connection_start_resynchronises_and_reports_the_skipped_bytes(tmp_path):
    """The capture begins 100 bytes into confluent's first Produce: the rest of it is skipped
    and counted; its response, captured whole, is inferred; the pipelined Produces after it
    decode and pair."""
    events = original("confluent_codecs")
    big = request_of(events, "Produce", 1048748)
    stream, client = big["stream"], big["src"]
    pks = packets("confluent_codecs")
    conn = indexes(pks, port_of(client))
    first_produce = request_packet(pks, port_of(client), 2)
    ts, frame = pks[first_produce]
    tcp = tcp_of(frame)
    cut_start = Packet(ts, pcapkit.rewrite(frame, seq=tcp.seq + 100, data=tcp.data[100:]))
    dropped = [i for i in conn if i < first_produce]
    assert len(dropped) == 7  # handshake, ApiVersions exchange, acks
    kept = [cut_start if i == first_produce else p for i, p in enumerate(pks) if i not in dropped]
    got = decode(write_pcap(tmp_path / "mid.pcap", kept))

    assert other_streams(got, stream) == other_streams(events, stream)
    before = of_stream(events, stream)
    produce2 = message(before, "request", "Produce", 2, stream)
    response2 = message(before, "response", "Produce", 2, stream)
    rest = before[before.index(produce2) + 1:]
    rest.remove(response2)
    assert [e["api_name"] for e in before[:before.index(produce2)]] == ["ApiVersions", "ApiVersions"]
    skipped_request = produce2["size"] + 4 - 100
    # The notice comes when the next frame is found, with that frame's time.
    expected = [notice(stream, client, big["dst"], "c2s", rest[0]["ts"], MID_STREAM, 0, skipped_request)]
    expected += rest[:2]  # Produce 3 and 4, sent before any response
    # Produce v10 is what the client sends: of the versions whose responses fit, it is the one shown.
    expected.append(dict(response2, inferred=True, latency_ms=None, client_id=None, alternatives=readings("Produce", 9, 11, 12)))
    expected += rest[2:]
    assert skipped_request == 184
    assert of_stream(got, stream) == expected
    assert all(e["latency_ms"] is not None for e in rest if e["kind"] == "response")


def test_mid_connection_start_inside_a_one_megabyte_produce(tmp_path):
    events = original("confluent_codecs")
    big = request_of(events, "Produce", 1048748)
    stream, client = big["stream"], big["src"]
    pks = packets("confluent_codecs")
    conn = indexes(pks, port_of(client))
    produce_start = request_packet(pks, port_of(client), big["correlation_id"])
    start = carrying(pks, produce_start, big["size"] + 4)[9]  # the capture starts at its 10th segment
    cut = write_pcap(tmp_path / "mid.pcap", [p for i, p in enumerate(pks) if i not in conn or i >= start])
    got = decode(cut)

    assert other_streams(got, stream) == other_streams(events, stream)
    skipped = tcp_of(pks[produce_start].frame).seq + big["size"] + 4 - tcp_of(pks[start].frame).seq
    assert skipped == 660144
    before = of_stream(events, stream)
    response5 = message(before, "response", "Produce", 5, stream)
    telemetry = [e for e in before if e["api_name"] == "GetTelemetrySubscriptions"]
    # The response to the cut Produce was captured whole: inferred. No Produce request is at hand to
    # tell the version, and Produce v9 and v10 responses share one layout: the lower one is shown.
    assert response5["api_version"] == 10
    assert of_stream(got, stream) == [
        notice(stream, client, big["dst"], "c2s", telemetry[0]["ts"], MID_STREAM, 0, skipped),
        telemetry[0],
        dict(response5, inferred=True, latency_ms=None, client_id=None, api_version=9,
             alternatives=readings("Produce", 10, 11, 12)),
        telemetry[1],
    ]
    # the line says which other versions fit (they share v9's layout), and so does -V's headline
    (line,) = [line for line in run(cut).splitlines() if " Produce v9 response corr=5 " in line]
    assert line.endswith(" (request not captured: inferred; also fits Produce v10-v12) confluent-none[1]")
    assert line in run(cut, "-V").splitlines()


def test_lost_segment_inside_a_one_megabyte_fetch_response(tmp_path):
    """One 64 KiB segment of a 1 MiB Fetch response missing: that response is lost and
    reported to the byte (before, inside and after the hole); every other message pairs."""
    events = original("confluent_codecs")
    fetch = next(e for e in events if e["kind"] == "response" and e["size"] == 1049966)
    stream, client = fetch["stream"], fetch["dst"]
    pks = packets("confluent_codecs")
    server_segments = [i for i in indexes(pks, port_of(client)) if not pcapkit.from_client(pks[i], BROKER)
                       and payload_len(pks[i])]
    response_start = response_packet(pks, port_of(client), fetch["correlation_id"])
    lost = [i for i in server_segments if i > response_start and payload_len(pks[i]) == pcapkit.LOOPBACK_MSS][3]
    base = tcp_of(pks[server_segments[0]].frame).seq
    lost_offset = tcp_of(pks[lost].frame).seq - base
    response_offset = tcp_of(pks[response_start].frame).seq - base
    got = decode(write_pcap(tmp_path / "lost.pcap", pks[:lost] + pks[lost + 1:]))

    assert other_streams(got, stream) == other_streams(events, stream)
    before = of_stream(events, stream)
    after_lost = before[before.index(fetch) + 1:]
    last = pks[indexes(pks, port_of(client))[-1]]
    assert tcp_of(last.frame).flags == dpkt.tcp.TH_RST
    # The hole waits for a retransmission until the capture ends: the client's reset carries no
    # acknowledgement, so it does not say the bytes will not come (they may be reordered after it).
    # Its notices bear the time the hole showed, that of the segment after it, not the capture's end.
    given_up = round(pks[-1].ts, 6)
    showed = round(pks[server_segments[server_segments.index(lost) + 1]].ts, 6)
    assert showed < given_up
    lost_notices = [
        notice(stream, client, fetch["src"], "s2c", showed, "partial frame lost in a gap",
               response_offset, lost_offset - response_offset),
        notice(stream, client, fetch["src"], "s2c", showed, MISSING, lost_offset, pcapkit.LOOPBACK_MSS),
        # (the response's size prefix came before the hole: its end is known, where the next frame starts)
        notice(stream, client, fetch["src"], "s2c", showed, "partial frame lost in a gap",
               lost_offset + pcapkit.LOOPBACK_MSS, response_offset + fetch["size"] + 4 - lost_offset - pcapkit.LOOPBACK_MSS),
    ]
    assert sum(n["size"] for n in lost_notices) == fetch["size"] + 4
    # The notice of the rest carries the time of its bytes (held behind the hole).
    got_stream = of_stream(got, stream)
    resync = got_stream[len(before[:before.index(fetch)]) + 3]
    assert showed <= resync["ts"] < given_up
    lost_notices[2]["ts"] = resync["ts"]
    # The next Fetch response waited behind the hole; it is delivered, and pairs, when it is given up. The lost
    # response's request is left without one, said when the connection ends (its reset, given up waiting for
    # the hole at the capture's end).
    lost_request = f"Fetch v16 corr={fetch['correlation_id']}"
    assert got_stream == before[:before.index(fetch)] + after_lost[:1] + lost_notices + after_lost[1:] + [
        unanswered(pks[-1].ts, stream, client, fetch["src"],
                   f"1 request without a response when the connection ended: {lost_request}")]
    assert after_lost[1]["latency_ms"] == pytest.approx(102.432)


def test_bytes_captured_after_the_reset_that_ends_their_connection_are_decoded(tmp_path):
    """Packets reordered in the capture: a Fetch response's last segment comes after the client's RST that
    ends the connection. The reset carries no acknowledgement, so bytes continuing the server's stream may
    still come, for up to max_wait (10 s) of capture time: they are decoded as if in order. A segment
    captured later than that is said, not decoded."""
    events = original("confluent_codecs")
    fetch = next(e for e in events if e["kind"] == "response" and e["size"] == 1049966)
    stream, client = fetch["stream"], fetch["dst"]
    pks = packets("confluent_codecs")
    connection = indexes(pks, port_of(client))
    reset = connection[-1]
    assert tcp_of(pks[reset].frame).flags & dpkt.tcp.TH_RST
    last_data = max(i for i in connection if not pcapkit.from_client(pks[i], BROKER) and payload_len(pks[i]))
    reordered = pks[:last_data] + pks[last_data + 1:reset + 1] + [pks[last_data]] + pks[reset + 1:]
    assert decode(write_pcap(tmp_path / "reordered.pcap", reordered)) == events

    last = tcp_of(pks[last_data].frame)
    end_offset = last.seq + len(last.data) - tcp_of(pks[connection[1]].frame).seq - 1  # after the SYN-ACK
    beyond = Packet(pks[reset].ts + 10.5, pcapkit.rewrite(pks[last_data].frame, seq=last.seq + len(last.data),
                                                         data=b"\x00" * 10))
    got = decode(write_pcap(tmp_path / "late.pcap", reordered + [beyond]))
    # The last event is another connection's, reset with a request unanswered, given up at the capture's end (it
    # waited for what its reset showed missing): now after the late segment, at that segment's time.
    left_unanswered = events[-1]
    assert (left_unanswered["notice"], left_unanswered["stream"]) == ("unanswered", 8)
    assert got[:-2] == events[:-1]
    assert got[-2:] == [{"kind": "notice", "ts": round(beyond.ts, 6), "notice": "late",
                         "text": "bytes beyond the end of the stream, captured after it ended: not decoded",
                         "stream": stream, "src": client, "dst": fetch["src"], "direction": "s2c",
                         "stream_offset": end_offset, "size": 10},
                        dict(left_unanswered, ts=round(beyond.ts, 6))]


def test_response_whose_request_was_not_captured_is_inferred(tmp_path):
    """kafka-python's Fetch request lost: its response is decoded as Fetch v12 all the same,
    marked inferred, body identical; the lost bytes are reported."""
    events = original("kafka_python_codecs")
    fetch = next(e for e in events if e["kind"] == "request" and e["api_name"] == "Fetch")
    stream, client = fetch["stream"], fetch["src"]
    pks = packets("kafka_python_codecs")
    lost = request_packet(pks, port_of(client), fetch["correlation_id"])
    assert payload_len(pks[lost]) == fetch["size"] + 4
    got = decode(write_pcap(tmp_path / "no-request.pcap", pks[:lost] + pks[lost + 1:]))

    assert other_streams(got, stream) == other_streams(events, stream)
    before = of_stream(events, stream)
    response = message(before, "response", "Fetch", fetch["correlation_id"], stream)
    inferred = dict(response, inferred=True, latency_ms=None, client_id=None)
    offset = sum(e["size"] + 4 for e in before if e["kind"] == "request" and e["ts"] < fetch["ts"])
    # The hole waits for a retransmission until the capture ends; the response waits with it,
    # since its request might still arrive from behind the hole.
    gap = notice(stream, client, fetch["dst"], "c2s", round(pks[-1].ts, 6), MISSING, offset, fetch["size"] + 4)
    assert of_stream(got, stream) == [e for e in before if e not in (fetch, response)] + [gap, inferred]
    assert (inferred["api_name"], inferred["api_version"], inferred["topics"]) == ("Fetch", 12, ["kafka-python-none"])


def test_lost_request_segment_leaves_later_requests_paired(tmp_path):
    events = original("kafka_python_codecs")
    listing = next(e for e in events if e["kind"] == "request" and e["api_name"] == "ListOffsets")
    stream, client = listing["stream"], listing["src"]
    pks = packets("kafka_python_codecs")
    lost = request_packet(pks, port_of(client), listing["correlation_id"])
    got = decode(write_pcap(tmp_path / "lost.pcap", pks[:lost] + pks[lost + 1:]))

    before = of_stream(events, stream)
    response = message(before, "response", "ListOffsets", listing["correlation_id"], stream)
    after = of_stream(got, stream)
    messages = [e for e in after if e["kind"] != "notice"]
    i = before.index(listing)
    # ListOffsets v6 to v9 responses share one layout: the lowest version is shown.
    inferred = dict(response, inferred=True, latency_ms=None, client_id=None, api_version=6,
                    alternatives=readings("ListOffsets", 7, 8, 9, 10, 11))
    assert messages == before[:i] + [inferred] + before[i + 2:]
    (gap,) = [e for e in after if e["kind"] == "notice"]
    assert (gap["text"], gap["stream_offset"], gap["size"]) == (MISSING, before[i - 2]["size"] + 4, listing["size"] + 4)


def write_snapped(path: Path, pks: list[Packet], kept: dict[int, int]) -> Path:
    """A pcap whose packets at the indexes of `kept` were captured with only that many bytes of their TCP payload (a
    snap length: their length on the wire stays in the record's header)."""
    with open(path, "wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
        for i, packet in enumerate(pks):
            captured = len(packet.frame) - payload_len(packet) + kept[i] if i in kept else len(packet.frame)
            micros = round(packet.ts * 1e6)
            out.write(struct.pack("<IIII", micros // 1_000_000, micros % 1_000_000, captured, len(packet.frame)))
            out.write(packet.frame[:captured])
    return path


def alone_in_its_segment(pks: list[Packet], message: dict) -> int | None:
    """The packet carrying the message's frame and nothing else, if there is one."""
    find = request_packet if message["kind"] == "request" else response_packet
    client = message["src"] if message["kind"] == "request" else message["dst"]
    at = find(pks, port_of(client), message["correlation_id"])
    return at if payload_len(pks[at]) == message["size"] + 4 else None


def pipelined_responses(events: list[dict], pks: list[Packet], more_than: int):
    """Two responses in a row on a connection whose second's request went before the first response (a client
    pipelining), the first response and the second request each alone in a segment and of more than `more_than`
    bytes: (first response, second response, second request, {their segments' indexes: more_than})."""
    for stream in sorted({e["stream"] for e in events}):
        responses = [e for e in of_stream(events, stream) if e["kind"] == "response"]
        for r1, r2 in zip(responses, responses[1:]):
            q2 = message(events, "request", r2["api_name"], r2["correlation_id"], stream)
            cut = {alone_in_its_segment(pks, r1): more_than, alone_in_its_segment(pks, q2): more_than}
            if q2["ts"] < r1["ts"] and None not in cut and min(r1["size"], q2["size"]) + 4 > more_than:
                return r1, r2, q2, cut
    pytest.fail("no such responses in the capture")


@pytest.mark.parametrize("name", ["confluent_codecs", "consumer_lag", "rebalance_confluent_kafka", "transactions"])
def test_frames_cut_short_are_skipped_to_their_known_end_and_the_next_response_decodes_in_its_place(tmp_path, name):
    """A response cut short by the snap length, its size prefix captured: its end is known, and the next frame
    starts there. So the next response decodes, in its place, even when its own request was cut short as well
    (inferred). Before, the framer resynchronised after the gap, could not prove that response, whose request it had
    not seen, and skipped it whole; and a response whose request was lost, older than the latest request, was held
    to the connection's end for its request, which could not come."""
    events, pks, kept = original(name), packets(name), 12
    r1, r2, q2, cut = pipelined_responses(events, pks, kept)
    stream, client, server = r1["stream"], r1["dst"], r1["src"]
    got = decode(write_snapped(tmp_path / "snapped.pcap", pks, cut))

    def offset(m: dict) -> int:
        return sum(e["size"] + 4 for e in of_stream(events, stream) if e["kind"] == m["kind"] and e["ts"] < m["ts"])

    def cut_short(m: dict, direction: str) -> list[dict]:
        return [notice(stream, client, server, direction, m["ts"], "partial frame lost in a gap", offset(m), kept),
                notice(stream, client, server, direction, m["ts"], MISSING, offset(m) + kept, m["size"] + 4 - kept)]

    assert other_streams(got, stream) == other_streams(events, stream)
    expected = []
    for e in of_stream(events, stream):
        expected += cut_short(e, "s2c") if e is r1 else cut_short(e, "c2s") if e is q2 else [e]
    # The request of the response cut short is left without one, said when its connection closes.
    q1 = message(events, "request", r1["api_name"], r1["correlation_id"], stream)
    expected.append(unanswered(closed_at(pks, port_of(client)), stream, client, server,
                               f"1 request without a response when the connection ended: "
                               f"{q1['api_name']} v{q1['api_version']} corr={q1['correlation_id']}"))
    got_stream = of_stream(got, stream)
    inferred = got_stream[expected.index(r2)]
    assert got_stream == [inferred if e is r2 else e for e in expected]
    assert {k: v for k, v in inferred.items() if k not in ("api_name", "api_version", "alternatives", "body")} == \
        dict({k: v for k, v in r2.items() if k not in ("api_name", "api_version", "body")}, inferred=True,
             latency_ms=None, client_id=None)
    assert r2["api_name"] in [inferred["api_name"], *(a["api_name"] for a in inferred.get("alternatives", []))]


def response_bytes(pks: list[Packet], client: str, response: dict) -> bytes:
    """A response's frame after its size, from the one segment that carries it."""
    data = tcp_of(pks[response_packet(pks, port_of(client), response["correlation_id"])].frame).data
    return data[4:4 + response["size"]]


def without_request(tmp_path: Path, name: str, request: dict) -> tuple[list[dict], dict, bytes]:
    """The capture decoded without the one segment carrying `request`, the original response to it, and that
    response's bytes."""
    pks = packets(name)
    lost = request_packet(pks, port_of(request["src"]), request["correlation_id"])
    assert payload_len(pks[lost]) == request["size"] + 4
    response = message(original(name), "response", request["api_name"], request["correlation_id"],
                       request["stream"])
    got = decode(write_pcap(tmp_path / "lost.pcap", pks[:lost] + pks[lost + 1:]))
    return got, response, response_bytes(pks, request["src"], response)


def readings(api_name: str, *versions: int) -> list[dict]:
    """An inferred response's `alternatives` (the other readings that fit its bytes) of one API."""
    return [{"api_name": api_name, "api_version": version} for version in versions]


# A Heartbeat v4 response (throttle time, error code, no tagged fields) fits 75 readings of 29 APIs besides its own
HEARTBEAT_ALSO_FITS = (75, 29, ["OffsetCommit", "Produce", "Fetch"])


@pytest.mark.parametrize("name, stream, correlation_id, api_name, api_version, lowest_fit, also_fits", [
    ("consumer_group", 4, 7, "Heartbeat", 4, ("Produce", 1), HEARTBEAT_ALSO_FITS),
    ("rebalance_aiokafka", 7, 3, "JoinGroup", 5, ("JoinGroup", 2), readings("JoinGroup", 2, 3, 4)),
    ("transactions", 11, 4, "AddPartitionsToTxn", 3, ("OffsetCommit", 8),
     readings("OffsetCommit", 8, 9, 10) + readings("TxnOffsetCommit", 3, 4, 5, 6) + readings("AlterReplicaLogDirs", 2)),
])
def test_response_whose_lost_request_the_client_sent_before_is_read_at_that_version(
        tmp_path, name, stream, correlation_id, api_name, api_version, lowest_fit, also_fits):
    """A request lost whose API and version the client sent earlier on its connection (answered, so no longer at
    hand): its response is read as that API and version, inferred, body identical, though lower schemas fit its
    bytes too (one of them was shown before), which it lists (`alternatives`). Nothing else changes."""
    events = original(name)
    lost = message(events, "request", api_name, correlation_id, stream)
    assert lost["api_version"] == api_version
    assert any(e["kind"] == "request" and (e["api_name"], e["api_version"]) == (api_name, api_version)
               for e in of_stream(events, stream)[:of_stream(events, stream).index(lost)])
    got, response, payload = without_request(tmp_path, name, lost)
    fits = [(api_name_of(key), version) for key, version in response_fits(payload).fits]
    assert fits[0] == lowest_fit and (api_name, api_version) in fits

    assert other_streams(got, stream) == other_streams(events, stream)
    shown = next(e for e in of_stream(got, stream) if e.get("inferred"))
    if also_fits is HEARTBEAT_ALSO_FITS:
        count, apis, first = also_fits
        names = list(dict.fromkeys(reading["api_name"] for reading in shown["alternatives"]))
        assert (len(shown["alternatives"]), len(names), names[:3]) == (count, apis, first)
        also_fits = shown["alternatives"]
    inferred = dict(response, inferred=True, latency_ms=None, client_id=None, alternatives=also_fits)
    before = [e for e in of_stream(events, stream) if e != lost]
    assert [e for e in of_stream(got, stream) if e["kind"] != "notice"] == \
        [inferred if e == response else e for e in before if e["kind"] != "notice"]
    (gap,) = [e for e in of_stream(got, stream) if e["kind"] == "notice"]
    offset = sum(e["size"] + 4 for e in before if e["kind"] == "request" and e["ts"] < lost["ts"])
    assert (gap["notice"], gap["stream_offset"], gap["size"]) == ("missing", offset, lost["size"] + 4)


def test_response_whose_lost_request_the_client_never_sent_before_is_read_as_the_lowest_plausible_fit(tmp_path):
    """kafka-python sends InitProducerId v4 once on its connection: lost, nothing the connection says names it.
    Its 22 bytes fit FindCoordinator v1 too, but with a port no broker sends (1 << 24, from the producer epoch's
    bytes and the tagged fields' count): the lowest fit without such a value wins, InitProducerId v2 (v2 to v4 share the layout, so the
    version cannot be told from the bytes), body as captured."""
    events = original("kafka_python_codecs")
    init = next(e for e in events if e["kind"] == "request" and e["api_name"] == "InitProducerId")
    requests = [e["api_name"] for e in of_stream(events, init["stream"]) if e["kind"] == "request"]
    assert requests.count("InitProducerId") == 1
    got, response, payload = without_request(tmp_path, "kafka_python_codecs", init)
    coordinator = decode_response(payload, 10, 1)
    assert coordinator.complete and with_fields(coordinator, payload).body.child("Port").value == 1 << 24
    fits = response_fits(payload).fits
    assert fits[0] == (22, 2) and fits.index((22, 4)) < fits.index((10, 1))
    (shown,) = [e for e in of_stream(got, init["stream"]) if e["kind"] == "response"
                and e["correlation_id"] == init["correlation_id"]]
    assert (shown["api_name"], shown["api_version"], shown["inferred"]) == ("InitProducerId", 2, True)
    assert (shown["size"], shown["body"]) == (response["size"], response["body"])


def test_response_read_with_an_offset_below_minus_one_ranks_below_its_own_schema():
    """aiokafka's first OffsetFetch v3 response (no offset committed: -1, error NONE) fits Fetch v1 too, lower, with
    a high watermark of -65536 and UNKNOWN_SERVER_ERROR: an offset below -1 ranks that reading below OffsetFetch
    v3's, which no other fit without implausible values precedes."""
    events = original("rebalance_aiokafka")
    request = next(e for e in events if e["kind"] == "request" and e["api_name"] == "OffsetFetch")
    response = message(events, "response", "OffsetFetch", request["correlation_id"], request["stream"])
    payload = response_bytes(packets("rebalance_aiokafka"), request["src"], response)
    fetch = with_fields(decode_response(payload, 1, 1), payload)
    partition = fetch.body.child("Responses").children[0].child("Partitions").children[0]
    assert fetch.complete and partition.child("HighWatermark").value == -65536
    assert response_fits(payload).fits[0] == (9, 3)

def test_retransmitted_segments_change_nothing(tmp_path):
    """Every data segment sent again two packets later (the copy with that later time)."""
    pks = packets("confluent_codecs")
    resent = []
    for i, p in enumerate(pks):
        resent.append(p)
        if i >= 2 and payload_len(pks[i - 2]):
            resent.append(Packet(p.ts, pks[i - 2].frame))
    assert len(resent) - len(pks) == 255
    assert decode(write_pcap(tmp_path / "resent.pcap", resent)) == original("confluent_codecs")


def test_out_of_order_neighbours_change_nothing(tmp_path):
    """Each pair of neighbouring data segments of one direction swapped, times kept with them."""
    pks = packets("confluent_codecs")
    swapped = 0
    i = 0
    while i + 1 < len(pks):
        if payload_len(pks[i]) and payload_len(pks[i + 1]) and \
                pcapkit.endpoints(pks[i]) == pcapkit.endpoints(pks[i + 1]):
            pks[i], pks[i + 1] = pks[i + 1], pks[i]
            swapped += 1
            i += 2
        else:
            i += 1
    assert swapped == 63
    assert decode(write_pcap(tmp_path / "reordered.pcap", pks)) == original("confluent_codecs")


def test_a_request_waiting_when_its_connection_ends_is_named(tmp_path):
    """kafka-python's admin client sends DeleteTopics, and the connection closes without its response (lost here;
    Tansu was seen closing a connection so after two DeleteRecords requests): each side's FIN, the server's where
    the response would have started. One notice, at the time of the FIN that ends the connection, names the
    request; before, nothing was said of it."""
    events = original("admin")
    delete = next(e for e in events if e["kind"] == "request" and e["api_name"] == "DeleteTopics")
    stream, client, server = delete["stream"], delete["src"], delete["dst"]
    response = message(events, "response", "DeleteTopics", delete["correlation_id"], stream)
    pks = packets("admin")
    lost = response_packet(pks, port_of(client), delete["correlation_id"])
    closing = indexes(pks, port_of(client))[-3:]  # the client's FIN, the server's, the client's last ACK
    assert closing == [lost + 1, lost + 2, lost + 3]
    size = payload_len(pks[lost])
    closed = []
    for i in closing:  # the server's sequence numbers, and the client's acknowledgements of them, lose the response
        tcp = tcp_of(pks[i].frame)
        moved = {"ack": (tcp.ack - size) % 2**32} if pcapkit.from_client(pks[i], BROKER) else \
            {"seq": (tcp.seq - size) % 2**32}
        closed.append(Packet(pks[i].ts, pcapkit.rewrite(pks[i].frame, **moved)))
    path = write_pcap(tmp_path / "closed.pcap", pks[:lost] + closed + pks[lost + 4:])
    got = decode(path)

    text = "1 request without a response when the connection ended: DeleteTopics v6 corr=12"
    assert other_streams(got, stream) == other_streams(events, stream)
    assert of_stream(got, stream) == [e for e in of_stream(events, stream) if e is not response] + [
        unanswered(pks[lost + 2].ts, stream, client, server, text)]
    assert [line for line in run(path).splitlines() if " ! " in line] == [
        f"08:13:58.096436 #{stream} {client} ↔ {server} ! {text}"]


def test_a_request_in_flight_when_the_capture_ends_is_named(tmp_path):
    """The capture stops right after kafka-python's DeleteTopics request: the capture ended while the request
    waited (as a consumer's long-polling Fetch often is at a capture's end), not its connection."""
    events = original("admin")
    delete = next(e for e in events if e["kind"] == "request" and e["api_name"] == "DeleteTopics")
    pks = packets("admin")
    sent = request_packet(pks, port_of(delete["src"]), delete["correlation_id"])
    got = decode(write_pcap(tmp_path / "stopped.pcap", pks[:sent + 1]))
    assert got == [e for e in events if e["ts"] <= delete["ts"]] + [unanswered(
        pks[sent].ts, delete["stream"], delete["src"], delete["dst"],
        "1 request without a response when the capture ended: DeleteTopics v6 corr=12")]


# ---------------------------------------------------------------- big messages


def test_one_megabyte_value_spans_many_segments_and_decodes_intact():
    capture = load_capture("confluent_codecs")
    (produced,) = [r for r in capture.produced() if r.value is not None and len(r.value) == 1048600]
    events = original("confluent_codecs")
    big = request_of(events, "Produce", 1048748)
    records = [rec for topic in big["body"]["topic_data"] if topic["name"] == produced.topic
               for part in topic["partition_data"] for batch in part["records"] for rec in batch["records"]]
    (value,) = [r["value"] for r in records if r["key"] == {"base64": "a2V5LWxhcmdl", "text": "key-large"}]
    assert base64.b64decode(value["base64"]) == produced.value
    assert produced.key == b"key-large"

    pks = packets("confluent_codecs")
    start = request_packet(pks, port_of(big["src"]), big["correlation_id"])
    segments = [pks[i] for i in carrying(pks, start, big["size"] + 4)]
    assert sum(payload_len(p) for p in segments) == big["size"] + 4 + 39  # the last one also holds request 6
    assert len(segments) == 24
    assert sorted(len(p.frame) for p in segments)[-8:] == [45634] + [65549] * 7  # more than 65,535 bytes

    fetched = next(e for e in events if e["kind"] == "response" and e["size"] == 1049966)
    (consumed,) = [c for c in capture.manifest["consumed"] if c["value"] and c["value"]["length"] == 1048600]
    fetched_values = [base64.b64decode(rec["value"]["base64"])
                      for topic in fetched["body"]["responses"] for part in topic["partitions"]
                      if part["partition_index"] == consumed["partition"]
                      for batch in part["records"] for rec in batch["records"] if rec["value"]]
    assert hashlib.sha256(fetched_values[consumed["offset"]]).hexdigest() == consumed["value"]["sha256"]


# ---------------------------------------------------------------- file formats and link layers


def test_pcapng_with_two_interfaces(tmp_path):
    """Client frames on an Ethernet interface (microseconds), server frames on a Linux cooked
    v2 interface (nanoseconds), in a pcapng file named .pcap."""
    path = pcapkit.write_pcapng(
        tmp_path / "two-interfaces.pcap", packets("kafka_python_codecs"),
        interface_of=lambda p: 0 if pcapkit.from_client(p, BROKER) else 1,
        interfaces=[(pcapkit.ETHERNET, lambda f: f),
                    (pcapkit.LINUX_SLL2, lambda f: pcapkit.relinked(f, pcapkit.sll2_header))])
    assert path.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"
    assert decode(path) == original("kafka_python_codecs")


LINK_LAYERS = {
    "linux cooked v1": (pcapkit.LINUX_SLL, pcapkit.sll_header),
    "linux cooked v2": (pcapkit.LINUX_SLL2, pcapkit.sll2_header),
    "802.1Q VLAN": (pcapkit.ETHERNET, pcapkit.vlan_header((0x8100, 100))),
    "QinQ": (pcapkit.ETHERNET, pcapkit.vlan_header((0x88A8, 200), (0x8100, 100))),
}


@pytest.mark.parametrize("name", LINK_LAYERS)
def test_link_layer(tmp_path, name):
    linktype, header = LINK_LAYERS[name]
    frames = [Packet(ts, pcapkit.relinked(frame, header)) for ts, frame in packets("aiokafka_codecs")]
    assert decode(write_pcap(tmp_path / "link.pcap", frames, linktype)) == original("aiokafka_codecs")


def test_gzip_compressed_capture(tmp_path):
    path = tmp_path / "capture.pcap.gz"
    path.write_bytes(gzip.compress((CAPTURES_DIR / "consumer_group.pcap").read_bytes()))
    assert decode(path) == original("consumer_group")


def test_ipv6(tmp_path):
    """Every IPv4 packet rewritten as IPv6 (127.0.0.1 becomes fd00::7f00:1)."""
    frames = [Packet(ts, pcapkit.as_ipv6(frame)) for ts, frame in packets("kafka_python_api_versions")]
    got = decode(write_pcap(tmp_path / "ipv6.pcap", frames))
    expected = json.loads(_original_json("kafka_python_api_versions").replace('"127.0.0.1:', '"[fd00::7f00:1]:'))
    assert got[0]["src"].startswith("[fd00::7f00:1]:")
    assert got == expected


# ---------------------------------------------------------------- several connections, ports


def test_two_captures_merged_interleave_by_connection(tmp_path):
    """port_19092.pcap moved in time to overlap kafka_python_codecs.pcap: two brokers on two
    ports, connections interleaved; each connection decodes as it did alone."""
    first, second = packets("kafka_python_codecs"), packets("port_19092")
    shift = first[0].ts - second[0].ts + 0.004
    both = pcapkit.merged(first, pcapkit.shifted(second, shift))
    got = decode(write_pcap(tmp_path / "merged.pcap", both))

    alone = original("kafka_python_codecs")
    for e in (moved := original("port_19092")):
        e["ts"] += shift
    expected = by_connection(alone) | by_connection(moved)
    grouped = by_connection(got)
    assert grouped.keys() == expected.keys()
    assert len(grouped) == 20 + 9  # connections of each capture
    for key, want in expected.items():
        have = grouped[key]
        assert len(have) == len(want)
        for h, w in zip(have, want):
            assert h["ts"] == pytest.approx(w["ts"], abs=2e-6)
            if w.get("latency_ms") is not None:
                assert h["latency_ms"] == pytest.approx(w["latency_ms"], abs=2e-3)
            assert {k: v for k, v in h.items() if k not in ("ts", "latency_ms")} == \
                   {k: v for k, v in w.items() if k not in ("ts", "latency_ms")}
    on_19092 = [port_of(e["dst"] if e["kind"] == "request" else e["src"]) == 19092 for e in got]
    assert sum(a != b for a, b in zip(on_19092, on_19092[1:])) > 10  # the two captures interleave


def test_kafka_on_port_19092_without_a_hint():
    """Found by content: every request pairs, nothing inferred or skipped, the same as with
    --port 19092, and the Produce requests carry exactly what the manifest says was acked."""
    capture = load_capture("port_19092")
    events = original("port_19092")
    assert events == decode(capture.pcap, "--port", "19092")
    (notice,) = [e for e in events if e["kind"] not in ("request", "response")]
    assert (notice["notice"], notice["text"]) == (
        "unanswered", "1 request without a response when the connection ended: Metadata v12 corr=10")
    responses = [e for e in events if e["kind"] == "response"]
    assert all(not e["inferred"] and e["latency_ms"] is not None for e in responses)
    assert len(responses) == 29 and len(events) - len(responses) == 30 + 1  # one Metadata request left unanswered

    acked = []
    for produce in (e for e in events if e["kind"] == "request" and e["api_name"] == "Produce"):
        response = message(events, "response", "Produce", produce["correlation_id"], produce["stream"])
        base = {(t["name"], p["index"]): p["base_offset"]
                for t in response["body"]["responses"] for p in t["partition_responses"]}
        for topic in produce["body"]["topic_data"]:
            for part in topic["partition_data"]:
                for batch in part["records"]:
                    for rec in batch["records"]:
                        acked.append((topic["name"], part["index"], base[topic["name"], part["index"]] + rec["offset"],
                                      rec["key"], rec["value"], [tuple(header) for header in rec["headers"]]))
    expected = [(r.topic, r.partition, r.offset, text_json(r.key), text_json(r.value),
                 [(k, text_json(v)) for k, v in r.headers]) for r in capture.produced()]
    assert sorted(acked, key=str) == sorted(expected, key=str)


def test_a_captured_handshake_decides_the_client_whatever_the_port_hint_says():
    """A hint naming a client's port as the broker's changes nothing where the SYN was captured
    (before, that connection's client and broker swapped and every message was malformed)."""
    events = original("consumer_group")
    assert decode(CAPTURES_DIR / "consumer_group.pcap", "--port", str(port_of(events[0]["src"]))) == events


# ---------------------------------------------------------------- connections of our own


def produce_acks_zero(correlation_id: int, client_id: str) -> bytes:
    batch = encode_record_batch([Record(key=b"fire", value=b"and forget")], base_timestamp=1795421623000)
    return encode_request(0, 9, correlation_id, client_id, {
        "TransactionalId": None, "Acks": 0, "TimeoutMs": 1500,
        "TopicData": [{"Name": "kafka-python-none", "PartitionData": [{"Index": 0, "Records": batch}]}]})


def test_acks_zero_produce_expects_no_response(tmp_path):
    """A Produce with acks=0 inserted into a real producer connection after its last response."""
    events = original("kafka_python_codecs")
    produce = next(e for e in events if e["kind"] == "request" and e["api_name"] == "Produce")
    stream, client = produce["stream"], produce["src"]
    response = message(events, "response", "Produce", produce["correlation_id"], stream)
    pks = packets("kafka_python_codecs")
    anchor = response_packet(pks, port_of(client), response["correlation_id"])
    frame = produce_acks_zero(99, produce["client_id"])
    path = write_pcap(tmp_path / "acks0.pcap", pcapkit.inserted_after(pks, anchor, frame, BROKER))
    got = decode(path)

    added = got[events.index(response) + 1]
    assert {k: added[k] for k in ("kind", "stream", "api_name", "api_version", "correlation_id", "size",
                                  "expects_response", "malformed", "ts")} == {
        "kind": "request", "stream": stream, "api_name": "Produce", "api_version": 9, "correlation_id": 99,
        "size": len(frame) - 4, "expects_response": False, "malformed": None, "ts": response["ts"]}
    (batch,) = added["body"]["topic_data"][0]["partition_data"][0]["records"]
    assert [(r["key"]["text"], r["value"]["text"]) for r in batch["records"]] == [("fire", "and forget")]
    assert added["body"]["acks"] == 0
    got.remove(added)
    assert got == events  # nothing waits for a response, nothing is reported
    lines = run(path).splitlines()
    assert lines[events.index(response) + 1].endswith(
        f"Produce v9 request corr=99 client='{produce['client_id']}' (no response expected) {len(frame) - 4}B "
        "kafka-python-none[0] 1 batch 1 record")
    assert sum("no response expected" in line for line in lines) == 1


def test_frames_inside_a_record_value_are_not_taken_for_frames(tmp_path):
    """A capture that starts inside a Produce whose record value holds a real Metadata request twice: the
    first copy decodes and is followed by a plausible header, but one with the same correlation id, and
    clients number their requests upwards; the second is followed by the rest of the Produce. Neither is
    a message; the next Produce, and both responses, are."""
    metadata = connection_frames("consumer_group", 0)[2][1]
    assert decode_request(metadata, 4).api_name == "Metadata"
    produce = [encode_request(0, 9, correlation_id, "embedder", {"Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"Name": "t", "PartitionData": [{"Index": 0, "Records": encode_record_batch([Record(b"k", value)])}]}]})
        for correlation_id, value in ((5, metadata * 2), (6, b"plain"))]
    answer = [encode_response(0, 9, correlation_id, {"Responses": [{"Name": "t", "PartitionResponses": [
        {"Index": 0}]}]}) for correlation_id in (5, 6)]
    conversation = TcpConversation(("10.2.0.1", 40000), ("10.2.0.2", BROKER))
    for request, response in zip(produce, answer):
        conversation.send(True, request).send(False, response)
    pks = conversation.close()[3:]  # no handshake
    ts, frame = pks[0]
    tcp = tcp_of(frame)
    assert tcp.data == produce[0]
    pks[0] = Packet(ts, pcapkit.rewrite(frame, seq=tcp.seq + 20, data=tcp.data[20:]))
    got = decode(write_pcap(tmp_path / "embedded.pcap", pks))
    # The request proves the connection is Kafka, and which side is the client: the bytes held until
    # then are replayed the client's first.
    assert [(e["kind"], e.get("notice") or e["api_name"], e.get("correlation_id"), e.get("inferred"),
             e.get("size")) for e in got] == [
        ("notice", "skipped", None, None, len(produce[0]) - 20), ("request", "Produce", 6, None, len(produce[1]) - 4),
        ("response", "Produce", 5, True, len(answer[0]) - 4), ("response", "Produce", 6, False, len(answer[1]) - 4)]


def merged_with(name: str, conversation: list[Packet]) -> list[Packet]:
    return pcapkit.merged(packets(name), conversation)


def conversation_inside(name: str, client: tuple[str, int], server: tuple[str, int]) -> TcpConversation:
    """A conversation starting 3 ms into the capture, so it interleaves with its connections."""
    return TcpConversation(client, server, start=_packets(name)[0].ts + 0.003)


def first_request_cut(tmp_path: Path, name: str, keep: int, api_key: int | None = None) -> tuple[list[dict], bytes]:
    """The capture's first connection, handshake and its first request's first `keep` bytes, the capture ending
    there (its API key replaced when asked); its events, and the request's frame with its size prefix."""
    pks = packets(name)
    first = next(i for i, p in enumerate(pks) if payload_len(p))
    data = tcp_of(pks[first].frame).data
    frame = data[:4 + struct.unpack_from(">i", data)[0]]
    cut = frame[:keep] if api_key is None else frame[:4] + struct.pack(">h", api_key) + frame[6:keep]
    kept = pks[:first] + [Packet(pks[first].ts, pcapkit.rewrite(pks[first].frame, data=cut))]
    return decode(write_pcap(tmp_path / "cut.pcap", kept)), frame


@pytest.mark.parametrize("name, api", [("kafka_python_api_versions", ("ApiVersions", 1)),
                                       ("confluent_codecs", ("ApiVersions", 3))])
@pytest.mark.parametrize("keep", [8, 9, 12, -1])
def test_connection_ending_inside_its_first_request_is_kafka_cut_short(tmp_path, name, api, keep):
    """A capture that ends inside a connection's first request (its handshake captured), from its API key and
    version on: a Kafka frame cut short, shown where it starts with how much of it came, not a stream that is not
    Kafka."""
    got, frame = first_request_cut(tmp_path, name, keep)
    cut = len(frame) + keep if keep < 0 else keep
    assert (api_name_of(struct.unpack_from(">h", frame, 4)[0]), struct.unpack_from(">h", frame, 6)[0]) == api
    assert [{k: v for k, v in e.items() if k not in ("ts", "src", "dst")} for e in got] == [
        {"kind": "notice", "stream": 0, "notice": "skipped", "direction": "c2s", "stream_offset": 0, "size": cut,
         "text": f"stream ended inside a frame ({cut - 4} of {len(frame) - 4} bytes)"}]
    assert port_of(got[0]["dst"]) == BROKER


@pytest.mark.parametrize("keep, api_key", [(7, None), (12, 0x7FFF)])
def test_connection_ending_inside_bytes_that_are_no_request_is_still_not_kafka(tmp_path, keep, api_key):
    """Cut before its version is whole, or naming an API Kafka does not define, the first bytes do not show a
    request: the connection is not Kafka, as before."""
    got, _ = first_request_cut(tmp_path, "kafka_python_api_versions", keep, api_key)
    assert [(e["notice"], e["text"], e["size"]) for e in got] == [
        ("not-kafka", "not Kafka: no Kafka request or response found; not decoded", keep)]


def test_http_connection_is_reported_as_not_kafka(tmp_path):
    """Not silent: the connection appears once per direction, with the bytes it carried."""
    http = conversation_inside("consumer_group", ("127.0.0.1", 48000), ("127.0.0.1", 8080))
    body = hashlib.shake_256(b"an opaque download").digest(20000)  # binary: sizes that look plausible
    request = b"GET /download HTTP/1.1\r\nHost: localhost:8080\r\nAccept: */*\r\n\r\n"
    response = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % \
        len(body) + body
    http.send(True, request)
    http.send(False, response)
    pks = http.close()
    assert len([p for p in pks if payload_len(p)]) == 1 + 14
    got = decode(write_pcap(tmp_path / "http.pcap", merged_with("consumer_group", pks)))
    reported = [e for e in got if "127.0.0.1:48000" in (e["src"], e["dst"])]  # the HTTP connection's events
    assert by_connection([e for e in got if e not in reported]) == by_connection(original("consumer_group"))
    closed = pks[-2].ts  # the second FIN ends the connection
    text = "not Kafka: no Kafka request or response found; not decoded"
    assert [{k: v for k, v in e.items() if k != "stream"} for e in reported] == [
        {"kind": "notice", "ts": closed, "notice": "not-kafka", "text": text, "src": "127.0.0.1:48000",
         "dst": "127.0.0.1:8080", "direction": direction, "stream_offset": 0, "size": size}
        for direction, size in (("c2s", len(request)), ("s2c", len(response)))]
    assert len({e["stream"] for e in reported}) == 1
    assert len({e["stream"] for e in got}) == len({e["stream"] for e in original("consumer_group")}) + 1


def client_hello() -> bytes:
    """A real TLS ClientHello, from Python's ssl module writing into memory."""
    outgoing = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="kafka.internal")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("options, broker, handshake", [
    ([], BROKER, True),
    (["--port", "9093"], 9093, True),  # a port hint no longer turns the TLS check off
    (["--port", "9093"], 9093, False),  # without the handshake, the records' chain tells
], ids=["plain", "port-hint", "port-hint-mid-way"])
def test_tls_connection_is_reported_once_and_its_bytes_at_the_end(tmp_path, options, broker, handshake):
    """Without keys: one notice saying what the handshake showed and why the connection is not decoded (here
    the server's alert; without the hello, no key log), then each direction's bytes when it ends."""
    hello = client_hello()
    assert hello[:3] == b"\x16\x03\x01"
    alert = b"\x15\x03\x03\x00\x02\x02\x28"  # handshake failure
    data = b"\x17\x03\x03\x00\x05" + bytes(5)  # an application data record
    tls = conversation_inside("consumer_group", ("127.0.0.1", 48001), ("127.0.0.1", broker))
    tls.send(True, hello)
    tls.send(False, alert)
    tls.send(True, data)
    pks = tls.close()
    if not handshake:  # the capture starts after the ClientHello
        pks = pks[4:]
        assert payload_len(pks[0]) == len(alert)
    got = decode(write_pcap(tmp_path / "tls.pcap", merged_with("consumer_group", pks)), *options)
    reported = [e for e in got if "127.0.0.1:48001" in (e["src"], e["dst"])]  # the TLS connection's events
    stream = reported[0]["stream"]
    connection = {"stream": stream, "src": "127.0.0.1:48001", "dst": f"127.0.0.1:{broker}"}
    sizes = [("c2s", len(hello) + len(data)), ("s2c", len(alert))] if handshake else [("c2s", len(data)),
                                                                                      ("s2c", len(alert))]
    # record header, handshake header, legacy version, then the client random
    shown = f"SNI kafka.internal, client random {hello[11:43].hex()}" if handshake else "handshake not captured"
    why = (f"TLS, no ServerHello, {shown}: not decoded: the handshake ended with alert 40 (handshake_failure)"
           + (" from the server" if handshake else ""))
    assert reported == [
        {"kind": "notice", "ts": next(p.ts for p in pks if payload_len(p) == len(alert)), "notice": "tls",
         "text": why, **connection}
    ] + [{"kind": "notice", "ts": pks[-2].ts, "notice": "tls", "text": "TLS: encrypted bytes, not decoded",
          **connection, "direction": direction, "stream_offset": 0, "size": size} for direction, size in sizes]
    assert by_connection([e for e in got if e not in reported]) == by_connection(original("consumer_group"))


def test_stats_account_for_every_byte_captured(tmp_path):
    """A segment of a Fetch response lost, an HTTP and a TLS connection beside the Kafka ones: --stats
    says where each byte captured went, and the bytes missing; the sums agree with the events shown."""
    pks = packets("confluent_codecs")
    lost = next(i for i, p in enumerate(pks) if payload_len(p) == pcapkit.LOOPBACK_MSS and
                not pcapkit.from_client(p, BROKER))
    http = conversation_inside("confluent_codecs", ("127.0.0.1", 48000), ("127.0.0.1", 8080))
    http.send(True, b"GET / HTTP/1.1\r\n\r\n").send(False, b"HTTP/1.1 204 No Content\r\n\r\n")
    hello = client_hello()
    tls = conversation_inside("confluent_codecs", ("127.0.0.1", 48001), ("127.0.0.1", BROKER))
    tls.send(True, hello).send(False, b"\x15\x03\x03\x00\x02\x02\x28")
    kept = pcapkit.merged(pks[:lost] + pks[lost + 1:], http.close(), tls.close())
    path = write_pcap(tmp_path / "all.pcap", kept)
    events = decode(path)
    stats = json.loads(run(path, "--stats", "--json").splitlines()[-1])
    assert stats == json.loads(run(path, "--stats", "--json", "-j", "3").splitlines()[-1])

    def notice_bytes(kind: str) -> int:
        return sum(e.get("size", 0) for e in events if e.get("notice") == kind)

    assert stats["bytes"] == {
        "captured": sum(payload_len(p) for p in kept),
        "messages": sum(e["size"] + 4 for e in events if e["kind"] in ("request", "response")),
        "sasl_tokens": 0, "skipped": notice_bytes("skipped"), "tls": notice_bytes("tls"),
        "not_kafka": notice_bytes("not-kafka"), "missing": pcapkit.LOOPBACK_MSS}
    assert stats["bytes"]["not_kafka"] == 18 + 27 and stats["bytes"]["tls"] == len(hello) + 7
    assert stats["bytes"]["skipped"] > 0
    assert run(path, "--stats").splitlines()[-1] == (
        f"bytes captured: {stats['bytes']['captured']:,} = {stats['bytes']['messages']:,} in messages + 0 in SASL "
        f"tokens + {stats['bytes']['skipped']:,} skipped + {stats['bytes']['tls']:,} TLS + 45 not Kafka; "
        f"{pcapkit.LOOPBACK_MSS:,} missing from the capture")


# ---------------------------------------------------------------- SASL


CLIENT, SERVER = ("10.1.0.7", 51000), ("10.1.0.9", BROKER)
PASSWORD = "Wonderland-42"
PLAIN_TOKEN = b"\0alice\0" + PASSWORD.encode()


def sized(token: bytes) -> bytes:
    return struct.pack(">i", len(token)) + token


def metadata_exchange(conversation: TcpConversation, correlation_id: int) -> None:
    conversation.send(True, encode_request(3, 9, correlation_id, "app", {"Topics": [{"Name": "orders"}]}))
    conversation.send(False, encode_response(3, 9, correlation_id, {
        "Brokers": [{"NodeId": 1, "Host": SERVER[0], "Port": BROKER}], "ClusterId": "c1", "ControllerId": 1,
        "Topics": [{"ErrorCode": 3, "Name": "orders"}]}))


def written(tmp_path: Path, conversation: TcpConversation) -> Path:
    return write_pcap(tmp_path / "sasl.pcap", conversation.close())


def summary(events: list[dict]) -> list[tuple]:
    return [(e["kind"], e.get("api_name"), e.get("correlation_id"), e.get("latency_ms") is not None)
            if e["kind"] in ("request", "response") else (e["kind"], e.get("mechanism"), e.get("size"))
            for e in events]


def test_sasl_handshake_v0_then_raw_plain_tokens(tmp_path):
    sasl = TcpConversation(CLIENT, SERVER)
    sasl.send(True, encode_request(17, 0, 1, "app", {"Mechanism": "PLAIN"}))
    sasl.send(False, encode_response(17, 0, 1, {"ErrorCode": 0, "Mechanisms": ["PLAIN", "SCRAM-SHA-512"]}))
    sasl.send(True, sized(PLAIN_TOKEN))
    sasl.send(False, sized(b""))  # a broker answers a PLAIN token with an empty one
    metadata_exchange(sasl, 2)
    path = written(tmp_path, sasl)
    events = decode(path)
    assert summary(events) == [
        ("request", "SaslHandshake", 1, False), ("response", "SaslHandshake", 1, True),
        ("sasl_token", "PLAIN", 20), ("sasl_token", "PLAIN", 0),
        ("request", "Metadata", 2, False), ("response", "Metadata", 2, True),
    ]
    client_token, server_token = events[2], events[3]
    assert client_token == {"kind": "sasl_token", "ts": client_token["ts"], "stream": 0, "src": "10.1.0.7:51000",
                            "dst": "10.1.0.9:9092", "mechanism": "PLAIN", "size": 20,
                            "fields": {"authorization_id": "", "username": "alice", "password": "********"}}
    assert (server_token["src"], server_token["fields"]) == ("10.1.0.9:9092", None)
    assert events[5]["body"]["topics"] == [{"error_code": 3, "name": "orders", "is_internal": False,
                                            "partitions": [], "topic_authorized_operations": -2147483648}]
    assert events[5]["errors"] == ["UNKNOWN_TOPIC_OR_PARTITION"]
    assert decode(path, "--show-secrets")[2]["fields"]["password"] == PASSWORD
    lines = run(path).splitlines()
    assert lines[2].endswith("SASL PLAIN token 20B authorization_id= username=alice password=********")
    assert run(path, "--show-secrets").splitlines()[2].endswith(f"username=alice password={PASSWORD}")
    assert PASSWORD not in run(path)


def test_sasl_authenticate_plain(tmp_path):
    sasl = TcpConversation(CLIENT, SERVER)
    sasl.send(True, encode_request(17, 1, 1, "app", {"Mechanism": "PLAIN"}))
    sasl.send(False, encode_response(17, 1, 1, {"ErrorCode": 0, "Mechanisms": ["PLAIN"]}))
    sasl.send(True, encode_request(36, 2, 2, "app", {"AuthBytes": PLAIN_TOKEN}))
    sasl.send(False, encode_response(36, 2, 2, {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"",
                                                "SessionLifetimeMs": 3600000}))
    metadata_exchange(sasl, 3)
    path = written(tmp_path, sasl)
    events = decode(path)
    assert summary(events) == [
        ("request", "SaslHandshake", 1, False), ("response", "SaslHandshake", 1, True),
        ("request", "SaslAuthenticate", 2, False), ("response", "SaslAuthenticate", 2, True),
        ("request", "Metadata", 3, False), ("response", "Metadata", 3, True),
    ]
    assert events[2]["body"] == {"auth_bytes": {"authorization_id": "", "username": "alice", "password": "********"}}
    assert events[3]["body"]["session_lifetime_ms"] == 3600000
    assert decode(path, "--show-secrets")[2]["body"]["auth_bytes"]["password"] == PASSWORD
    tree = run(path, "-V")
    assert "username: 'alice'" in tree and "password: ********" in tree and PASSWORD not in tree
    assert PASSWORD in run(path, "-V", "--show-secrets")


def scram_sha256(password: bytes, salt: bytes, iterations: int, client_first_bare: str, server_first: str,
                 client_final_bare: str) -> tuple[str, str]:
    """(client proof, server signature), base64, computed as RFC 5802 defines them."""
    salted = hashlib.pbkdf2_hmac("sha256", password, salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    auth_message = f"{client_first_bare},{server_first},{client_final_bare}".encode()
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    server_signature = hmac.digest(hmac.digest(salted, b"Server Key", "sha256"), auth_message, "sha256")
    return base64.b64encode(proof).decode(), base64.b64encode(server_signature).decode()


def test_sasl_authenticate_scram_masks_the_proof(tmp_path):
    salt = hashlib.sha256(b"kafkasniff salt").digest()[:16]
    client_nonce, server_nonce = "c5f1d0a7e3b94c2a", "c5f1d0a7e3b94c2a8e6b1f0d4a2c"
    client_first_bare = f"n=alice,r={client_nonce}"
    server_first = f"r={server_nonce},s={base64.b64encode(salt).decode()},i=4096"
    client_final_bare = f"c=biws,r={server_nonce}"
    proof, server_signature = scram_sha256(PASSWORD.encode(), salt, 4096, client_first_bare, server_first, client_final_bare)

    sasl = TcpConversation(CLIENT, SERVER)
    sasl.send(True, encode_request(17, 1, 1, "app", {"Mechanism": "SCRAM-SHA-256"}))
    sasl.send(False, encode_response(17, 1, 1, {"ErrorCode": 0, "Mechanisms": ["SCRAM-SHA-256"]}))
    sasl.send(True, encode_request(36, 1, 2, "app", {"AuthBytes": f"n,,{client_first_bare}".encode()}))
    sasl.send(False, encode_response(36, 1, 2, {"ErrorCode": 0, "ErrorMessage": None,
                                                "AuthBytes": server_first.encode()}))
    sasl.send(True, encode_request(36, 1, 3, "app", {"AuthBytes": f"{client_final_bare},p={proof}".encode()}))
    sasl.send(False, encode_response(36, 1, 3, {"ErrorCode": 0, "ErrorMessage": None,
                                                "AuthBytes": f"v={server_signature}".encode(),
                                                "SessionLifetimeMs": 3600000}))
    metadata_exchange(sasl, 4)
    path = written(tmp_path, sasl)
    events = decode(path)
    assert [e["api_name"] for e in events] == ["SaslHandshake"] * 2 + ["SaslAuthenticate"] * 4 + ["Metadata"] * 2
    assert all(e["latency_ms"] is not None for e in events if e["kind"] == "response")
    assert [e["body"]["auth_bytes"] for e in events[2:6]] == [
        {"username": "alice", "nonce": client_nonce},
        {"nonce": server_nonce, "salt": base64.b64encode(salt).decode(), "iterations": "4096"},
        {"channel_binding": "biws", "nonce": server_nonce, "proof": "********"},
        {"server_signature": server_signature},
    ]
    assert decode(path, "--show-secrets")[4]["body"]["auth_bytes"]["proof"] == proof
    assert proof not in run(path, "-V") and proof in run(path, "-V", "--show-secrets")
