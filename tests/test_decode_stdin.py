"""`kafkasniff decode -`: a capture through a pipe, as `tcpdump -w - | kafkasniff decode -` or
`ssh host tcpdump -w - | ...` give it; and several captures at once, each line saying its file."""

from __future__ import annotations

import gzip
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import pcapkit
from capture_manifest import CAPTURES_DIR
from kafkasniff.cli import main

REPO = Path(__file__).resolve().parent.parent
CAPTURE = CAPTURES_DIR / "consumer_group.pcap"
PCAP_HEADER = 24
RECORD_HEADER = 16
WAIT_S = 20.0


def decode_file(*args: str) -> str:
    result = CliRunner().invoke(main, ["decode", *args], catch_exceptions=False)
    assert result.exit_code == 0
    return result.stdout


def kafkasniff(*args: str, stdin=subprocess.PIPE) -> subprocess.Popen:
    # stdout block-buffered, as when users pipe it on: the command must flush it itself
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.Popen([sys.executable, "-m", "kafkasniff", *args], cwd=REPO, env=environment, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def piped(data: bytes, *args: str) -> tuple[int, str, str]:
    process = kafkasniff("decode", *args, "-")
    out, err = process.communicate(data, timeout=60)
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("options", [[], ["--json"], ["-V"], ["--hex"], ["--stats", "--json"]],
                         ids=["line", "json", "tree", "hex", "stats"])
def test_a_capture_piped_in_decodes_as_the_file_does(options):
    assert piped(CAPTURE.read_bytes(), *options) == (0, decode_file(*options, str(CAPTURE)), "")


def test_gzip_and_pcapng_piped_in(tmp_path):
    packets = pcapkit.read_packets(CAPTURE)
    pcapng = pcapkit.write_pcapng(tmp_path / "c.pcapng", packets, lambda p: 0, [(pcapkit.ETHERNET, bytes)])
    expected = decode_file("--json", str(CAPTURE))
    assert piped(gzip.compress(CAPTURE.read_bytes()), "--json") == (0, expected, "")
    assert piped(pcapng.read_bytes(), "--json") == (0, expected, "")


def records(path: Path) -> tuple[bytes, list[bytes]]:
    """A little-endian pcap's file header and its records, each with its header."""
    data = path.read_bytes()
    assert data[:4] == b"\xd4\xc3\xb2\xa1"
    out, pos = [], PCAP_HEADER
    while pos < len(data):
        caplen = struct.unpack_from("<I", data, pos + 8)[0]
        out.append(data[pos:pos + RECORD_HEADER + caplen])
        pos += RECORD_HEADER + caplen
    return data[:PCAP_HEADER], out


def read_lines(process: subprocess.Popen, pending: bytearray) -> list[str]:
    """The complete lines the process writes next (fails if none come in time)."""
    lines: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while not lines:
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, "no line came"
        chunk = os.read(process.stdout.fileno(), 65536)
        assert chunk, "the output ended"
        pending += chunk
        *complete, rest = pending.split(b"\n")
        pending[:] = rest
        lines += [line.decode() for line in complete]
    return lines


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_messages_show_as_they_arrive_and_a_stop_signal_ends_cleanly(stop):
    """Each message is printed once the packet completing it has gone into the pipe; Ctrl-C (or SIGTERM)
    while the pipe is still open finishes what is in flight and prints the summary, exit status 0."""
    whole = [json.loads(line) for line in decode_file("--json", str(CAPTURE)).splitlines()]
    times = [round(p.ts, 6) for p in pcapkit.read_packets(CAPTURE)]
    header, packets = records(CAPTURE)
    process = kafkasniff("decode", "--json", "--stats", "-")
    process.stdin.write(header)
    written, shown, pending = 0, [], bytearray()
    while len(shown) < 4:
        completing = times.index(whole[len(shown)]["ts"])
        process.stdin.write(b"".join(packets[written:completing + 1]))
        process.stdin.flush()
        written = completing + 1
        shown += [json.loads(line) for line in read_lines(process, pending)]
        assert shown == whole[:len(shown)]
    process.send_signal(stop)
    rest, err = process.communicate(timeout=WAIT_S)
    assert (process.returncode, err) == (0, b"")
    (stats,) = [json.loads(line) for line in (pending + rest).decode().splitlines()]
    assert stats["kind"] == "stats"
    assert sum(a["requests"] + a["responses"] for a in stats["apis"]) == len(shown)


@pytest.mark.parametrize("name", ["admin", "consumer_group", "transactions"])
def test_what_came_through_the_pipe_shows_while_it_stays_open(name):
    """The messages completed by what has gone into the pipe are printed while it stays open, though the last
    segment written completes none (an ACK, a FIN, a segment of the next message): once at a point inside the
    capture, once with all of it."""
    path = CAPTURES_DIR / f"{name}.pcap"
    messages = [json.loads(line) for line in decode_file("--json", str(path)).splitlines()]
    messages = [m for m in messages if m["kind"] in ("request", "response")]
    times = [round(p.ts, 6) for p in pcapkit.read_packets(path)]
    completing = {times.index(m["ts"]) for m in messages}
    header, packets = records(path)
    inside = next(index for index in range(times.index(messages[len(messages) // 2]["ts"]), len(packets))
                  if index not in completing)
    for written in (inside, len(packets)):
        due = [m for m in messages if times.index(m["ts"]) < written]
        process = kafkasniff("decode", "--json", "-")
        process.stdin.write(header + b"".join(packets[:written]))
        process.stdin.flush()
        shown, pending = [], bytearray()
        try:
            while len(shown) < len(due):
                shown += [m for m in map(json.loads, read_lines(process, pending))
                          if m["kind"] in ("request", "response")]
        finally:
            process.kill()
            process.communicate()
        assert shown == due


def test_nothing_or_a_terminal_on_standard_input_is_a_clear_error():
    assert piped(b"") == (2, "", "kafkasniff: standard input: input too short to be a capture (0 bytes); pipe a "
                                 "capture into it, e.g. tcpdump -U -w - | kafkasniff decode -\n")
    leader, follower = pty.openpty()
    try:
        process = kafkasniff("decode", "-", stdin=follower)
        out, err = process.communicate(timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    assert (process.returncode, out, err.decode()) == (
        2, b"", "kafkasniff: standard input is a terminal; pipe a capture into it, e.g. tcpdump -w - | "
                "kafkasniff decode -\n")


def test_several_captures_say_which_file_each_line_comes_from():
    other = CAPTURES_DIR / "admin.pcap"
    first, second = (decode_file(str(path)).splitlines() for path in (CAPTURE, other))
    assert decode_file(str(CAPTURE), str(other)).splitlines() == \
        [f"{CAPTURE}: {line}" for line in first] + [f"{other}: {line}" for line in second]
    labelled = [json.loads(line) for line in decode_file("--json", str(CAPTURE), str(other)).splitlines()]
    alone = [json.loads(line) for path in (CAPTURE, other) for line in decode_file("--json", str(path)).splitlines()]
    assert [e.pop("file") for e in labelled] == [str(CAPTURE)] * len(first) + [str(other)] * len(second)
    assert labelled == alone
    assert list(json.loads(decode_file("--json", str(CAPTURE), str(other)).splitlines()[0]))[0] == "file"
    tree = decode_file("-V", str(CAPTURE), str(other)).splitlines()
    assert [line for line in tree if line.startswith("==> ")] == [f"==> {CAPTURE} <==", f"==> {other} <=="]
    assert tree[0] == f"==> {CAPTURE} <=="
    stats = decode_file("--stats", "--json", str(CAPTURE), str(other)).splitlines()[-1]
    assert stats.startswith('{"kind":"stats"')
