"""The TLS record layer on records this test seals itself, for what real clients here cannot be made to send:
a TLS 1.3 KeyUpdate (Python's ssl has no call for it), records cut at every byte and anywhere, records that
come before their keys, a record lost from the capture, and damage, in each way of making a record's nonce and
additional data (TLS 1.3; TLS 1.2 AES-GCM and ChaCha20-Poly1305). The key schedules here are written from RFC
8446 and RFC 5246 with the standard library's HMAC, apart from the ones under test."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from hypothesis import given, settings, strategies as st

from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.tls import TlsConnection

CLIENT, SERVER = 0, 1
CLIENT_RANDOM = bytes(range(32))
SECRETS = {name: hashlib.sha256(name.encode()).digest() for name in (
    "CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET", "CLIENT_TRAFFIC_SECRET_0",
    "SERVER_TRAFFIC_SECRET_0")}
KEY_LOG = "".join(f"{name} {CLIENT_RANDOM.hex()} {secret.hex()}\n" for name, secret in SECRETS.items()).encode()
SERVER_RANDOM = bytes(range(32, 64))
MASTER_SECRET = hashlib.sha384(b"master secret").digest()
KEY_LOG_12 = f"CLIENT_RANDOM {CLIENT_RANDOM.hex()} {MASTER_SECRET.hex()}\n".encode()
APPLICATION_DATA, HANDSHAKE, ALERT, CHANGE_CIPHER_SPEC = 23, 22, 21, 20
TLS13_AES_128_GCM, TLS13_CHACHA20, TLS12_AES_128_GCM, TLS12_CHACHA20 = 0x1301, 0x1303, 0xC02F, 0xCCA8


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


def prf(secret: bytes, label: bytes, seed: bytes, size: int) -> bytes:
    """TLS 1.2's PRF with SHA-256 (RFC 5246 section 5)."""
    seed = label + seed
    out, a = b"", seed
    while len(out) < size:
        a = hmac.new(secret, a, hashlib.sha256).digest()
        out += hmac.new(secret, a + seed, hashlib.sha256).digest()
    return out[:size]


class Sealer:
    """One direction's TLS 1.3 records (RFC 8446 5.2), AES-128-GCM or ChaCha20-Poly1305."""

    def __init__(self, secret: bytes, suite: int = TLS13_AES_128_GCM):
        self.chacha = suite == TLS13_CHACHA20
        self.rekey(secret)

    def rekey(self, secret: bytes) -> None:
        self.secret, self.seq = secret, 0
        self.aead = (ChaCha20Poly1305 if self.chacha else AESGCM)(expand_label(secret, b"key", 32 if self.chacha else 16))
        self.iv = expand_label(secret, b"iv", 12)

    def seal(self, content_type: int, content: bytes, padding: int = 0) -> bytes:
        inner = content + bytes((content_type,)) + bytes(padding)
        header = b"\x17\x03\x03" + struct.pack(">H", len(inner) + 16)
        nonce = (int.from_bytes(self.iv, "big") ^ self.seq).to_bytes(12, "big")
        self.seq += 1
        return header + self.aead.encrypt(nonce, inner, header)


class Sealer12:
    """One direction's TLS 1.2 records: AES-GCM with an explicit nonce (RFC 5288 section 3), or
    ChaCha20-Poly1305 with the sequence number in the nonce (RFC 7905 section 2)."""

    def __init__(self, suite: int, key: bytes, iv: bytes):
        self.gcm = suite == TLS12_AES_128_GCM
        self.aead = AESGCM(key) if self.gcm else ChaCha20Poly1305(key)
        self.iv, self.seq = iv, 0

    def seal(self, content_type: int, content: bytes, padding: int = 0) -> bytes:
        del padding  # TLS 1.2 records have none
        additional = struct.pack(">QBHH", self.seq, content_type, 0x0303, len(content))
        if self.gcm:
            explicit = struct.pack(">Q", self.seq ^ 0x5A5A)  # any value the sender likes
            body = explicit + self.aead.encrypt(self.iv + explicit, content, additional)
        else:
            body = self.aead.encrypt((int.from_bytes(self.iv, "big") ^ self.seq).to_bytes(12, "big"), content,
                                     additional)
        self.seq += 1
        return struct.pack(">BHH", content_type, 0x0303, len(body)) + body


def handshake_record(kind: int, body: bytes) -> bytes:
    message = bytes((kind,)) + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x03" + struct.pack(">H", len(message)) + message


