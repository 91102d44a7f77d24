"""TLS connections decrypted with key logs, on the project's TLS captures (captures/tls/, real clients through
socat's TLS listener, their own key logs) and live: what each message says of its TLS, what a connection
without keys says, wrong and missing keys, secrets inside a pcapng, captures starting mid-connection, workers."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess

import pytest
from click.testing import CliRunner

from broker import Tcpdump, free_port
from capture_manifest import load_capture, tls_capture_names
from kafkasniff.cli import main
from kafkasniff.protocol.encoder import encode_request, encode_response
from loopback import tls_converse
from pcapkit import endpoints, payload_len, read_packets, write_pcap

TLS_CAPTURES = tls_capture_names()
NO_KEYS_ENV = {"SSLKEYLOGFILE": ""}
STREAM_NOTICE = re.compile(r"TLS (1\.[23]), (TLS_\w+), no SNI, client random ([0-9a-f]{64}): not decoded: (.+)")


def decode(*args: str) -> str:
    result = CliRunner().invoke(main, ["decode", "-j", "1", *map(str, args)], env=NO_KEYS_ENV,
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def decode_json(*args) -> list[dict]:
    return [json.loads(line) for line in decode("--json", *args).splitlines()]


def messages(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] in ("request", "response")]


def key_lines(name: str) -> list[str]:
    return load_capture(name).keylog.read_text().splitlines()


def client_randoms(lines: list[str]) -> list[str]:
    """In the order the key log first names them: one per connection."""
    return list(dict.fromkeys(line.split()[1] for line in lines
                              if line.startswith(("CLIENT_RANDOM ", "CLIENT_HANDSHAKE_TRAFFIC_SECRET "))))


def with_keys(name: str) -> list[dict]:
    capture = load_capture(name)
    return decode_json(capture.pcap, "--tls-keylog", capture.keylog)


@pytest.mark.parametrize("name", TLS_CAPTURES)
def test_every_message_names_the_suite_its_connection_used(name):
    """The manifest says which suite carried each topic; each Produce request's "tls" says the same."""
    suites = {c["topic"]: {"version": c["version"], "cipher": c["cipher"]}
              for c in load_capture(name).manifest["tls"]["connections"]}
    found = messages(with_keys(name))
    assert found and all("tls" in e for e in found)
    produced = {topic: e["tls"] for e in found if e["api_name"] == "Produce" and e["kind"] == "request"
                for topic in e["topics"]}
    assert produced == suites
    by_stream = {}
    for e in found:
        assert by_stream.setdefault(e["stream"], e["tls"]) == e["tls"]  # one suite per connection


@pytest.mark.parametrize("name", TLS_CAPTURES)
def test_without_keys_each_connection_says_once_what_it_is_and_why(name):
    events = decode_json(load_capture(name).pcap)
    assert messages(events) == []
    said = [e for e in events if e.get("direction") is None]
    assert len({e["stream"] for e in said}) == len(said)  # once per connection
    found = [STREAM_NOTICE.fullmatch(e["text"]) for e in said]
    assert all(found), [e["text"] for e in said]
    assert {m.group(4) for m in found} == {"no key log given (--tls-keylog FILE, or SSLKEYLOGFILE)"}
    # Each connection's client random is the one its client logged, and the suites are the manifest's.
    assert [m.group(3) for m in found] == client_randoms(key_lines(name))
    suites = {(c["version"], c["cipher"]) for c in load_capture(name).manifest["tls"]["connections"]}
    assert {(m.group(1), m.group(2)) for m in found} == suites
    # The rest of each connection's bytes, at its end, per direction.
    ends = [e for e in events if e.get("direction") is not None]
    assert {e["text"] for e in ends} == {"TLS: encrypted bytes, not decoded"}
    assert len(ends) == 2 * len(said)


@pytest.mark.parametrize("name", TLS_CAPTURES)
def test_a_key_log_without_one_connection_decodes_the_others(name, tmp_path):
    lines = key_lines(name)
    missing = client_randoms(lines)[1]
    partial = tmp_path / "partial.keys"
    partial.write_text("\n".join(line for line in lines if missing not in line) + "\n")
    full, got = with_keys(name), decode_json(load_capture(name).pcap, "--tls-keylog", partial)
    (said,) = [e for e in got if e["kind"] == "notice" and e["notice"] == "tls" and e.get("direction") is None]
    assert said["text"].endswith(f"client random {missing}: not decoded: no key for this client random")
    assert messages(got) == [e for e in messages(full) if e["stream"] != said["stream"]]


