"""The TLS record layer on records this test seals itself, for what real clients here cannot be made to send:
a TLS 1.3 KeyUpdate (Python's ssl has no call for it), records cut at every byte, a record lost from the
capture, and damage. The key schedule here is written from RFC 8446 with the standard library's HMAC, apart
from the one under test."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings, strategies as st

from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.tls import TlsConnection

CLIENT, SERVER = 0, 1
CLIENT_RANDOM = bytes(range(32))
SECRETS = {name: hashlib.sha256(name.encode()).digest() for name in (
    "CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET", "CLIENT_TRAFFIC_SECRET_0",
    "SERVER_TRAFFIC_SECRET_0")}
KEY_LOG = "".join(f"{name} {CLIENT_RANDOM.hex()} {secret.hex()}\n" for name, secret in SECRETS.items()).encode()


def expand_label(secret: bytes, label: bytes, size: int) -> bytes:
    """HKDF-Expand-Label (RFC 8446 7.1, RFC 5869 2.3) with SHA-256 and an empty context."""
    label = b"tls13 " + label
    info = struct.pack(">HB", size, len(label)) + label + b"\x00"
    out, block, counter = b"", b"", 1
    while len(out) < size:
        block = hmac.new(secret, block + info + bytes((counter,)), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:size]


class Sealer:
    """One direction's TLS 1.3 AES-128-GCM records."""

    def __init__(self, secret: bytes):
        self.rekey(secret)

    def rekey(self, secret: bytes) -> None:
        self.secret, self.seq = secret, 0
        self.aead = AESGCM(expand_label(secret, b"key", 16))
        self.iv = expand_label(secret, b"iv", 12)

    def seal(self, content_type: int, content: bytes) -> bytes:
        inner = content + bytes((content_type,))
        header = b"\x17\x03\x03" + struct.pack(">H", len(inner) + 16)
        nonce = (int.from_bytes(self.iv, "big") ^ self.seq).to_bytes(12, "big")
        self.seq += 1
        return header + self.aead.encrypt(nonce, inner, header)


def handshake_record(kind: int, body: bytes) -> bytes:
    message = bytes((kind,)) + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x03" + struct.pack(">H", len(message)) + message