def client_hello() -> bytes:
    return handshake_record(1, b"\x03\x03" + CLIENT_RANDOM + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00" + b"\x00\x00")


def server_hello(suite: int = TLS13_AES_128_GCM) -> bytes:
    if suite in (TLS12_AES_128_GCM, TLS12_CHACHA20):
        return handshake_record(2, b"\x03\x03" + SERVER_RANDOM + b"\x00" + struct.pack(">H", suite) + b"\x00")
    extensions = b"\x00\x2b\x00\x02\x03\x04"  # supported_versions: TLS 1.3
    return handshake_record(2, b"\x03\x03" + bytes(32) + b"\x00" + struct.pack(">H", suite) + b"\x00" +
                            struct.pack(">H", len(extensions)) + extensions)


def finished() -> bytes:
    return b"\x14\x00\x00\x20" + bytes(32)


def handshaken(suite: int = TLS13_AES_128_GCM) -> tuple[TlsConnection, Sealer | Sealer12, Sealer | Sealer12]:
    """A connection past its handshake, and the sealers of the client's and the server's application data."""
    if suite in (TLS12_AES_128_GCM, TLS12_CHACHA20):
        return handshaken12(suite)
    keylog = KeyLog()
    keylog.add_text(KEY_LOG)
    tls = TlsConnection(keylog, (True, True))
    assert tls.data(CLIENT, client_hello()) == []
    server = Sealer(SECRETS["SERVER_HANDSHAKE_TRAFFIC_SECRET"], suite)
    assert tls.data(SERVER, server_hello(suite) + server.seal(22, finished())) == []
    client = Sealer(SECRETS["CLIENT_HANDSHAKE_TRAFFIC_SECRET"], suite)
    assert tls.data(CLIENT, client.seal(22, finished())) == []
    client.rekey(SECRETS["CLIENT_TRAFFIC_SECRET_0"])
    server.rekey(SECRETS["SERVER_TRAFFIC_SECRET_0"])
    assert tls.failure is None and tls.info["version"] == "1.3"
    return tls, client, server


def handshaken12(suite: int) -> tuple[TlsConnection, Sealer12, Sealer12]:
    """A TLS 1.2 connection past its ChangeCipherSpecs and Finished messages (RFC 5246 section 7.3)."""
    keylog = KeyLog()
    keylog.add_text(KEY_LOG_12)
    tls = TlsConnection(keylog, (True, True))
    key_len, iv_len = (16, 4) if suite == TLS12_AES_128_GCM else (32, 12)
    block = prf(MASTER_SECRET, b"key expansion", SERVER_RANDOM + CLIENT_RANDOM, 2 * (key_len + iv_len))
    client_key, server_key = block[:key_len], block[key_len:2 * key_len]
    client_iv, server_iv = block[2 * key_len:2 * key_len + iv_len], block[2 * key_len + iv_len:]
    client, server = Sealer12(suite, client_key, client_iv), Sealer12(suite, server_key, server_iv)
    change_cipher_spec = b"\x14\x03\x03\x00\x01\x01"
    assert tls.data(CLIENT, client_hello()) == []
    assert tls.data(SERVER, server_hello(suite)) == []
    assert tls.data(CLIENT, change_cipher_spec + client.seal(HANDSHAKE, finished())) == []
    assert tls.data(SERVER, change_cipher_spec + server.seal(HANDSHAKE, finished())) == []
    assert tls.failure is None and tls.info["version"] == "1.2"
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


# -- record streams of every AEAD way, cut anywhere, whole or damaged ------------------------------------------

AEAD_SUITES = (TLS13_AES_128_GCM, TLS13_CHACHA20, TLS12_AES_128_GCM, TLS12_CHACHA20)
TICKET = 4  # a NewSessionTicket handshake message: TLS 1.3 servers send them among the application data
BYTES = bytes(range(251)) * 66  # record contents are slices of it (251: a prime, so no two slices line up)
RECORDS = st.lists(st.tuples(st.sampled_from((APPLICATION_DATA,) * 6 + (HANDSHAKE, ALERT)),
                             st.integers(0, 600) | st.sampled_from((0, 1, 16383, 16384)),  # content size
                             st.integers(0, 2000),  # where in BYTES
                             st.integers(0, 40)),  # TLS 1.3 padding
                   min_size=1, max_size=12)


def sealed_stream(suite: int, records) -> tuple[TlsConnection, bytes, list[tuple[int, bytes | None]]]:
    """A connection past its handshake, the client's records sealed after it, and each record's end offset in
    that stream with the application data it carries (None: not application data)."""
    tls, client, _ = handshaken(suite)
    stream, ends = b"", []
    for kind, size, at, padding in records:
        content = BYTES[at:at + size]
        if kind == HANDSHAKE:
            content = bytes((TICKET,)) + len(content).to_bytes(3, "big") + content  # passed over unread
        elif kind == ALERT:
            content = b"\x01\x00"  # close_notify, a warning: ignored
        stream += client.seal(kind, content, padding)
        ends.append((len(stream), content if kind == APPLICATION_DATA else None))
    return tls, stream, ends


def cut(stream: bytes, points: list[int]) -> list[tuple[int, int]]:
    bounds = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return list(zip(bounds, bounds[1:]))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(AEAD_SUITES), RECORDS, st.lists(st.integers(0, 1 << 20), max_size=24))