@pytest.mark.parametrize("name", TLS_CAPTURES)
def test_a_corrupted_key_is_reported_and_the_other_connections_decode(name, tmp_path):
    lines = key_lines(name)
    victim = client_randoms(lines)[0]
    # TLS 1.2: the master secret; TLS 1.3: the server's handshake secret (the first records it opens)
    label = "CLIENT_RANDOM" if name.endswith("tls12_suites") else "SERVER_HANDSHAKE_TRAFFIC_SECRET"
    broken = []
    for line in lines:
        if line.startswith(f"{label} {victim} "):
            line = line[:-1] + ("0" if line[-1] != "0" else "1")
        broken.append(line)
    keys = tmp_path / "broken.keys"
    keys.write_text("\n".join(broken) + "\n")
    full, got = with_keys(name), decode_json(load_capture(name).pcap, "--tls-keylog", keys)
    (said,) = [e for e in got if e["kind"] == "notice" and e["notice"] == "tls" and e.get("direction") is None]
    assert said["text"].endswith(f"client random {victim}: not decoded: keys do not authenticate the records")
    assert messages(got) == [e for e in messages(full) if e["stream"] != said["stream"]]


@pytest.mark.skipif(shutil.which("editcap") is None, reason="needs editcap (apt-get install tshark)")
@pytest.mark.parametrize("name", TLS_CAPTURES)
def test_secrets_inside_a_pcapng_decrypt_it_as_the_key_log_does(name, tmp_path):
    capture = load_capture(name)
    pcapng = tmp_path / "with-secrets.pcapng"
    subprocess.run(["editcap", "--inject-secrets", f"tls,{capture.keylog}", str(capture.pcap), str(pcapng)],
                   check=True, capture_output=True)
    assert decode_json(pcapng) == with_keys(name)


def pcapng_block(kind: int, body: bytes) -> bytes:
    body += b"\x00" * (-len(body) % 4)
    length = struct.pack("<I", 12 + len(body))
    return struct.pack("<I", kind) + length + body + length


