"""Odd conversations met in the wild, recorded on loopback by tcpdump: real frames from the project's
captures replayed by a stub client and a stub broker with the change each case needs (tests/loopback.py),
and TLS from Python's ssl module. Each is decoded as a user would, with `kafkasniff decode`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker import LOOPBACK, Tcpdump, free_port
from kafkasniff.cli import main
from kafkasniff.protocol.messages import decode_request
from loopback import connection_frames, record, tls_exchange, with_size

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0
                                or shutil.which("tcpdump") is None,
                                reason="recording on loopback needs Linux, root and tcpdump")

# aiokafka's first producer connection: ApiVersions v0, then one Produce v7 (acks=1), each answered.
PRODUCER = ("aiokafka_codecs", 1)


def decode(path: Path, *options: str) -> str:
    result = CliRunner().invoke(main, ["decode", *options, str(path)], catch_exceptions=False)
    assert (result.exit_code, result.stderr) == (0, "")
    return result.stdout


def decode_json(path: Path, *options: str) -> list[dict]:
    return [json.loads(line) for line in decode(path, "--json", *options).splitlines()]


def messages(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] in ("request", "response")]


def test_a_broker_answering_an_acks_0_produce_is_paired(tmp_path):
    """The request's version, its client id (in --stats too), latency; marked unexpected, not inferred."""
    steps = connection_frames(*PRODUCER)
    (index,) = [i for i, (from_client, frame) in enumerate(steps) if from_client and
                decode_request(frame, 4, skim=True).api_name == "Produce"]
    produce = decode_request(steps[index][1], 4)
    acks = produce.body.child("Acks")
    assert (produce.api_version, acks.value) == (7, 1)
    frame = steps[index][1]
    steps[index] = (True, frame[:acks.offset] + (0).to_bytes(2, "big") + frame[acks.offset + 2:])
    path, _ = record(tmp_path / "acks0.pcap", steps)

    request, response = messages(decode_json(path))[2:]
    assert (request["expects_response"], request["body"]["acks"]) == (False, 0)
    assert {k: response[k] for k in ("api_name", "api_version", "correlation_id", "client_id", "inferred",
                                     "unexpected", "malformed")} == {
        "api_name": "Produce", "api_version": 7, "correlation_id": request["correlation_id"],
        "client_id": "aiokafka-producer-1", "inferred": False, "unexpected": True, "malformed": None}
    assert response["latency_ms"] == pytest.approx((response["ts"] - request["ts"]) * 1000, abs=0.002)
    lines = decode(path).splitlines()
    assert "Produce v7 request corr=2 client='aiokafka-producer-1' (no response expected) 1346B " in lines[2]
    assert "Produce v7 response corr=2 121B " in lines[3]
    assert "ms (unexpected: its request expected no response) aiokafka-none[" in lines[3]
    stats = json.loads(decode(path, "--stats", "--json").splitlines()[-1])
    assert stats["clients"] == [{"client_id": "aiokafka-producer-1", "requests": 2,
                                 "bytes": sum(e["size"] for e in messages(decode_json(path))), "errors": 0}]


def test_a_first_frame_with_trailing_bytes_is_a_frame(tmp_path):
    """Early librdkafka sends ApiVersions v0 requests with 4 bytes more (an empty array of a pre-release
    layout). The connection is decoded all the same: that frame with its trailing bytes, everything after."""
    steps = connection_frames(*PRODUCER)
    from_client, frame = steps[0]
    assert from_client and decode_request(frame, 4).api_name == "ApiVersions"
    steps[0] = (True, with_size(frame[4:] + bytes(4)))
    path, _ = record(tmp_path / "trailing.pcap", steps)

    got = messages(decode_json(path))
    assert [(e["kind"], e["api_name"], e["api_version"], e["trailing_bytes"], e["malformed"]) for e in got] == [
        ("request", "ApiVersions", 0, 4, None), ("response", "ApiVersions", 0, 0, None),
        ("request", "Produce", 7, 0, None), ("response", "Produce", 7, 0, None)]
    assert all(e["latency_ms"] is not None for e in got if e["kind"] == "response")
    assert decode(path).splitlines()[0].endswith("ApiVersions v0 request corr=1 client='aiokafka-producer-1' "
                                                 "33B +4 trailing bytes")


def test_a_connection_holding_one_response_is_shown(tmp_path):
    """The capture begins after the request went out: the one complete response is inferred, and the other
    version whose layout it shares is named."""
    steps = connection_frames("consumer_group", 0)[:4]  # ApiVersions, then Metadata v12, each answered
    path, port = record(tmp_path / "lone.pcap", steps, start_at=3)

    (response,) = decode_json(path)
    # Metadata v11 and v12 responses share one layout: without the request, the lower version is shown.
    assert {k: response[k] for k in ("kind", "stream", "api_name", "api_version", "correlation_id", "size",
                                     "inferred", "alternatives", "latency_ms", "malformed", "src")} == {
        "kind": "response", "stream": 0, "api_name": "Metadata", "api_version": 11, "correlation_id": 2,
        "size": len(steps[3][1]) - 4, "inferred": True, "alternatives": [{"api_name": "Metadata", "api_version": 12}],
        "latency_ms": None, "malformed": None, "src": f"{LOOPBACK}:{port}"}
    (line,) = decode(path).splitlines()
    assert line.endswith(f" #0 {response['dst']} ← {LOOPBACK}:{port} Metadata v11 response corr=2 165B "
                         "(request not captured: inferred; also fits Metadata v12)")


# ---------------------------------------------------------------- TLS


@pytest.mark.parametrize("options", [[], ["--port", "{port}"]], ids=["no-hint", "port-hint"])
def test_tls_is_recognised_with_or_without_a_port_hint(tmp_path, certificate, options):
    port = free_port()
    path = tmp_path / "tls.pcap"
    with Tcpdump(path, port):
        tls_exchange(port, certificate, b"Kafka inside TLS " * 100)
    events = decode_json(path, *[o.format(port=port) for o in options])
    assert [(e["notice"], e.get("direction")) for e in events] == [("tls", None), ("tls", "c2s"), ("tls", "s2c")]
    assert re.fullmatch(r"TLS 1\.3, TLS_AES_256_GCM_SHA384, SNI localhost, client random [0-9a-f]{64}: not decoded: "
                        r"no key log given \(--tls-keylog FILE, or SSLKEYLOGFILE\)", events[0]["text"])
    assert [e["text"] for e in events[1:]] == ["TLS: encrypted bytes, not decoded"] * 2
    assert all(e["dst"] == f"{LOOPBACK}:{port}" for e in events)