def test_records_cut_anywhere_come_out_in_the_call_that_completes_them(suite, records, points):
    """Each call returns, as one piece, the application data of exactly the records whose last byte it brought
    (empty if they carried none, but there were such records: the Session takes the piece's time): records
    opened where they lie in the call's bytes, those cut by its end completed by the next calls."""
    tls, stream, ends = sealed_stream(suite, records)
    for start, stop in cut(stream, points):
        completed = [content for end, content in ends if start < end <= stop and content is not None]
        assert tls.data(CLIENT, stream[start:stop]) == ([(CLIENT, b"".join(completed))] if completed else [])
    assert tls.failure is None and len(tls.sides[CLIENT].buf) == 0
    assert tls.sides[CLIENT].delivered == sum(len(content) for _, content in ends if content is not None)


DAMAGE = st.lists(st.tuples(st.sampled_from(("flip", "insert", "delete", "record length")),
                            st.integers(0, 1 << 20), st.integers(0, 0xFFFF)), min_size=1, max_size=4)


def damaged(stream: bytes, ends: list[tuple[int, bytes]], damage) -> bytes:
    data = bytearray(stream)
    for kind, where, value in damage:
        at = where % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << (value % 8)
        elif kind == "insert":
            data[at:at] = BYTES[value % 200:value % 200 + value % 23 + 1]
        elif kind == "delete":
            del data[at:at + value % 40 + 1]
        elif kind == "record length":  # a header's length field, anything from 0 to 65,535
            header = ([0] + [end for end, _ in ends])[where % len(ends)]
            if header + 5 <= len(data):
                data[header + 3:header + 5] = value.to_bytes(2, "big")
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(AEAD_SUITES), RECORDS, DAMAGE, st.lists(st.integers(0, 1 << 20), max_size=24),
       st.booleans())
def test_damaged_record_streams_give_only_authentic_plaintext(suite, records, damage, points, mid_connection):
    """Flipped bits, inserted and deleted bytes, and record lengths rewritten, in a connection captured from its
    start or from its first record after the handshake (TLS 1.3 secrets are then tried on its records, TLS 1.2
    cannot be opened): no exception, what comes out is what consecutive records sealed, from the first when
    captured from the start (nothing that did not authenticate, nothing read past what arrived), no more is
    held than arrived, and the first reason for failing is the one that stays."""
    tls, stream, ends = sealed_stream(suite, records)
    if mid_connection:
        tls = TlsConnection(tls.keylog, (False, False))
    data = damaged(stream, ends, damage)
    out, failure = b"", None
    for start, stop in cut(data, points):
        for side, plaintext in tls.data(CLIENT, data[start:stop]):
            assert side == CLIENT
            out += plaintext
        assert failure is None or tls.failure == failure
        failure = tls.failure
    contents = [content or b"" for _, content in ends]
    runs = [b"".join(contents[:last]) for last in range(len(contents) + 1)] if not mid_connection else \
        [b"".join(contents[first:last]) for first in range(len(contents)) for last in range(first, len(contents) + 1)]
    assert out in runs
    assert len(tls.sides[CLIENT].buf) <= len(data)


def test_the_first_reason_for_failing_stays_whatever_follows():
    """A TLS 1.2 connection captured after its handshake cannot be opened: the first record of application data
    says so (here completed by a later call), and damaged bytes behind it in that call change nothing."""
    tls, client, _ = handshaken(TLS12_AES_128_GCM)
    tls = TlsConnection(tls.keylog, (False, False))
    stream = client.seal(HANDSHAKE, finished()) + client.seal(APPLICATION_DATA, b"not to be read")
    reason = "the handshake was not captured and no TLS 1.3 traffic secret of the key log opens its records"
    assert tls.data(CLIENT, stream[:-4]) == [] and tls.failure is None
    assert tls.data(CLIENT, stream[-4:] + bytes(5)) == [] and tls.failure == reason