def pcapng_with_secrets(capture, secrets_at: int, cut_secrets: bool) -> bytes:
    """A pcapng of the capture's packets, its key log in a Decryption Secrets Block that starts at about byte
    `secrets_at`, after frames that are not IP (skipped); with `cut_secrets`, a second secrets block that the
    end of the file cuts short follows the packets."""
    section = pcapng_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    interface = pcapng_block(1, struct.pack("<HHI", 1, 0, 262144))

    def packet(ts: float, frame: bytes) -> bytes:
        ticks = round(ts * 1e6)
        return pcapng_block(6, struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), len(frame))
                            + frame)

    keys = capture.keylog.read_bytes()
    secrets = pcapng_block(0x0A, struct.pack("<II", 0x544C534B, len(keys)) + keys)
    packets = read_packets(capture.pcap)
    head = section + interface
    filler = []
    while len(head) + sum(map(len, filler)) < secrets_at:  # frames of up to 65,000 bytes, so that it ends there
        size = min(65000, secrets_at - len(head) - sum(map(len, filler)) - 32) // 4 * 4
        filler.append(packet(packets[0].ts, b"\x02" * 12 + b"\x90\x00" + bytes(max(size, 16) - 14)))
    return b"".join([head, *filler, secrets, *(packet(ts, frame) for ts, frame in packets),
                     secrets[:len(secrets) // 2] if cut_secrets else b""])


MIB = 1 << 20  # how much of a file the secrets reader takes at a time


@pytest.mark.parametrize("secrets_at, cut_secrets", [(0, False), (MIB - 1000, False), (MIB - 4, False),
                                                     (3 * MIB, True)])
def test_secrets_anywhere_in_a_pcapng_decrypt_it(secrets_at, cut_secrets, tmp_path):
    name = TLS_CAPTURES[0]
    pcapng = tmp_path / "with-secrets.pcapng"
    pcapng.write_bytes(pcapng_with_secrets(load_capture(name), secrets_at, cut_secrets))
    result = CliRunner().invoke(main, ["decode", "--json", "-j", "1", str(pcapng)], env=NO_KEYS_ENV)
    assert messages([json.loads(line) for line in result.stdout.splitlines()]) == messages(with_keys(name))
    assert ("capture ends inside the block" in result.stderr) == cut_secrets


@pytest.mark.parametrize("name", TLS_CAPTURES)
def test_workers_decrypt_too(name):
    capture = load_capture(name)
    keys = ("--tls-keylog", str(capture.keylog))
    single = CliRunner().invoke(main, ["decode", "--json", "-j", "1", *keys, str(capture.pcap)]).output
    assert CliRunner().invoke(main, ["decode", "--json", "-j", "2", *keys, str(capture.pcap)]).output == single


def test_sslkeylogfile_is_read_when_no_key_log_is_given():
    capture = load_capture(TLS_CAPTURES[0])
    result = CliRunner().invoke(main, ["decode", "--json", str(capture.pcap)],
                                env={"SSLKEYLOGFILE": str(capture.keylog)})
    assert result.output == CliRunner().invoke(main, ["decode", "--json", "--tls-keylog", str(capture.keylog),
                                                      str(capture.pcap)]).output


def test_an_unreadable_key_log_is_a_one_line_error(tmp_path):
    capture = load_capture(TLS_CAPTURES[0])
    result = CliRunner().invoke(main, ["decode", "--tls-keylog", str(tmp_path / "none.keys"), str(capture.pcap)])
    assert result.exit_code == 2
    assert result.output == (f"kafkasniff: cannot read the TLS key log {tmp_path / 'none.keys'}: No such file or "
                             "directory; give a readable --tls-keylog FILE (or unset SSLKEYLOGFILE)\n")


def test_lines_that_are_not_key_log_lines_are_skipped_with_a_warning(tmp_path):
    capture = load_capture(TLS_CAPTURES[0])
    keys = tmp_path / "damaged.keys"
    keys.write_text(capture.keylog.read_text() + "CLIENT_RANDOM not-hex 00\nhello\n")
    result = CliRunner().invoke(main, ["decode", "--json", "--tls-keylog", str(keys), str(capture.pcap)])
    assert result.exit_code == 0
    assert result.stderr == ("kafkasniff: warning: 2 lines of the TLS key logs are not key log lines "
                             "(LABEL <client random> <secret>, in hex); skipped\n")
    assert result.stdout == decode("--json", "--tls-keylog", capture.keylog, capture.pcap)


def test_a_capture_starting_mid_connection_decrypts_once_a_record_is_found(tmp_path):
    """TLS 1.3 without the handshake: the key log's traffic secrets are tried on the first record. The capture
    starts inside the second connection, after its handshake: its later messages decode, as do the rest."""
    name = "tls/tls13_suites"
    capture = load_capture(name)
    packets = read_packets(capture.pcap)
    second = sorted({frozenset(endpoints(p)) for p in packets[:40]}, key=lambda c: next(
        i for i, p in enumerate(packets) if frozenset(endpoints(p)) == c))[1]
    carrying = [i for i, p in enumerate(packets) if frozenset(endpoints(p)) == second and payload_len(p)]
    cut = carrying[6]  # ClientHello, ServerHello..., client Finished, then records of application data
    path = write_pcap(tmp_path / "mid.pcap", packets[cut:])
    got = decode_json(path, "--tls-keylog", capture.keylog)
    full = with_keys(name)
    cut_ts = packets[cut].ts
    later = [e for e in messages(full) if e["ts"] >= cut_ts]

    def identity(e: dict) -> tuple:
        return e["src"], e["dst"], e["api_name"], e["correlation_id"], e["size"], e["tls"]["cipher"]

    shown = [identity(e) for e in messages(got)]
    # The second connection's messages after the cut are there, decrypted, and nothing is made up.
    second_ports = {port for _, port in second}
    mid = [e for e in later if {int(e["src"].rsplit(":", 1)[1]), int(e["dst"].rsplit(":", 1)[1])} <= second_ports]
    assert mid and all(identity(e) in shown for e in mid)
    assert set(shown) <= {identity(e) for e in later}
    assert [e for e in got if e["kind"] == "notice" and e.get("direction") is None] == []


def test_sasl_over_tls_decodes_as_on_a_plaintext_listener_secrets_masked(tmp_path, certificate):
    """SASL_SSL: SaslHandshake, SaslAuthenticate (PLAIN) and a Metadata exchange over a real TLS connection on
    loopback (Python's ssl at both ends, the client logging its keys)."""
    password = "Wonderland-42"
    token = b"\0alice\0" + password.encode()
    steps = [
        (True, encode_request(17, 1, 1, "app", {"Mechanism": "PLAIN"})),
        (False, encode_response(17, 1, 1, {"ErrorCode": 0, "Mechanisms": ["PLAIN"]})),
        (True, encode_request(36, 2, 2, "app", {"AuthBytes": token})),
        (False, encode_response(36, 2, 2, {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"",
                                           "SessionLifetimeMs": 3600000})),
        (True, encode_request(3, 9, 3, "app", {"Topics": [{"Name": "orders"}]})),
        (False, encode_response(3, 9, 3, {"Brokers": [], "ClusterId": "c1", "ControllerId": 1,
                                          "Topics": [{"ErrorCode": 3, "Name": "orders"}]})),
    ]
    port, keys, path = free_port(), tmp_path / "sasl.keys", tmp_path / "sasl_ssl.pcap"
    with Tcpdump(path, port):
        tls_converse(port, certificate, steps, keys)
    events = messages(decode_json(path, "--tls-keylog", keys))
    assert [(e["api_name"], e["kind"], e["correlation_id"], e["tls"]["version"]) for e in events] == [
        (api, kind, n, "1.3") for n, api in enumerate(("SaslHandshake", "SaslAuthenticate", "Metadata"), 1)
        for kind in ("request", "response")]
    assert events[2]["body"] == {"auth_bytes": {"authorization_id": "", "username": "alice", "password": "********"}}
    assert password not in decode("-V", "--tls-keylog", keys, path)
    revealed = messages(decode_json(path, "--tls-keylog", keys, "--show-secrets"))
    assert revealed[2]["body"]["auth_bytes"]["password"] == password