def client_hello() -> bytes:
    return handshake_record(1, b"\x03\x03" + CLIENT_RANDOM + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00" + b"\x00\x00")


def server_hello() -> bytes:
    extensions = b"\x00\x2b\x00\x02\x03\x04"  # supported_versions: TLS 1.3
    return handshake_record(2, b"\x03\x03" + bytes(32) + b"\x00" + b"\x13\x01" + b"\x00" +
                            struct.pack(">H", len(extensions)) + extensions)


def finished() -> bytes:
    return b"\x14\x00\x00\x20" + bytes(32)


def handshaken() -> tuple[TlsConnection, Sealer, Sealer]:
    """A connection past its handshake, and the sealers of the client's and the server's application data."""
    keylog = KeyLog()
    keylog.add_text(KEY_LOG)
    tls = TlsConnection(keylog, (True, True))
    assert tls.data(CLIENT, client_hello()) == []
    server = Sealer(SECRETS["SERVER_HANDSHAKE_TRAFFIC_SECRET"])
    assert tls.data(SERVER, server_hello() + server.seal(22, finished())) == []
    client = Sealer(SECRETS["CLIENT_HANDSHAKE_TRAFFIC_SECRET"])
    assert tls.data(CLIENT, client.seal(22, finished())) == []
    client.rekey(SECRETS["CLIENT_TRAFFIC_SECRET_0"])
    server.rekey(SECRETS["SERVER_TRAFFIC_SECRET_0"])
    assert tls.failure is None and tls.info == {"version": "1.3", "cipher": "TLS_AES_128_GCM_SHA256"}
    return tls, client, server


def test_a_key_update_switches_to_the_next_secret():
    tls, client, server = handshaken()
    before = client.seal(23, b"before the update")
    update = client.seal(22, b"\x18\x00\x00\x01\x00")  # KeyUpdate, update_not_requested
    client.rekey(expand_label(client.secret, b"traffic upd", 32))
    after = client.seal(23, b"after the update")
    assert tls.data(CLIENT, before + update + after) == [(CLIENT, b"before the update" + b"after the update")]
    assert tls.data(SERVER, server.seal(23, b"the server's keys are its own")) == [
        (SERVER, b"the server's keys are its own")]


def test_records_cut_at_every_byte_come_out_whole():
    tls, client, _ = handshaken()
    stream = b"".join(client.seal(23, f"record {i} ".encode() * 50) for i in range(5))
    out = []
    for i in range(len(stream)):
        out += tls.data(CLIENT, stream[i:i + 1])
    assert b"".join(piece for _, piece in out) == b"".join(f"record {i} ".encode() * 50 for i in range(5))


def test_after_a_lost_record_the_sequence_is_found_again():
    tls, client, _ = handshaken()
    records = [client.seal(23, f"record {i}".encode()) for i in range(6)]
    assert tls.data(CLIENT, records[0] + records[1]) == [(CLIENT, b"record 0record 1")]
    tls.gap(CLIENT, len(records[2]) + len(records[3]))
    # The capture resumes inside record 4: the next record boundary, then its sequence number, are found.
    assert tls.data(CLIENT, records[4][7:] + records[5]) == [(CLIENT, b"record 5")]
    assert tls.failure is None


def test_a_record_that_does_not_authenticate_stops_the_connection_with_the_reason():
    tls, client, _ = handshaken()
    record = bytearray(client.seal(23, b"tampered"))
    record[-1] ^= 1
    assert tls.data(CLIENT, bytes(record)) == []
    assert tls.failure == "keys do not authenticate the records"
    assert tls.data(CLIENT, client.seal(23, b"later")) == []  # nothing more from this connection


def test_a_malformed_server_hello_is_reported():
    keylog = KeyLog()
    keylog.add_text(KEY_LOG)
    tls = TlsConnection(keylog, (True, True))
    tls.data(CLIENT, client_hello())
    assert tls.data(SERVER, handshake_record(2, b"\x03\x03" + bytes(10))) == []
    assert tls.failure == "malformed ServerHello"
    assert tls.description() == f"TLS, no ServerHello, no SNI, client random {CLIENT_RANDOM.hex()}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((CLIENT, SERVER)), st.binary(max_size=300)), max_size=12),
       st.booleans())
def test_any_bytes_after_a_handshake_never_raise(pieces, from_start):
    tls, client, _ = handshaken() if from_start else (TlsConnection(KeyLog(), (False, False)), None, None)
    for side, data in pieces:
        for side_out, plaintext in tls.data(side, data):
            assert side_out == side and isinstance(plaintext, bytes)
    tls.end()
    assert tls.failure is not None or sum(len(d.buf) for d in tls.sides) <= 2 * 300 * 12


def test_a_huge_handshake_message_is_passed_over_unread():
    keylog = KeyLog()
    tls = TlsConnection(keylog, (True, True))
    tls.data(CLIENT, client_hello())
    # TLS 1.2 (its certificates are not encrypted): a Certificate message claiming 16 MiB, sent in full
    # records, is skipped as it goes, nothing gathered.
    head = b"\x0b" + ((1 << 24) - 1).to_bytes(3, "big")
    tls.data(SERVER, handshake_record(2, b"\x03\x03" + bytes(32) + b"\x00" + b"\xc0\x2f" + b"\x00"))
    for i in range(64):
        body = (head if i == 0 else b"") + os.urandom(16000)
        tls.data(SERVER, b"\x16\x03\x03" + struct.pack(">H", len(body)) + body)
    assert tls.failure is None and tls.description().startswith("TLS 1.2, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
    assert len(tls.sides[SERVER].handshake) == 0 and tls.sides[SERVER].handshake_skip == (1 << 24) - 1 - 64 * 16000