def test_records_that_come_before_their_keys_wait_for_them():
    """A client's encrypted records captured before the ServerHello (the capture's order across directions need
    not be the order of sending) wait for it; the call bringing the ServerHello opens them."""
    keylog = KeyLog()
    keylog.add_text(KEY_LOG)
    tls = TlsConnection(keylog, (True, True))
    client = Sealer(SECRETS["CLIENT_HANDSHAKE_TRAFFIC_SECRET"])
    early = client.seal(HANDSHAKE, finished())
    client.rekey(SECRETS["CLIENT_TRAFFIC_SECRET_0"])
    early += client.seal(APPLICATION_DATA, b"sent before the server's hello was captured")
    assert tls.data(CLIENT, client_hello() + early) == []
    server = Sealer(SECRETS["SERVER_HANDSHAKE_TRAFFIC_SECRET"])
    assert tls.data(SERVER, server_hello() + server.seal(HANDSHAKE, finished())) == [
        (CLIENT, b"sent before the server's hello was captured")]
    assert tls.failure is None and not tls.waiting


def test_records_wait_for_a_secret_the_followed_key_log_gets_later(tmp_path):
    """sniff: the client logs its traffic secret as its handshake ends; records sealed with it wait, and come
    out when the key log has it (here the records even come before it is written)."""
    key_log = tmp_path / "client.keys"
    key_log.write_bytes(b"".join(line + b"\n" for line in KEY_LOG.splitlines() if b"CLIENT_TRAFFIC" not in line))
    tls = TlsConnection(KeyLog([str(key_log)], follow=True), (True, True))
    tls.data(CLIENT, client_hello())
    server = Sealer(SECRETS["SERVER_HANDSHAKE_TRAFFIC_SECRET"])
    tls.data(SERVER, server_hello() + server.seal(HANDSHAKE, finished()))
    client = Sealer(SECRETS["CLIENT_HANDSHAKE_TRAFFIC_SECRET"])
    records = client.seal(HANDSHAKE, finished())
    client.rekey(SECRETS["CLIENT_TRAFFIC_SECRET_0"])
    records += client.seal(APPLICATION_DATA, b"first") + client.seal(APPLICATION_DATA, b"second")
    assert tls.data(CLIENT, records[:-3]) == [] and tls.waiting
    assert tls.data(CLIENT, records[-3:]) == [] and tls.poll() == []
    with key_log.open("ab") as f:
        f.write(f"CLIENT_TRAFFIC_SECRET_0 {CLIENT_RANDOM.hex()} {SECRETS['CLIENT_TRAFFIC_SECRET_0'].hex()}\n".encode())
    assert tls.poll() == [(CLIENT, b"firstsecond")]
    assert tls.data(CLIENT, client.seal(APPLICATION_DATA, b"third")) == [(CLIENT, b"third")]
    assert tls.failure is None and not tls.waiting


def header(kind: int, length: int, minor: int = 3) -> bytes:
    return bytes([kind, 3, minor]) + struct.pack(">H", length)


def test_a_connection_met_in_its_middle_is_tls_where_one_record_ends_at_the_next_ones_header():
    """What tells TLS from Kafka when a capture starts mid-connection (tlsrecord, compiled: it looks at up to a
    record's length of every such connection's first bytes, byte by byte)."""
    from kafkasniff.stream.tlsrecord import is_handshake_start, record_boundary, record_length, starts_tls

    record = header(APPLICATION_DATA, 7) + b"payload"
    # a header alone is not enough: its record must end where the bytes or the next header do
    fake = header(HANDSHAKE, 40) + b"\x00" * 3
    assert record_boundary(b"\x01\x02" + fake + record + record) == 2 + len(fake)
    assert record_boundary(bytearray(b"xyz" + record)) == 3  # ends exactly at the end of the bytes
    assert record_boundary(b"xyz" + record + b"\x17\x03") is None  # ... or it does not end anywhere known
    assert record_boundary(b"xyz" + record, limit=3) is None and record_boundary(b"xyz" + record, limit=4) == 3
    assert record_boundary(b"") is None and record_boundary(record[:4]) is None
    assert record_boundary(header(APPLICATION_DATA, 0) + record) == 5  # no empty records
    assert record_boundary(header(APPLICATION_DATA, 7, minor=5) + b"payload" + record) == 12  # TLS 1.0-1.3 only
    assert record_length(record, 0) == 7 and record_length(record, 1) is None
    assert record_length(header(ALERT, (1 << 14) + 2048), 0) == (1 << 14) + 2048
    assert record_length(header(ALERT, (1 << 14) + 2049), 0) is None
    assert starts_tls(record + record[:3], False) and starts_tls(record, False)  # too little left to tell: TLS
    assert not starts_tls(record + b"\x00\x00\x00\x10\x00", False) and not starts_tls(b"\x00\x00\x00\x10", False)
    assert starts_tls(header(HANDSHAKE, 300), True) and not starts_tls(record, True)
    assert is_handshake_start(header(HANDSHAKE, 1)[:3]) and not is_handshake_start(header(HANDSHAKE, 1)[:2])
